"""Bit-exact row-parallel matrix-vector products for CPU decoding.

For a single query row torch's CPU GEMV keeps tall matrices (the lm_head, the MLP) on one core.
Each output element is still one dot product over the same row, so splitting the weight's rows
between two threads gives bit-identical results while using both cores; torch releases the GIL
inside the kernel, so a plain Python thread suffices. Small matrices stay whole: the hand-off
costs more than it saves.
"""

from __future__ import annotations

import atexit
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

MIN_BYTES = 4 << 20

_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nanoscope-gemv")
        atexit.register(_pool.shutdown, wait=False)
    return _pool


def _linear_no_grad(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():  # grad mode is per thread; the pool thread must not track autograd
        return F.linear(x, w)


class RowLinear:
    """``F.linear(x, weight)``, computed as two concurrent row halves when ``x`` is one row."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.halves: tuple[torch.Tensor, torch.Tensor] | None = None
        big = weight.numel() * weight.element_size() >= MIN_BYTES
        if weight.device.type == "cpu" and big and weight.shape[0] >= 2 and torch.get_num_threads() >= 2:
            top, bottom = weight.split((weight.shape[0] + 1) // 2)
            self.halves = (top, bottom)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.halves is None or x.numel() != x.shape[-1]:
            return F.linear(x, self.weight)
        top, bottom = self.halves
        future = _executor().submit(_linear_no_grad, x, bottom)
        first = F.linear(x, top)
        return torch.cat([first, future.result()], dim=-1)


def parallelize(module: torch.nn.Linear) -> bool:
    """Route a bias-free Linear's single-row calls through :class:`RowLinear`; True if it splits."""
    row = RowLinear(module.weight)
    if row.halves is None:
        return False
    module.forward = row  # an instance attribute shadows Linear.forward for this module only
    return True
