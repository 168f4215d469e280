"""nanochat's weightless RMSNorm, ``F.rms_norm(x, (x.size(-1),))``, in a third of its dispatches.

On the CPU, torch computes ``rms_norm`` as a composite of plain ops: ``x * rsqrt(mean(x**2) +
eps)``, the mean being a sum divided by the row length. Two of those ops take a Python-side
scalar (the row length, float32's machine epsilon), which torch wraps into a new tensor and
casts to float32 on every call. In a one-row decode step that bookkeeping costs more than the
arithmetic: the demo runs 14 norms a step (its whole step 2.82 -> 2.59 ms median on a 2-core
AMD EPYC, same logits bit for bit; docs/PERFORMANCE.md, Per-step overhead).

:func:`rms_norm` runs the same ops on the same values, with both scalars as 0-dim float32 tensors
made once, so its bits are torch's. That is checked, not assumed: the first call at each width
norms random probe rows both ways, and a width whose results differ (a torch whose CPU
``rms_norm`` became a fused kernel, with its own summation order) keeps ``torch.rms_norm``.
Elsewhere torch's own op runs: on CUDA and MPS it is a fused kernel, and autograd (the demo
trainer) and the compiler want the op whole.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

PROBE_ROWS = 8  # random rows each width is checked with, at several magnitudes

_EPS = torch.tensor(torch.finfo(torch.float32).eps)  # what F.rms_norm adds when eps is None
# Row width -> the width as a 0-dim float32 tensor, or None where the ops do not give torch's bits.
_widths: dict[int, torch.Tensor | None] = {}


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """``torch.rms_norm(x, (x.size(-1),))``, bit for bit."""
    plain_cpu = x.is_cpu and x.dtype is torch.float32
    if plain_cpu and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
        width = x.size(-1)
        length = _widths[width] if width in _widths else _check(width)
        if length is not None:
            return _by_ops(x, length)
    return torch.rms_norm(x, (x.size(-1),))


def _by_ops(x: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """torch's CPU composite, op for op (its ``pow(x, 2)`` is computed as ``x * x``)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True).div_(length).add_(_EPS))


def _check(width: int) -> torch.Tensor | None:
    """The 0-dim length for ``width`` if the ops give ``torch.rms_norm``'s bits on probe rows."""
    length = torch.tensor(float(width))
    generator = torch.Generator().manual_seed(width)
    rows = torch.randn(PROBE_ROWS, width, generator=generator)
    rows *= torch.logspace(-6, 6, PROBE_ROWS).unsqueeze(1)  # tiny to large, where rounding differs
    same = torch.equal(_by_ops(rows, length), torch.rms_norm(rows, (width,)))
    if not same:
        logger.info("rms_norm: the ops differ from torch.rms_norm at width %d; using torch's", width)
    _widths[width] = length if same else None
    return _widths[width]
