"""Read a torch.distributed.checkpoint (DCP) ``.metadata`` file without running pickled code.

DCP writes ``.metadata`` with ``pickle.dump`` and reads it back with plain ``pickle.load``, so
``dcp.load`` or ``FileSystemReader.read_metadata()`` on a stranger's run can execute anything
(checkpoint-formats spec §4.2). Here the pickle goes through an unpickler whose ``find_class``
knows only the names DCP's own metadata uses (its dataclasses in
``torch.distributed.checkpoint.metadata``, ``_StorageInfo``, ``torch.Size``, dtype and layout
names, the ``pathlib`` path a checkpoint id may be). Each name maps to a local stand-in that
can only record its state or rebuild a tuple, a string or a number, so nothing from torch (or
anything else) is instantiated or called. The recorded tree is then checked field by field and
turned into :class:`DcpMetadata`.

Before that, :mod:`.pickle_scan` walks the opcodes on stand-ins of its own (nesting, sizes,
memo, the same allowlist), so a pickle that would exhaust memory or the C stack while being
built is refused before anything is built. This module imports neither torch nor anything that
does: discovery reads run summaries with it.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from desktop.engine.errors import CheckpointError
from desktop.engine.files.pickle_policy import DCP_POLICY, DTYPE_SIZES
from desktop.engine.files.pickle_scan import PickleRefused, read_limited, scan_bytes
from desktop.engine.text_lines import error_text

METADATA_NAME = ".metadata"
# The metadata of a 70B run with its optimizer state is a few MB; far more is not DCP metadata.
MAX_METADATA_BYTES = 256 * 1024 * 1024

_DCP = "torch.distributed.checkpoint.metadata"
_ONLY = "a DCP .metadata holds only torch.distributed.checkpoint's metadata classes"
_FS = "torch.distributed.checkpoint.filesystem"

# The torch dtype names a DCP record may carry (a subset of what torch.save can), sized by the
# pickle scan's one table.
DTYPE_BYTES = {
    name: DTYPE_SIZES[name]
    for name in (
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
    )
}
FLOAT_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16"})


@dataclass(frozen=True)
class Chunk:
    """One stored piece of a tensor: where it sits in the whole tensor and its shape."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n


@dataclass(frozen=True)
class StorageItem:
    """Where a chunk's bytes are: a byte range of one file in the DCP directory."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


@dataclass(frozen=True)
class TensorEntry:
    dtype: str  # a key of DTYPE_BYTES
    size: tuple[int, ...]
    chunks: tuple[Chunk, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass
class DcpMetadata:
    """What a DCP directory holds: tensors (by flattened key), non-tensor keys and storage."""

    path: Path
    tensors: dict[str, TensorEntry] = field(default_factory=dict)
    byte_keys: set[str] = field(default_factory=set)
    storage: dict[tuple[str, tuple[int, ...]], StorageItem] = field(default_factory=dict)

    def storage_of(self, key: str, chunk: Chunk) -> StorageItem:
        item = self.storage.get((key, chunk.offsets))
        if item is None:
            raise CheckpointError(f"{self.path}: no storage recorded for {key} at {list(chunk.offsets)}")
        return item


# --- stand-ins for the allowed globals ----------------------------------------------------------


class _Recorded:
    """Stands in for one of DCP's metadata classes: NEWOBJ makes it, BUILD hands it its state."""

    kind = ""

    def __init__(self) -> None:
        # Never called by NEWOBJ; a REDUCE-style call with arguments fails here instead.
        self.state: object = None

    def __setstate__(self, state: object) -> None:
        self.state = state


def _recorded(kind: str) -> type[_Recorded]:
    return type(f"_{kind}", (_Recorded,), {"kind": kind})


_CLASSES: dict[tuple[str, str], type[_Recorded]] = {
    (_DCP, name): _recorded(name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
    )
}
_CLASSES[(_FS, "_StorageInfo")] = _recorded("_StorageInfo")


class _Name(str):
    """A dtype, layout or memory-format name read from the pickle (a string that takes no state)."""

    __slots__ = ()


