"""Read tensors out of a DCP directory's ``*.distcp`` files, with no distributed init.

A DCP file (``FileSystemWriter``, the default ``torch_save`` format) is a run of records, one per
stored chunk; :class:`~.dcp_metadata.StorageItem` gives each one's byte range. A record is a
whole ``torch.save`` archive: a zip whose ``data.pkl`` rebuilds the tensor from the stored
bytes in ``data/<key>``. That small pickle is checked by :mod:`.pickle_scan` and then read by an
unpickler that knows only ``_rebuild_tensor_v2``, the typed-storage names and ``OrderedDict``
(stand-ins again: nothing from torch is called). The bytes are read straight into the tensor's
own memory at the data entry's offset, after every size is checked against the record and the
record against the file.

The weights end up in private memory, never a mapping of the file: a resumed run that saves the
same step again rewrites its ``*.distcp`` in place, which would kill a process still mapping it
(SIGBUS); read this way a changed file is at worst a short read, reported as truncated.
"""

from __future__ import annotations

import io
import logging
import pickle
import struct
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from desktop.engine.errors import CheckpointError, UnsupportedFormatError
from desktop.engine.files import bounded
from desktop.engine.files.pickle_policy import TORCH_POLICY
from desktop.engine.files.pickle_scan import PickleRefused, scan_bytes
from desktop.engine.kempnerforge.dcp_metadata import DTYPE_BYTES, Chunk, DcpMetadata, StorageItem, TensorEntry

logger = logging.getLogger(__name__)

_LOCAL_HEADER = b"PK\x03\x04"
# A one-tensor data.pkl is a few hundred bytes.
MAX_RECORD_PICKLE = 1 << 20
_STORAGE_DTYPES = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


