"""Bit-exact row-parallel matrix-vector products for CPU decoding.

For a single query row torch's CPU GEMV runs on one core for tall matrices such as the
lm_head (vocab x d_model). Each output element is still one dot product over the same row, so
splitting the weight's rows across threads gives bit-identical results while using every core.
torch releases the GIL inside the kernel, so plain Python threads suffice.
"""

from __future__ import annotations

import atexit
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

MIN_BYTES = 8 << 20  # below this the thread hand-off costs more than it saves

_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nanoscope-gemv")
        atexit.register(_pool.shutdown, wait=False)
    return _pool


def split_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two row halves of ``weight`` when a split pays off on this device, else None."""
    if weight.device.type != "cpu" or weight.numel() * weight.element_size() < MIN_BYTES:
        return None
    if torch.get_num_threads() < 2:
        return None
    half = (weight.shape[0] + 1) // 2
    top, bottom = weight.split(half)
    return top, bottom


def _linear_no_grad(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():  # grad mode is per thread; the pool thread must not track autograd
        return F.linear(x, w)


def linear_rows(x: torch.Tensor, halves: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``F.linear(x, cat(halves))`` computed as two concurrent halves (x: (..., K), one row of queries)."""
    top, bottom = halves
    future = _executor().submit(_linear_no_grad, x, bottom)
    first = F.linear(x, top)
    return torch.cat([first, future.result()], dim=-1)
