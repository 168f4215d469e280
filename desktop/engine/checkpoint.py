"""Find and read nanochat-family checkpoint files safely (docs/ARCHITECTURE.md, Where data lives; Eras: Loading).

Weights are read with ``torch.load(weights_only=True, mmap=True)``: no pickled code can run and
the tensors stay file-backed until they are used.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import CheckpointError, OutOfMemoryError, UnsupportedFormatError, is_out_of_memory

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
    for name in (f"meta_{step:06d}.json", f"meta_{step}.json"):
        if (directory / name).is_file():
            return directory / name
    raise CheckpointError(f"{directory}: no meta_{step:06d}.json next to the model file")


def detect_unsupported(path: Path) -> None:
    """Raise a clear error for formats we recognise but do not load yet (docs/ARCHITECTURE.md, Eras: Loading)."""
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
            f"{path}: KempnerForge DCP checkpoints are not supported yet (they also need the training TOML)"
        )
    if any(path.glob("dist_ckpt_*")) and not model_steps(path):
        raise UnsupportedFormatError(
            f"{path}: TPU dist_ckpt checkpoint; convert it with torch.distributed.checkpoint first"
        )


def read_meta(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def load_state_dict(path: Path) -> dict[str, Any]:
    """Memory-map a ``model_*.pt`` with ``weights_only=True`` and strip torch.compile's prefix."""
    import torch

    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            sd = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{path}: refused to load: the file contains pickled code or objects "
            f"that are not tensors ({first[:160]})"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, MemoryError) as exc:
        if is_out_of_memory(exc):
            raise OutOfMemoryError(
                f"{path}: out of memory while reading the file; close other programs "
                "or use a smaller checkpoint"
            ) from None
        raise CheckpointError(f"{path}: file is truncated or corrupt ({_first_line(exc)})") from None
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, found {type(sd).__name__}")
    out = {}
    for key, value in sd.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: entry {key!r} is not a named tensor")
        out[key.removeprefix(COMPILE_PREFIX)] = value
    return out


def _all_finite(t: Any) -> bool:
    """True when no element is NaN or +-Inf.

    A sum is finite exactly when every element is, unless finite values overflow it; only then
    is every element looked at, a chunk at a time. Neither path allocates a weight-sized
    temporary, which would add to the peak memory of loading (``isfinite(t)`` is one byte per
    element, and the allocator keeps such blocks afterwards).
    """
    import torch

    if bool(torch.isfinite(t.sum())):
        return True
    flat, chunk = t.reshape(-1), 1 << 20
    return all(bool(torch.isfinite(flat[i : i + chunk]).all()) for i in range(0, flat.numel(), chunk))


def check_finite(sd: dict[str, Any], path: Path) -> None:
    bad = [k for k, t in sd.items() if t.is_floating_point() and not _all_finite(t)]
    if bad:
        raise CheckpointError(
            f"{path}: non-finite values (NaN/Inf) in {', '.join(bad[:5])}"
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def _file_mappings(path: Path) -> list[tuple[int, int]]:
    """Address ranges where this process maps ``path`` (Linux; elsewhere none are known)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    target = str(path.resolve())
    ranges = []
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == target:
            start, end = (int(a, 16) for a in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def page_releaser(path: Path) -> Callable[[Any], int]:
    """A function that drops from memory the pages of a tensor that is a memory-mapped ``path``
    and returns the bytes dropped (0 for any other tensor, or where this is not supported).

    For weights the model no longer reads (packed into another form): their pages stay resident
    after packing and count towards the process's memory until the whole file is unmapped, which
    the embeddings prevent. The mapping is private and never written, so ``MADV_DONTNEED`` only
    forgets pages the file still holds; tensors elsewhere (anonymous memory, which it would
    zero) are left alone.
    """
    import ctypes
    import mmap

    ranges = _file_mappings(path)
    if not ranges or not hasattr(mmap, "MADV_DONTNEED"):
        return lambda _t: 0
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = mmap.PAGESIZE

    def release(t: Any) -> int:
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        if not any(lo <= start and end <= hi for lo, hi in ranges):
            return 0
        first, last = -(-start // page) * page, end // page * page  # whole pages inside the tensor
        if last > first and madvise(first, last - first, mmap.MADV_DONTNEED) == 0:
            return last - first
        return 0

    return release