class _Rebuild:
    """One of the few callables a REDUCE may use; BUILD cannot give it (or its function) state."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def __call__(self, *args: object) -> object:
        return self._fn(*args)

    def __setstate__(self, state: object) -> None:
        raise pickle.UnpicklingError("state given to a pickle constructor")


def _size(dims: object = ()) -> tuple[int, ...]:
    """``torch.Size(dims)``, as a tuple of non-negative ints."""
    if not isinstance(dims, (tuple, list)) or not all(type(d) is int and d >= 0 for d in dims):
        raise pickle.UnpicklingError("torch.Size holds something other than non-negative ints")
    return tuple(dims)


def _layout(name: object) -> _Name:
    """``torch.serialization._get_layout("torch.strided")``: only dense tensors are read."""
    if name != "torch.strided":
        raise pickle.UnpicklingError(f"unsupported tensor layout {name!r}")
    return _Name("strided")


def _mem_format(code: object) -> int:
    """``_MEM_FORMAT_ENCODING(n)``: the enum's small integer value."""
    if type(code) is not int or not 0 <= code <= 2:
        raise pickle.UnpicklingError(f"unknown memory format code {code!r}")
    return code


def _path(*parts: object) -> str:
    """A ``pathlib`` path (the checkpoint id DCP records), as text; never a Path object."""
    if not all(isinstance(p, str) for p in parts):
        raise pickle.UnpicklingError("a pickled path holds something other than text")
    return "/".join(str(p) for p in parts)


_FUNCTIONS: dict[tuple[str, str], _Rebuild] = {
    ("torch", "Size"): _Rebuild(_size),
    ("torch.serialization", "_get_layout"): _Rebuild(_layout),
    (_DCP, "_MEM_FORMAT_ENCODING"): _Rebuild(_mem_format),
}
for _cls in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"):
    _FUNCTIONS[("pathlib", _cls)] = _Rebuild(_path)
# Older torch pickled layouts and memory formats as module attributes.
_NAMES = {("torch", n): _Name(n) for n in (*DTYPE_BYTES, "strided", "contiguous_format", "channels_last")}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if key in _CLASSES:
            return _CLASSES[key]
        if key in _FUNCTIONS:
            return _FUNCTIONS[key]
        if key in _NAMES:
            return _NAMES[key]
        raise CheckpointError(f"{self._path}: refused to unpickle {module}.{name} ({_ONLY})")

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointError(f"{self._path}: a DCP .metadata has no persistent references")


# --- checking the recorded tree -----------------------------------------------------------------


def _fields(obj: object, kind: str, path: Path) -> dict[str, Any]:
    """The state of a recorded ``kind`` as a dict (dataclasses pickle their ``__dict__``)."""
    if not isinstance(obj, _Recorded) or obj.kind != kind:
        raise CheckpointError(f"{path}: expected a {kind} in the DCP metadata, found {type(obj).__name__}")
    state = obj.state
    if state is None:
        return {}
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        state = state[0]  # (dict, slots) form
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise CheckpointError(f"{path}: malformed {kind} in the DCP metadata")
    return state


def _ints(value: object, what: str, path: Path) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(v) is int and v >= 0 for v in value):
        raise CheckpointError(f"{path}: {what} is not a tuple of non-negative ints")
    return value


def _dtype_of(props: object, path: Path) -> str:
    """The dtype name of a TensorProperties (tuple state since torch 2.1, dict state before)."""
    if not isinstance(props, _Recorded) or props.kind != "TensorProperties":
        raise CheckpointError(f"{path}: tensor entry without TensorProperties")
    state = props.state
    if isinstance(state, tuple) and state:
        dtype = state[0]
    elif isinstance(state, dict):
        dtype = state.get("dtype")
    else:
        raise CheckpointError(f"{path}: malformed TensorProperties")
    if not isinstance(dtype, _Name) or str(dtype) not in DTYPE_BYTES:
        raise CheckpointError(f"{path}: unsupported tensor dtype {dtype!r}")
    return str(dtype)


def _tensor_entry(obj: object, key: str, path: Path) -> TensorEntry:
    f = _fields(obj, "TensorStorageMetadata", path)
    size = _ints(f.get("size"), f"the size of {key}", path)
    chunks_raw = f.get("chunks")
    if not isinstance(chunks_raw, list):
        raise CheckpointError(f"{path}: {key} has no chunk list")
    chunks = []
    for c in chunks_raw:
        cf = _fields(c, "ChunkStorageMetadata", path)
        offsets = _ints(cf.get("offsets"), f"a chunk offset of {key}", path)
        sizes = _ints(cf.get("sizes"), f"a chunk size of {key}", path)
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise CheckpointError(f"{path}: a chunk of {key} does not match its rank {len(size)}")
        if any(o + s > d for o, s, d in zip(offsets, sizes, size, strict=True)):
            raise CheckpointError(f"{path}: a chunk of {key} lies outside the tensor {list(size)}")
        chunks.append(Chunk(offsets, sizes))
    entry = TensorEntry(_dtype_of(f.get("properties"), path), size, tuple(chunks))
    # Exact cover: as many elements as the tensor and no two chunks sharing one. Counting alone
    # would let two chunks at the same offsets leave a region unwritten (uninitialised memory).
    if sum(c.numel for c in chunks) != entry.numel or _overlap(chunks):
        raise CheckpointError(f"{path}: the chunks of {key} do not cover the tensor {list(size)} exactly")
    return entry


