"""Weights must be finite: a NaN or infinity in any tensor makes every reply garbage, and a
training run that blew up saves exactly that (every family's loader checks with this)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from desktop.engine.errors import CheckpointError
from desktop.engine.text_lines import error_text


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
    """Refuse NaN/Inf in any weight. Every tensor is checked as a float (complex or integer
    tensors never get here from a nanochat file, but a caller's dict might hold one)."""
    import torch

    bad = []
    for key, t in sd.items():
        try:
            if t.is_complex():
                ok = _all_finite(torch.view_as_real(t))
            else:
                ok = not t.is_floating_point() or _all_finite(t)
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            raise CheckpointError(f"{path}: cannot check the values of {key!r} ({error_text(exc)})") from None
        if not ok:
            bad.append(key)
    if bad:
        raise CheckpointError(
            f"{path}: non-finite values (NaN/Inf) in {', '.join(bad[:5])}"
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        )
