"""Find and read nanochat-family checkpoint files safely (docs/ARCHITECTURE.md, Where data lives; Loading).

Before torch sees a ``model_*.pt``, :mod:`.pickle_scan` walks its ``data.pkl`` (limits, allowlist)
and reads every tensor's dtype and shape from it, so a file that nests too deep, claims more
bytes than it has, names code, or holds tensors Nanoscope cannot use (sparse, nested, quantized,
meta-device, subclasses, dtypes other than float32/bfloat16/float16) is refused with one line
before anything is built. Only then does ``torch.load(weights_only=True)`` run.

A model that stays loaded reads its weights into private memory (``mmap=False``): a mapped file
that training truncates or rewrites in place would kill the process with SIGBUS at the next read
(docs/PERFORMANCE.md, Safety costs). Summaries read shapes from the scan alone.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

from desktop.engine.errors import CheckpointError, OutOfMemoryError, UnsupportedFormatError, is_out_of_memory
from desktop.engine.files.bounded import FileRefused, open_regular, parse_json, read_bytes
from desktop.engine.files.pickle_scan import PickleRefused, TensorInfo, noun
from desktop.engine.files.torch_files import scan_torch_file
from desktop.engine.text_lines import error_text

MODEL_RE = re.compile(r"model_(\d+)\.pt")
META_RE = re.compile(r"meta_(\d+)\.json")
COMPILE_PREFIX = "_orig_mod."


def model_steps(directory: Path) -> list[int]:
    """Steps with a ``model_<step>.pt`` file, ascending (stray files are ignored)."""
    try:
        names = [p.name for p in directory.iterdir()]
    except OSError:
        return []
    return sorted({int(m.group(1)) for n in names if (m := MODEL_RE.fullmatch(n))})


def model_file(directory: Path, step: int) -> Path:
    for name in (f"model_{step:06d}.pt", f"model_{step}.pt"):
        if (directory / name).is_file():
            return directory / name
    raise CheckpointError(f"{directory}: no model file for step {step}")


def meta_file(directory: Path, step: int) -> Path:
    """The step's meta; one that is there but not a regular file (a named pipe, a link that leads
    nowhere) is still returned, so that reading it says what it is rather than "no meta"."""
    names = [directory / f"meta_{step:06d}.json", directory / f"meta_{step}.json"]
    for path in names:
        if path.is_file():
            return path
    for path in names:
        if os.path.lexists(path):
            return path
    raise CheckpointError(f"{directory}: no meta_{step:06d}.json next to the model file")


def detect_unsupported(path: Path) -> None:
    """Raise a clear error for formats we recognise but this backend does not load."""
    if path.is_file() and path.suffix == ".gguf":
        raise UnsupportedFormatError(f"{path}: GGUF files are not supported yet")
    if not path.is_dir():
        return
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        raise UnsupportedFormatError(
            f"{path}: a Hugging Face model folder, not supported by the nanochat loader (open it as a model)"
        )
    if any(path.glob("*.gguf")):
        raise UnsupportedFormatError(f"{path}: GGUF files are not supported yet")
    if (
        (path / ".metadata").is_file()
        or any(path.glob("step_*/.metadata"))
        or any(path.glob("pp*/.metadata"))
    ):
        raise UnsupportedFormatError(
            f"{path}: KempnerForge DCP checkpoints are not supported by the nanochat loader "
            "(open the run or its step folder as a model)"
        )
    if any(path.glob("dist_ckpt_*")) and not model_steps(path):
        raise UnsupportedFormatError(
            f"{path}: TPU dist_ckpt checkpoint; convert it with torch.distributed.checkpoint first"
        )


# What a weight may be stored as (the loader casts to the compute dtype).
WEIGHT_DTYPES = ("float32", "bfloat16", "float16")


def read_meta(path: Path) -> dict[str, Any]:
    return read_meta_and_digest(path)[0]


def read_meta_and_digest(path: Path) -> tuple[dict[str, Any], str]:
    """The meta json and the first 16 hex digits of its sha256 (of the bytes parsed, so a file
    replaced meanwhile cannot give a hash of something else)."""
    try:
        raw = read_bytes(path, "meta")
        data = parse_json(raw.decode("utf-8"), path)
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: cannot read (not UTF-8 text)") from None
    except FileRefused as exc:
        raise CheckpointError(str(exc)) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data, hashlib.sha256(raw).hexdigest()[:16]


def tensor_shapes(path: Path) -> dict[str, TensorInfo]:
    """Every tensor's dtype and shape as ``data.pkl`` records them, torch.compile's prefix
    stripped; no weight is read and torch is not imported. Raises :class:`CheckpointError`."""
    try:
        scan = scan_torch_file(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except PickleRefused as exc:
        raise CheckpointError(f"{path}: {_refusal(exc)}") from None
    except FileRefused as exc:
        raise CheckpointError(str(exc)) from None
    if scan.top != "dict":
        raise CheckpointError(f"{path}: expected a dict of tensors, found a {noun(scan.top)}")
    out: dict[str, TensorInfo] = {}
    for key, info in scan.entries:
        if not isinstance(key, str) or not isinstance(info, TensorInfo):
            raise CheckpointError(f"{path}: entry {_short_repr(key)} is not a named tensor")
        out[key.removeprefix(COMPILE_PREFIX)] = info
    bad = [f"{k!r} ({t.dtype})" for k, t in out.items() if t.dtype not in WEIGHT_DTYPES]
    if bad:
        raise CheckpointError(
            f"{path}: weights must be float32, bfloat16 or float16; "
            f"{'this one is not' if len(bad) == 1 else 'these are not'}: {_short_list(bad)}"
        )
    return out


def _refusal(exc: PickleRefused) -> str:
    if exc.kind == "corrupt":
        return f"file is truncated or corrupt ({exc.reason})"
    if exc.kind == "global" and exc.reason:
        return (
            f"refused to load: it holds {exc.reason}, and weights must be dense float32, bfloat16 "
            f"or float16 tensors ({exc.name})"
        )
    if exc.kind == "global":
        return f"refused to load: the file contains pickled code or objects that are not tensors ({exc.name})"
    if exc.kind == "construct":
        return f"refused to load: {exc.reason}"
    return f"refused to load: {exc.reason}"


def _short_repr(key: object, limit: int = 80) -> str:
    """An entry's key for a message: quoted text, or what it is instead."""
    text = repr(key) if isinstance(key, str) else f"with a key that is not text ({str(key)[:20]})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short_list(items: list[str], limit: int = 5) -> str:
    head = ", ".join(items[:limit])
    return head + (f" and {len(items) - limit} more" if len(items) > limit else "")