class _NotUnderstood(Exception):
    """A record in a form this reader does not read (only what torch.save writes for a tensor)."""


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes at ``start`` of an open file."""

    def __init__(self, f: io.BufferedReader, start: int, length: int) -> None:
        super().__init__()
        self._f, self._start, self._length, self._pos = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._length - self._pos))
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(view[:n]) or 0
        self._pos += got
        return got


class _StorageRef:
    def __init__(self, dtype: str, key: str, numel: int) -> None:
        self.dtype, self.key, self.numel = dtype, key, numel


class _TensorRef:
    def __init__(
        self, storage: _StorageRef, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
    ) -> None:
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


class _StorageType(str):
    __slots__ = ()


def _ints(value: object) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(v) is int and v >= 0 for v in value):
        raise _NotUnderstood("size or stride")
    return value


def _rebuild_tensor_v2(
    storage: object,
    offset: object,
    size: object,
    stride: object,
    requires_grad: object = False,
    hooks: object = None,
    metadata: object = None,
) -> _TensorRef:
    if not isinstance(storage, _StorageRef) or type(offset) is not int or offset < 0 or metadata:
        raise _NotUnderstood("tensor rebuild arguments")
    size, stride = _ints(size), _ints(stride)
    if len(size) != len(stride):
        raise _NotUnderstood("rank")
    return _TensorRef(storage, offset, size, stride)


class _Rebuild:
    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[..., object]) -> None:
        self._fn = fn

    def __call__(self, *args: object) -> object:
        return self._fn(*args)

    def __setstate__(self, state: object) -> None:
        raise _NotUnderstood("state given to a pickle constructor")


def _empty_dict(*args: object) -> dict:
    if args:
        raise _NotUnderstood("OrderedDict with contents")
    return {}


class _TensorUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _Rebuild(_rebuild_tensor_v2)
        if (module, name) == ("collections", "OrderedDict"):
            return _Rebuild(_empty_dict)
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        raise _NotUnderstood(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _NotUnderstood("persistent id")
        _, dtype, key, _location, numel = pid
        if not isinstance(dtype, _StorageType) or not isinstance(key, str) or type(numel) is not int:
            raise _NotUnderstood("storage reference")
        return _StorageRef(str(dtype), key, numel)


class DcpFiles:
    """The ``*.distcp`` files of DCP directories, each opened once, checked on the way."""

    def __init__(self) -> None:
        self._files: dict[Path, tuple[io.BufferedReader, int]] = {}

    def __enter__(self) -> DcpFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        for f, _ in self._files.values():
            f.close()
        self._files.clear()

    def open(self, directory: Path, item: StorageItem, what: str) -> io.BufferedReader:
        rel = item.relative_path
        if not rel or Path(rel).name != rel or rel in (".", ".."):
            raise CheckpointError(
                f"{directory}: storage of {what} names {rel!r}, not a file in the checkpoint"
            )
        path = directory / rel
        if path not in self._files:
            try:
                f = bounded.open_regular(path)
            except bounded.FileMissing:
                raise CheckpointError(f"{path}: missing (the metadata stores {what} there)") from None
            except bounded.FileRefused as exc:
                raise CheckpointError(str(exc)) from None
            self._files[path] = (f, f.seek(0, io.SEEK_END))
        f, size = self._files[path]
        if item.offset + item.length > size:
            raise CheckpointError(
                f"{path}: truncated ({size} bytes; {what} needs bytes up to {item.offset + item.length})"
            )
        return f


def _read_exact(f: io.BufferedReader, position: int, buffer: memoryview) -> None:
    f.seek(position)
    done = 0
    while done < len(buffer):
        got = f.readinto(buffer[done:])
        if not got:
            raise CheckpointError("the file ended early (was it rewritten while being read?)")
        done += got


def _record_tensor(f: io.BufferedReader, item: StorageItem, entry: TensorEntry, chunk: Chunk) -> torch.Tensor:
    """The chunk stored in one ``torch.save`` record, read into private memory (fast path)."""
    try:
        zf = zipfile.ZipFile(_Window(f, item.offset, item.length))
        infos = zf.infolist()
        pkl = next((i for i in infos if i.filename.endswith("data.pkl")), None)
        if pkl is None:
            raise _NotUnderstood("no data.pkl")
        if pkl.file_size > MAX_RECORD_PICKLE:
            raise CheckpointError(f"corrupt record (a {pkl.file_size}-byte data.pkl)")
        prefix = pkl.filename[: -len("data.pkl")]
        if prefix + "byteorder" in zf.namelist():
            # Read at most a few bytes: a deflated entry may declare gigabytes.
            with zf.open(prefix + "byteorder") as entry_file:
                if entry_file.read(8) != b"little":
                    raise UnsupportedFormatError("big-endian DCP records are not supported")
        data = zf.read(pkl)
        records = {
            i.filename[len(prefix) + 5 :]: i.file_size
            for i in infos
            if i.filename.startswith(prefix + "data/")
        }
        scan_bytes(data, TORCH_POLICY, records)
        ref = _TensorUnpickler(io.BytesIO(data)).load()
        if not isinstance(ref, _TensorRef):
            raise _NotUnderstood("record is not one tensor")
        info = zf.getinfo(f"{prefix}data/{ref.storage.key}")
    except PickleRefused as exc:
        raise CheckpointError(f"refused record ({exc.name or exc.reason})") from None
    except (zipfile.BadZipFile, KeyError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise _NotUnderstood(str(exc)) from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise _NotUnderstood("compressed entry")
    if ref.storage.dtype != entry.dtype or ref.size != chunk.sizes:
        raise CheckpointError(
            f"record holds {ref.storage.dtype} {list(ref.size)}, "
            f"the metadata says {entry.dtype} {list(chunk.sizes)}"
        )
    header = bytearray(30)
    _read_exact(f, item.offset + info.header_offset, memoryview(header))
    if header[:4] != _LOCAL_HEADER:
        raise CheckpointError("corrupt record (bad zip entry header)")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    data_start = info.header_offset + 30 + name_len + extra_len
    element = DTYPE_BYTES[entry.dtype]
    if info.file_size != ref.storage.numel * element or data_start + info.file_size > item.length:
        raise CheckpointError("corrupt record (its data does not fit the stored tensor or the record)")
    dtype = torch_dtype(entry.dtype)
    if not chunk.numel:
        return torch.empty(chunk.sizes, dtype=dtype)
    reach = ref.offset + sum((s - 1) * st for s, st in zip(ref.size, ref.stride, strict=True))
    if reach >= ref.storage.numel:
        raise CheckpointError("corrupt record (the tensor reaches past its storage)")
    storage = torch.empty(ref.storage.numel, dtype=dtype)
    _read_exact(f, item.offset + data_start, storage.view(torch.uint8).numpy().data)
    t = storage.as_strided(ref.size, ref.stride, ref.offset)
    # A view of a larger storage (DCP saves views as they are) keeps only its own elements.
    return t if t.is_contiguous() and t.numel() == ref.storage.numel else t.contiguous().clone()


def _chunk_tensor(
    files: DcpFiles, meta: DcpMetadata, key: str, entry: TensorEntry, chunk: Chunk
) -> torch.Tensor:
    item = meta.storage_of(key, chunk)
    if item.transforms:
        raise UnsupportedFormatError(
            f"{meta.path}: {key} is stored with DCP transforms ({', '.join(item.transforms)}); not supported"
        )
    f = files.open(meta.path.parent, item, key)
    where = meta.path.parent / item.relative_path
    try:
        return _record_tensor(f, item, entry, chunk)
    except _NotUnderstood as why:
        raise UnsupportedFormatError(
            f"{where}: {key}: a torch.save record this reader does not know ({why}); "
            "convert the run with torch.distributed.checkpoint.format_utils.dcp_to_torch_save"
        ) from None
    except UnsupportedFormatError as exc:
        raise UnsupportedFormatError(f"{where}: {key}: {exc}") from None
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {key}: {exc}") from None


def read_tensor(files: DcpFiles, meta: DcpMetadata, key: str, dtype: torch.dtype) -> torch.Tensor:
    """The whole tensor ``key`` in ``dtype``, its chunks assembled."""
    entry = meta.tensors[key]
    chunks = entry.chunks
    if len(chunks) == 1 and chunks[0].sizes == entry.size:
        return _chunk_tensor(files, meta, key, entry, chunks[0]).to(dtype)
    whole = torch.empty(entry.size, dtype=dtype)
    for chunk in chunks:
        part = _chunk_tensor(files, meta, key, entry, chunk)
        region = whole
        for dim, (start, length) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
            region = region.narrow(dim, start, length)
        region.copy_(part)
    return whole


def read_tensors(
    sources: Iterable[tuple[DcpMetadata, str, str]],
    dtype: torch.dtype,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` for each ``(metadata, stored key, name)``, in ``dtype``.

    ``progress(done_bytes, total_bytes)`` is called after each tensor.
    """
    wanted = list(sources)
    total = sum(meta.tensors[key].nbytes for meta, key, _ in wanted)
    out: dict[str, torch.Tensor] = {}
    done = 0
    with DcpFiles() as files:
        for meta, key, name in wanted:
            out[name] = read_tensor(files, meta, key, dtype)
            done += meta.tensors[key].nbytes
            if progress is not None:
                progress(done, total)
    return out
