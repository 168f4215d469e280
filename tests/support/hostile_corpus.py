"""Hostile and broken files, generated on the fly (nothing binary is committed).

Each builder writes one file (or edits a checkpoint written by ``checkpoint_factory``) the way an
attacker or a crash would, and is named after what it does. Pickles are spelled out opcode by
opcode where ``pickle.dumps`` cannot produce them (cut-off, deep, lying about sizes).
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from support.checkpoint_factory import model_file

PROTO = b"\x80\x02"
STOP = b"."


def short_unicode(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def binint(n: int) -> bytes:
    """BININT, or LONG1 where the number does not fit in 32 bits."""
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    data = pickle.encode_long(n)
    return b"\x8a" + bytes([len(data)]) + data


def global_(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


# --- data.pkl bodies (after PROTO, before STOP) -----------------------------------------------------


def deep_tuples(depth: int = 100_000) -> bytes:
    """A tuple of a tuple of ... 100k deep: TUPLE1 over and over (hashing it overflows the C stack)."""
    return b"N" + b"\x85" * depth


def deep_frozensets(depth: int = 100_000) -> bytes:
    """frozenset({frozenset({...})}) 100k deep (protocol 4's FROZENSET)."""
    return b"(" * depth + b"N" + b"\x91" * depth


def deep_lists(depth: int = 100_000) -> bytes:
    """[[[...]]]: 100k empty lists, each appended into the one below it."""
    return b"]" * depth + b"a" * (depth - 1)


def open_marks(count: int = 100_000) -> bytes:
    return b"(" * count + b"N" + b"t" * count


def bytearray_bomb(size: int = 6_500_000_000) -> bytes:
    """bytearray(6.5e9) through the global torch's weights_only unpickler allows."""
    return global_("builtins", "bytearray") + b"\x8a\x05" + size.to_bytes(5, "little") + b"\x85R"


def declared_bytearray(size: int = 6_500_000_000) -> bytes:
    """BYTEARRAY8 claiming 6.5 GB in a file of a few bytes."""
    return b"\x96" + struct.pack("<Q", size) + b"xyz"


def declared_string(size: int = 4_600_000_000) -> bytes:
    """BINUNICODE8 claiming 4.6 GB."""
    return b"\x8d" + struct.pack("<Q", size) + b"abc"


def missing_memo() -> bytes:
    return b"h\x05"  # BINGET 5, nothing memoized


def empty_stack() -> bytes:
    return b"\x85"  # TUPLE1 of nothing


def cut_mid_opcode() -> bytes:
    return b"J\x01\x02"  # BININT missing two of its four bytes (no STOP either)


def reduce_with_int_args() -> bytes:
    return global_("collections", "OrderedDict") + binint(5) + b"R"


def code_payload(marker: Path) -> bytes:
    """os.system("touch marker") via REDUCE: the marker appears if anything unpickles it."""
    return global_("os", "system") + short_unicode(f"touch '{marker}'") + b"\x85R"


def extension_code() -> bytes:
    return b"\x82\x01"  # EXT1 1


def text_persistent_id() -> bytes:
    return b"P0\n"


# --- torch zip archives ---------------------------------------------------------------------------


def write_torch_zip(
    path: Path,
    body: bytes,
    records: dict[str, bytes] | None = None,
    *,
    compress: bool = False,
    stop: bool = True,
) -> Path:
    """A torch.save-shaped zip whose data.pkl is PROTO + ``body`` (+ STOP)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as z:
        z.writestr("archive/data.pkl", PROTO + body + (STOP if stop else b""))
        z.writestr("archive/byteorder", "little")
        for key, data in (records or {}).items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")
    return path


def replace_model(ckpt_dir: Path, body: bytes, **kwargs: object) -> Path:
    """Overwrite the checkpoint's model file with a hand-made data.pkl."""
    return write_torch_zip(model_file(ckpt_dir), body, **kwargs)  # type: ignore[arg-type]


def _torch_bytes(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def replace_entry(ckpt_dir: Path, key: str, make: Callable[[torch.Tensor], object]) -> Path:
    """Rewrite one entry of the checkpoint's state dict with ``make(original)``, via torch.save."""
    path = model_file(ckpt_dir)
    sd = torch.load(path, weights_only=True)
    with warnings.catch_warnings():  # sparse CSR, nested and quantized tensors warn that they are beta
        warnings.simplefilter("ignore")
        sd[key] = make(sd[key])
    path.write_bytes(_torch_bytes(sd))
    return path


class TensorSubclass(torch.Tensor):
    """A do-nothing tensor subclass (torch pickles it with _rebuild_from_type_v2)."""


# Special tensors torch writes, keyed by the words the refusal must contain.
SPECIAL_TENSORS: dict[str, Callable[[torch.Tensor], object]] = {
    "meta-device": lambda t: torch.empty(t.shape, device="meta"),
    "sparse": lambda t: t.to_sparse(),
    "sparse csr": lambda t: t.to_sparse_csr(),
    "nested": lambda t: torch.nested.nested_tensor([t[0], t[1, :3]]),
    "quantized": lambda t: torch.quantize_per_tensor(t.float(), 0.1, 0, torch.quint8),
    "subclass": lambda t: t.as_subclass(TensorSubclass),
}
# dtypes that are not weights: complex (with a NaN), integer, bool and float8.
WRONG_DTYPES: dict[str, Callable[[torch.Tensor], object]] = {
    "complex64": lambda t: torch.complex(t.float(), t.float()).index_put_(
        (torch.tensor(0),), torch.tensor(complex("nan+0j"))
    ),
    "int64": lambda t: t.long(),
    "bool": lambda t: t > 0,
    "float8_e4m3fn": lambda t: t.to(torch.float8_e4m3fn),
    "float64": lambda t: t.double(),
}


def wrapper_subclass_parameter() -> bytes:
    """What a Parameter wrapper subclass pickles to (``Parameter must define __torch_dispatch__``)."""
    return global_("torch._utils", "_rebuild_wrapper_subclass") + global_("torch.nn", "Parameter") + b"\x85R"


def top_level_list() -> bytes:
    return b"]"


def int_key_dict(tensor_body: bytes) -> bytes:
    return b"}" + binint(3) + tensor_body + b"s"


def float_tensor(storage_key: str = "0", numel: int = 4, shape: tuple[int, ...] = (2, 2)) -> bytes:
    """``_rebuild_tensor_v2`` of a float32 storage, as torch writes it."""
    pid = b"(" + short_unicode("storage") + global_("torch", "FloatStorage") + short_unicode(storage_key)
    pid += short_unicode("cpu") + binint(numel) + b"tQ"
    size = b"(" + b"".join(binint(s) for s in shape) + b"t"
    strides, step = [], 1
    for s in reversed(shape):
        strides.insert(0, step)
        step *= s
    stride = b"(" + b"".join(binint(s) for s in strides) + b"t"
    hooks = global_("collections", "OrderedDict") + b")R"
    return (
        global_("torch._utils", "_rebuild_tensor_v2")
        + b"("
        + pid
        + binint(0)
        + size
        + stride
        + b"\x89"
        + hooks
        + b"tR"
    )


def one_tensor_dict(tensor_body: bytes, key: str = "w") -> bytes:
    return b"}" + short_unicode(key) + tensor_body + b"s"


# --- tokenizer.pkl ---------------------------------------------------------------------------------


def write_pickle(path: Path, body: bytes, *, stop: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(PROTO + body + (STOP if stop else b""))
    return path


def encoding_state_pickle(path: Path, pat_str: str, vocab: int = 300) -> Path:
    """A tokenizer.pkl of a valid tiktoken Encoding whose split pattern is ``pat_str``."""
    from support.tokenizer_factory import make_tiktoken_encoding

    enc = make_tiktoken_encoding(vocab)
    state = {
        "name": enc.name,
        "pat_str": pat_str,
        "mergeable_ranks": enc._mergeable_ranks,
        "special_tokens": enc._special_tokens,
    }
    body = pickle.dumps(state, protocol=2)[2:-1]  # the dict's opcodes, without PROTO and STOP
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(PROTO + global_("tiktoken.core", "Encoding") + b")\x81" + body + b"b" + STOP)
    return path


# --- tokenizer.json --------------------------------------------------------------------------------


def edit_tokenizer_json(path: Path, edit: Callable[[dict], None]) -> Path:
    doc = json.loads(path.read_text(encoding="utf-8"))
    edit(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def deep_json(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def huge_int_json(digits: int = 5000) -> str:
    return '{"model": {"vocab": ' + "9" * digits + "}}"