MAX_CHUNKS = 4096  # one per rank that held a shard of the tensor


def _overlap(chunks: list[Chunk]) -> bool:
    """True when two chunks share an element (or there are too many to compare)."""
    if len(chunks) > MAX_CHUNKS:
        return True
    boxes = [tuple(zip(c.offsets, c.sizes, strict=True)) for c in chunks if c.numel]
    return any(
        all(o1 < o2 + s2 and o2 < o1 + s1 for (o1, s1), (o2, s2) in zip(a, b, strict=True))
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
    )


def _storage_item(obj: object, path: Path) -> StorageItem:
    f = _fields(obj, "_StorageInfo", path)
    rel, offset, length = f.get("relative_path"), f.get("offset"), f.get("length")
    transforms = f.get("transform_descriptors") or ()
    if not isinstance(rel, str) or type(offset) is not int or type(length) is not int:
        raise CheckpointError(f"{path}: malformed storage entry")
    if offset < 0 or length < 0:
        raise CheckpointError(f"{path}: negative storage offset or length")
    if not isinstance(transforms, (list, tuple)) or not all(isinstance(t, str) for t in transforms):
        raise CheckpointError(f"{path}: malformed storage transforms")
    return StorageItem(rel, offset, length, tuple(transforms))


def _convert(root: object, path: Path) -> DcpMetadata:
    f = _fields(root, "Metadata", path)
    sdm = f.get("state_dict_metadata")
    if not isinstance(sdm, dict) or not all(isinstance(k, str) for k in sdm):
        raise CheckpointError(f"{path}: the DCP metadata has no state_dict_metadata table")
    meta = DcpMetadata(path)
    for key, entry in sdm.items():
        if isinstance(entry, _Recorded) and entry.kind == "BytesStorageMetadata":
            meta.byte_keys.add(key)
        else:
            meta.tensors[key] = _tensor_entry(entry, key, path)
    storage = f.get("storage_data")
    if not isinstance(storage, dict):
        raise CheckpointError(f"{path}: the DCP metadata has no storage table")
    for index, info in storage.items():
        fi = _fields(index, "MetadataIndex", path)
        fqn, offset = fi.get("fqn"), fi.get("offset")
        if not isinstance(fqn, str):
            raise CheckpointError(f"{path}: malformed storage index")
        offsets = () if offset is None else _ints(offset, f"the storage offset of {fqn}", path)
        meta.storage[(fqn, offsets)] = _storage_item(info, path)
    return meta


def read_dcp_metadata(directory: Path) -> DcpMetadata:
    """The checked contents of ``directory/.metadata``; CheckpointError (one line) otherwise.

    The bytes are read once; :mod:`.pickle_scan` walks their opcodes (sizes, nesting, the same
    allowlist) before the unpickler below builds anything from them.
    """
    path = Path(directory) / METADATA_NAME
    try:
        data = read_limited(path, MAX_METADATA_BYTES)
        scan_bytes(data, DCP_POLICY)
    except FileNotFoundError:
        raise CheckpointError(
            f"{directory}: no {METADATA_NAME} (DCP writes it last: the save is incomplete)"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except PickleRefused as exc:
        if exc.kind == "global":
            raise CheckpointError(f"{path}: refused to unpickle {exc.name} ({_ONLY})") from None
        raise CheckpointError(f"{path}: not valid DCP metadata ({exc.reason})") from None
    try:
        root = _MetadataUnpickler(io.BytesIO(data), path).load()
    except CheckpointError:
        raise
    except Exception as exc:  # corrupt data raises many kinds (UnpicklingError, EOFError, ...)
        raise CheckpointError(f"{path}: not valid DCP metadata ({error_text(exc, 160)})") from None
    return _convert(root, path)
