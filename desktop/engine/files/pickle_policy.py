"""What each kind of pickle may name, and how big it may be: the allowlists the scan
(:mod:`.pickle_scan`) holds a torch checkpoint's ``data.pkl``, nanochat's ``tokenizer.pkl`` and a
DCP ``.metadata`` to, and the names torch writes for tensors Nanoscope cannot use (with what to
tell the user). Data only: the scan is the machine, this is its rulebook."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# --- what a torch state dict may name -----------------------------------------------------------

# torch's own names for the tensor parts of its weights_only allowlist: the rebuild functions of
# dense tensors, the dict class, and storage types / dtypes (values only: never called).
REBUILD_V2 = ("torch._utils", "_rebuild_tensor_v2")
REBUILD_V3 = ("torch._utils", "_rebuild_tensor_v3")
REBUILD_PARAMETER = ("torch._utils", "_rebuild_parameter")
ORDERED_DICT = ("collections", "OrderedDict")

# Storage type -> (dtype, bytes per element). UntypedStorage holds bytes (its tensors name their
# dtype in _rebuild_tensor_v3's arguments).
STORAGE_TYPES: dict[tuple[str, str], tuple[str, int]] = {
    ("torch", "FloatStorage"): ("float32", 4),
    ("torch", "DoubleStorage"): ("float64", 8),
    ("torch", "HalfStorage"): ("float16", 2),
    ("torch", "BFloat16Storage"): ("bfloat16", 2),
    ("torch", "LongStorage"): ("int64", 8),
    ("torch", "IntStorage"): ("int32", 4),
    ("torch", "ShortStorage"): ("int16", 2),
    ("torch", "CharStorage"): ("int8", 1),
    ("torch", "ByteStorage"): ("uint8", 1),
    ("torch", "BoolStorage"): ("bool", 1),
    ("torch", "ComplexFloatStorage"): ("complex64", 8),
    ("torch", "ComplexDoubleStorage"): ("complex128", 16),
    ("torch.storage", "UntypedStorage"): ("bytes", 1),
}
# dtype name -> bytes per element, for the dtypes torch.save spells as a global (v3 tensors).
DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
}

# Names torch can write for tensors Nanoscope cannot use, with what to tell the user.
_SPARSE, _SUBCLASS = "a sparse tensor", "a tensor subclass"
TORCH_REFUSED: dict[tuple[str, str], str] = {
    ("torch._utils", "_rebuild_sparse_tensor"): _SPARSE,
    ("torch._utils", "_rebuild_sparse_csr_tensor"): _SPARSE,
    ("torch._utils", "_rebuild_nested_tensor"): "a nested tensor",
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): "a meta-device tensor, which holds no values",
    ("torch._utils", "_rebuild_qtensor"): "a quantized tensor",
    ("torch._utils", "_rebuild_wrapper_subclass"): _SUBCLASS,
    ("torch._utils", "_rebuild_subclass"): _SUBCLASS,
    ("torch._tensor", "_rebuild_from_type"): _SUBCLASS,
    ("torch._tensor", "_rebuild_from_type_v2"): _SUBCLASS,
    ("torch._utils", "_rebuild_parameter_with_state"): "a parameter with extra state",
    ("torch._utils", "_rebuild_device_tensor_from_numpy"): "a tensor of another device type",
    ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"): "a tensor of another device type",
    ("torch._utils", "_rebuild_xla_tensor"): "a tensor of another device type",
    ("torch._utils", "_rebuild_mtia_tensor"): "a tensor of another device type",
    **{
        ("torch", f"{q}Storage"): "a quantized tensor"
        for q in ("QInt8", "QUInt8", "QInt32", "QUInt4x2", "QUInt2x4")
    },
    ("torch", "per_tensor_affine"): "a quantized tensor",
    ("torch", "per_channel_affine"): "a quantized tensor",
}

_DCP_METADATA = "torch.distributed.checkpoint.metadata"


@dataclass(frozen=True)
class Policy:
    """What one kind of file may contain, and how big its pickle may be."""

    callables: frozenset[tuple[str, str]]  # may be called (REDUCE) or instantiated (NEWOBJ)
    values: frozenset[tuple[str, str]] = frozenset()  # may only be passed as arguments
    explained: Mapping[tuple[str, str], str] = field(default_factory=dict)
    persistent_ids: bool = False  # torch's storages
    # nn.Module.state_dict()'s OrderedDict carries ``_metadata`` (each module's version), which
    # pickle writes as BUILD on the OrderedDict: allowed with exactly that state (op_BUILD).
    state_dict_metadata: bool = False
    max_bytes: int = 64 << 20
    max_depth: int = 32
    max_marks: int = 32
    max_stack: int = 1 << 20
    max_memo: int = 1 << 20
    max_ops: int = 1 << 22


TORCH_POLICY = Policy(
    callables=frozenset({REBUILD_V2, REBUILD_V3, REBUILD_PARAMETER, ORDERED_DICT}),
    values=frozenset(STORAGE_TYPES) | frozenset(("torch", d) for d in DTYPE_SIZES),
    explained=TORCH_REFUSED,
    persistent_ids=True,
    state_dict_metadata=True,
)
# nanochat's tokenizer: tiktoken.Encoding by NEWOBJ + BUILD; protocol 2 spells bytes with
# _codecs.encode. A 2**17-token pickle is a few MB and ~0.5M opcodes.
TOKENIZER_POLICY = Policy(
    callables=frozenset({("tiktoken.core", "Encoding"), ("_codecs", "encode")}),
    max_bytes=128 << 20,
    max_memo=1 << 23,
    max_ops=1 << 23,
)
# torch.distributed.checkpoint's .metadata: dataclasses, torch.Size, dtypes, layouts and a path.
DCP_POLICY = Policy(
    callables=frozenset(
        {
            (_DCP_METADATA, n)
            for n in (
                "Metadata",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "TensorProperties",
                "MetadataIndex",
                "StorageMeta",
                "_MEM_FORMAT_ENCODING",
            )
        }
        | {
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),
            ("pathlib", "PosixPath"),
            ("pathlib", "WindowsPath"),
            ("pathlib", "PurePosixPath"),
            ("pathlib", "PureWindowsPath"),
            ORDERED_DICT,
        }
    ),
    values=frozenset(("torch", d) for d in DTYPE_SIZES),
    max_bytes=256 << 20,
    max_memo=1 << 22,
    max_ops=1 << 23,
)
