"""Read tensors out of a DCP directory's ``*.distcp`` files, memory-mapped, with no distributed init.

A DCP file (``FileSystemWriter``, the default ``torch_save`` format) is a run of records, one per
stored chunk; :class:`~.dcp_metadata.StorageItem` gives each one's byte range. A record is a
whole ``torch.save`` archive: a zip whose ``data.pkl`` rebuilds the tensor from the stored
bytes in ``data/<key>``. Here that small pickle goes through an unpickler that knows only
``_rebuild_tensor_v2``, the typed-storage names and ``OrderedDict`` (stand-ins again, nothing
from torch is called), and the tensor is made straight from the memory-mapped file at the data
entry's offset, after checking every size against the record and the record against the file.
A record this reader does not understand (a compressed entry, a newer pickle layout) is handed
to ``torch.load(weights_only=True)``, which is safe but copies.

Weights stay file-backed only where that changes nothing: a tensor stored in one chunk, in the
compute dtype, at a 64-byte aligned address (where torch's allocator would put it; some CPU
kernels round differently on other alignments). Everything else is copied.
"""

from __future__ import annotations

import io
import logging
import mmap
import pickle
import struct
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from .dcp_metadata import DTYPE_BYTES, Chunk, DcpMetadata, StorageItem, TensorEntry
from .errors import CheckpointError, UnsupportedFormatError

logger = logging.getLogger(__name__)