def load_state_dict(
    path: Path, mmap: bool = True, expected: dict[str, TensorInfo] | None = None
) -> dict[str, Any]:
    """The tensors of a ``model_*.pt`` (``weights_only=True``), torch.compile's prefix stripped.

    The file is scanned first (:func:`tensor_shapes`; pass its result as ``expected`` when the
    caller already has it). ``mmap=True`` maps the file: cheap, for reads that end soon; a model
    that stays loaded passes ``mmap=False`` (see the module doc).
    """
    expected = tensor_shapes(path) if expected is None else expected
    import torch

    try:
        if mmap and zipfile.is_zipfile(path):  # torch maps only the zip format
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        else:
            with open_regular(path) as f:  # a file object: names that are not UTF-8 open too
                sd = torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{path}: {_weights_only_refusal(exc)}") from None
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except FileRefused as exc:
        raise CheckpointError(str(exc)) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, MemoryError) as exc:
        if is_out_of_memory(exc):
            raise OutOfMemoryError(
                f"{path}: out of memory while reading the file; close other programs "
                "or use a smaller checkpoint"
            ) from None
        raise CheckpointError(f"{path}: file is truncated or corrupt ({error_text(exc)})") from None
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, found {type(sd).__name__}")
    out = {}
    for key, value in sd.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: entry {_short_repr(key)} is not a named tensor")
        out[key.removeprefix(COMPILE_PREFIX)] = value
    check_tensors(out, expected, path)
    return out


def check_tensors(sd: dict[str, Any], expected: dict[str, TensorInfo], path: Path) -> None:
    """What torch built is what the scan read: plain dense CPU tensors of a weight dtype.

    Metadata only (no element is read). Catches a file changed between the scan and the load.
    """
    import torch

    if set(sd) != set(expected):
        raise CheckpointError(f"{path}: changed while it was being read; try again")
    for key, t in sd.items():
        if isinstance(t, torch.nn.Parameter):
            t = sd[key] = t.detach()
        kind = (
            "a tensor subclass"
            if type(t) is not torch.Tensor
            else "a sparse tensor"
            if t.layout != torch.strided
            else "a nested tensor"
            if t.is_nested
            else "a quantized tensor"
            if t.is_quantized
            else f"a {t.device.type}-device tensor"
            if t.device.type != "cpu"
            else ""
        )
        if kind:
            raise CheckpointError(f"{path}: {key!r} is {kind}; weights must be dense CPU tensors")
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype != expected[key].dtype or tuple(t.shape) != expected[key].shape:
            raise CheckpointError(f"{path}: changed while it was being read; try again")


def _weights_only_refusal(exc: pickle.UnpicklingError) -> str:
    """torch's weights_only refusal as one line of ours: its own text is a paragraph of advice."""
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if found:  # the pickle names a class or function: code, or objects that are not tensors
        return (
            "refused to load: the file contains pickled code or objects that are not tensors "
            f"({found.group(1)})"
        )
    return "not a PyTorch checkpoint, or the file is truncated or corrupt"
