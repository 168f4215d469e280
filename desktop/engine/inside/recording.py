"""What every family's recorder shares (Qt-free): the model's own methods swapped for recording
versions for one pass and put back after it, and the line that says a pass is not exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from desktop.engine.kernels.gemv import APPROXIMATE_KINDS


def approximate_note(model: Any) -> str:
    """Why ``model``'s numbers are not its float32 bits, in one line, or ""."""
    if model.kernel_kind in APPROXIMATE_KINDS:
        kind = model.kernel_kind
        return f"{kind} mode: its products round otherwise than float32; these numbers are close, not exact"
    if model.compute_dtype != torch.float32:
        name = str(model.compute_dtype).removeprefix("torch.")
        return f"{name} activations: these numbers are close, not exact"
    return ""


class Patches:
    """Instance attributes set for one pass and put back after it."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, bool, Any]] = []

    def set(self, obj: Any, name: str, value: Callable[..., Any]) -> None:
        had = name in obj.__dict__
        self._saved.append((obj, name, had, obj.__dict__.get(name)))
        object.__setattr__(obj, name, value)

    def restore(self) -> None:
        for obj, name, had, old in reversed(self._saved):
            if had:
                object.__setattr__(obj, name, old)
            else:
                object.__delattr__(obj, name)
        self._saved.clear()


def attention_rows(q_all: torch.Tensor, k_all: torch.Tensor, window: int, position: int) -> torch.Tensor:
    """(H, position + 1) float32: the weights from ``position`` to every token up to it, from the
    q (H, T, D) and k (Hkv, T, D) the model used (query head h reads KV head h // (H / Hkv)); zero
    outside a sliding ``window``."""
    H, Hkv = q_all.size(0), k_all.size(0)
    D = q_all.size(-1)
    start = max(0, position - window)
    with torch.inference_mode():
        q = q_all[:, position].float().view(Hkv, H // Hkv, D)  # query heads under their KV head
        k = k_all[:, start : position + 1].float()  # (Hkv, n, D)
        scores = torch.einsum("gqd,gnd->gqn", q, k) * D**-0.5
        weights = scores.softmax(-1).reshape(H, -1)
        row = torch.zeros(H, position + 1)
        row[:, start:] = weights
    return row