ALIGNMENT = 64
_LOCAL_HEADER = b"PK\x03\x04"
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
    """A record in a form the fast path does not read (handed to torch.load(weights_only=True))."""


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes at ``start`` of a memory map (no copy)."""

    def __init__(self, mm: mmap.mmap, start: int, length: int) -> None:
        super().__init__()
        self._mm, self._start, self._length, self._pos = mm, start, length, 0

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
        n = max(0, min(len(buffer), self._length - self._pos))
        begin = self._start + self._pos
        buffer[:n] = self._mm[begin : begin + n]
        self._pos += n
        return n


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
    """The ``*.distcp`` files of DCP directories, each memory-mapped once, checked on the way."""

    def __init__(self) -> None:
        self._maps: dict[Path, mmap.mmap] = {}

    def map(self, directory: Path, item: StorageItem, what: str) -> mmap.mmap:
        rel = item.relative_path
        if not rel or Path(rel).name != rel or rel in (".", ".."):
            raise CheckpointError(
                f"{directory}: storage of {what} names {rel!r}, not a file in the checkpoint"
            )
        path = directory / rel
        mm = self._maps.get(path)
        if mm is None:
            try:
                with path.open("rb") as f:
                    # Private (copy-on-write): torch may want a writable buffer; the file is never written.
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            except FileNotFoundError:
                raise CheckpointError(f"{path}: missing (the metadata stores {what} there)") from None
            except (OSError, ValueError) as exc:
                raise CheckpointError(f"{path}: cannot read ({exc})") from None
            self._maps[path] = mm
        if item.offset + item.length > len(mm):
            raise CheckpointError(
                f"{path}: truncated ({len(mm)} bytes; {what} needs bytes up to {item.offset + item.length})"
            )
        return mm


def _record_tensor(mm: mmap.mmap, item: StorageItem, entry: TensorEntry, chunk: Chunk) -> torch.Tensor:
    """The chunk stored in one ``torch.save`` record, file-backed (fast path)."""
    window = _Window(mm, item.offset, item.length)
    try:
        zf = zipfile.ZipFile(window)
        pkl = next((n for n in zf.namelist() if n.endswith("data.pkl")), None)
        if pkl is None:
            raise _NotUnderstood("no data.pkl")
        prefix = pkl[: -len("data.pkl")]
        if prefix + "byteorder" in zf.namelist() and zf.read(prefix + "byteorder") != b"little":
            raise UnsupportedFormatError("big-endian DCP records are not supported")
        ref = _TensorUnpickler(io.BytesIO(zf.read(pkl))).load()
        if not isinstance(ref, _TensorRef):
            raise _NotUnderstood("record is not one tensor")
        info = zf.getinfo(f"{prefix}data/{ref.storage.key}")
    except (zipfile.BadZipFile, KeyError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise _NotUnderstood(str(exc)) from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise _NotUnderstood("compressed entry")
    if ref.storage.dtype != entry.dtype or ref.size != chunk.sizes:
        raise CheckpointError(
            f"record holds {ref.storage.dtype} {list(ref.size)}, "
            f"the metadata says {entry.dtype} {list(chunk.sizes)}"
        )
    header = mm[item.offset + info.header_offset : item.offset + info.header_offset + 30]
    if len(header) < 30 or header[:4] != _LOCAL_HEADER:
        raise CheckpointError("corrupt record (bad zip entry header)")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    data_start = info.header_offset + 30 + name_len + extra_len
    element = DTYPE_BYTES[entry.dtype]
    if info.file_size != ref.storage.numel * element or data_start + info.file_size > item.length:
        raise CheckpointError("corrupt record (its data does not fit the stored tensor or the record)")
    numel = chunk.numel
    if (
        numel
        and ref.offset + sum((s - 1) * st for s, st in zip(ref.size, ref.stride, strict=True))
        >= ref.storage.numel
    ):
        raise CheckpointError("corrupt record (the tensor reaches past its storage)")
    dtype = torch_dtype(entry.dtype)
    if not numel:
        return torch.empty(chunk.sizes, dtype=dtype)
    storage = torch.frombuffer(mm, dtype=dtype, count=ref.storage.numel, offset=item.offset + data_start)
    return storage.as_strided(ref.size, ref.stride, ref.offset)


def _fallback_tensor(mm: mmap.mmap, item: StorageItem, chunk: Chunk, entry: TensorEntry) -> torch.Tensor:
    """``torch.load(weights_only=True)`` of a record the fast path does not read (safe; copies)."""
    try:
        t = torch.load(_Window(mm, item.offset, item.length), map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refusals, corrupt zips and more: all one message
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise CheckpointError(f"unreadable record ({text[:160]})") from None
    if (
        not isinstance(t, torch.Tensor)
        or tuple(t.shape) != chunk.sizes
        or t.dtype != torch_dtype(entry.dtype)
    ):
        raise CheckpointError(f"record does not hold a {entry.dtype} tensor of shape {list(chunk.sizes)}")
    return t


def _chunk_tensor(
    files: DcpFiles, meta: DcpMetadata, key: str, entry: TensorEntry, chunk: Chunk
) -> torch.Tensor:
    item = meta.storage_of(key, chunk)
    if item.transforms:
        raise UnsupportedFormatError(
            f"{meta.path}: {key} is stored with DCP transforms ({', '.join(item.transforms)}); not supported"
        )
    mm = files.map(meta.path.parent, item, key)
    try:
        try:
            return _record_tensor(mm, item, entry, chunk)
        except _NotUnderstood as why:
            logger.info("%s: reading %s with torch.load(weights_only=True): %s", meta.path, key, why)
            return _fallback_tensor(mm, item, chunk, entry)
    except CheckpointError as exc:
        if str(exc).startswith(str(meta.path.parent)):
            raise
        raise CheckpointError(f"{meta.path.parent / item.relative_path}: {key}: {exc}") from None


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % ALIGNMENT == 0


def read_tensor(files: DcpFiles, meta: DcpMetadata, key: str, dtype: torch.dtype) -> torch.Tensor:
    """The whole tensor ``key`` in ``dtype``: chunks assembled, file-backed where nothing changes."""
    entry = meta.tensors[key]
    stored = torch_dtype(entry.dtype)
    chunks = entry.chunks
    if len(chunks) == 1 and chunks[0].sizes == entry.size:
        t = _chunk_tensor(files, meta, key, entry, chunks[0])
        if stored == dtype and t.is_contiguous() and _aligned(t):
            return t
        return t.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)
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
    files = DcpFiles()
    out: dict[str, torch.Tensor] = {}
    done = 0
    for meta, key, name in wanted:
        out[name] = read_tensor(files, meta, key, dtype)
        done += meta.tensors[key].nbytes
        if progress is not None:
            progress(done, total)
    return out
