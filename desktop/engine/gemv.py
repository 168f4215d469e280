"""The matrix products of a decode step: exact (fp32, bit-identical to ``F.linear``) or fast.

Decoding one token multiplies every weight matrix by one row, so a decode step is as fast as
these matrix-vector products stream the weights. Besides :class:`PlainLinear` (torch's own
``F.linear``, the reference), three kinds replace ``nn.Linear.forward``:

* :class:`ExactLinear` (fp32). With one input row, torch's CPU ``F.linear`` runs the BLAS GEMV on
  one core, at about half the memory bandwidth two cores reach. Viewing the weight's rows as P
  stacked blocks and calling ``bmm`` computes every output as the same dot product (same row,
  same length, same BLAS kernel) on P OpenMP threads at once. That it really gives the same bits
  is checked for each shape and block count on first use, against ``F.linear`` itself; a shape
  that differs keeps ``F.linear`` for good, so exact mode never trusts the claim blindly.
* :class:`PackedFp16Linear` (fast mode on x86 CPUs): fp16 weights packed for fbgemm's
  half-precision GEMM, fp32 activations and accumulation. Half the bytes per step, and closer
  to fp32 than bf16 compute.
* :class:`Int8Linear` (int8 mode on x86 CPUs): fbgemm's dynamic quantisation, int8 weights per
  output channel and int8 activations per call.

The fast kinds own their weights (packed), so the fp32 matrix can be freed after packing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

# Below this size a split costs more (thread hand-off) than it saves.
MIN_SPLIT_BYTES = 128 << 10
# Blocks per thread: two balance better than one when a thread's block outlasts its cache.
BLOCKS_PER_THREAD = 2

_verdicts: dict[tuple, bool] = {}  # (rows, cols, blocks, dtype) -> the split gives F.linear's bits


def _blocks_for(rows: int, threads: int) -> int:
    """The largest block count <= BLOCKS_PER_THREAD * ``threads`` dividing ``rows`` (1: no split,
    as with a single thread, where blocks would only run one after another)."""
    if threads < 2:
        return 1
    for p in range(min(BLOCKS_PER_THREAD * threads, rows), 1, -1):
        if rows % p == 0:
            return p
    return 1


def _split_matches(weight: torch.Tensor, blocks: int) -> bool:
    """Whether the row split gives ``F.linear``'s bits for this shape on this machine's BLAS.

    The summation order depends on the shapes, not on the values, so one random row decides it;
    a real activation could be all zeros and prove nothing.
    """
    n, c = weight.shape
    probe = torch.randn(1, 1, c, generator=torch.Generator().manual_seed(0), dtype=weight.dtype)
    split = torch.bmm(probe.expand(blocks, 1, c), weight.view(blocks, n // blocks, c).transpose(1, 2))
    return torch.equal(split.view(1, 1, n), F.linear(probe, weight))


class ExactLinear:
    """``F.linear(x, weight)`` for a bias-free fp32 weight; one-row CPU inputs use every thread."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.weight_nbytes = weight.numel() * weight.element_size()
        self.in_features = weight.shape[1]
        self._split = (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and self.weight_nbytes >= MIN_SPLIT_BYTES
        )
        # threads -> (blocks, the weight as (blocks, C, N / blocks)), or None: F.linear
        self._plans: dict[int, tuple[int, torch.Tensor] | None] = {}

    def _plan(self, threads: int) -> tuple[int, torch.Tensor] | None:
        n, c = self.weight.shape
        blocks = _blocks_for(n, threads) if self._split else 1
        key = (n, c, blocks, self.weight.dtype)
        if blocks > 1 and key not in _verdicts:
            with torch.inference_mode():
                _verdicts[key] = _split_matches(self.weight, blocks)
        plan = (
            (blocks, self.weight.view(blocks, n // blocks, c).transpose(1, 2)) if _verdicts.get(key) else None
        )
        self._plans[threads] = plan
        return plan

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != self.in_features or x.dim() > 3:
            return F.linear(x, self.weight)
        threads = torch.get_num_threads()  # per thread in torch: Compare panes may differ
        plan = self._plans[threads] if threads in self._plans else self._plan(threads)
        if plan is None:
            return F.linear(x, self.weight)
        blocks, view = plan
        # expand adds the block dimension to a (1, C) or (1, 1, C) row without copying it
        return torch.bmm(x.expand(blocks, 1, self.in_features), view).view(*x.shape[:-1], -1)


def fbgemm_available() -> bool:
    """True where torch has fbgemm's packed fp16 and int8 kernels (x86 builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


class PackedFp16Linear:
    """fp16 weights (fbgemm-packed), fp32 in and out; the fp32 weight is not kept."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.out_features, self.in_features = weight.shape
        self.weight_nbytes = weight.numel() * 2
        self._packed = torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous(), None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)


class Int8Linear:
    """int8 weights (per output channel, symmetric), activations quantised per call by fbgemm."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.out_features, self.in_features = weight.shape
        self.weight_nbytes = weight.numel()
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            # torch flags its quantised tensor types as deprecated; fbgemm's kernels still need them.
            warnings.simplefilter("ignore", UserWarning)
            q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(q, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed)


class PlainLinear:
    """torch's own ``F.linear``: the reference the other kinds are checked against."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.weight_nbytes = weight.numel() * weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


Product = PlainLinear | ExactLinear | PackedFp16Linear | Int8Linear
_KERNELS = {"plain": PlainLinear, "exact": ExactLinear, "fp16": PackedFp16Linear, "int8": Int8Linear}
GEMV_KINDS = tuple(_KERNELS)
MIN_PACKED_SIDE = 64  # gates (a dozen rows or columns) stay fp32: packing them saves nothing


def packs(weight: torch.Tensor, kind: str) -> bool:
    """Whether ``kind`` packs this weight into a form of its own (the fp32 matrix is then unused)."""
    return kind in ("fp16", "int8") and weight.device.type == "cpu" and min(weight.shape) >= MIN_PACKED_SIDE


def make_product(weight: torch.Tensor, kind: str) -> Product:
    """The kernel computing ``x @ weight.T`` for ``kind`` (a bias-free weight)."""
    if kind not in GEMV_KINDS:
        raise ValueError(f"unknown matrix-vector kind {kind!r}")
    if kind in ("fp16", "int8") and not packs(weight, kind):
        kind = "exact"
    return _KERNELS[kind](weight)


Release = Callable[[torch.Tensor], object]


def install_gemv(module: torch.nn.Linear, kind: str, release: Release | None = None) -> None:
    """Route a bias-free Linear through ``kind``'s kernel.

    A packing kind takes over the weight: the module's own ``weight`` becomes None, and the fp32
    matrix, which the model no longer needs, goes to ``release`` at once (to drop its pages from
    memory before the next one is packed).
    """
    weight = module.weight
    module.forward = make_product(weight, kind)  # an instance attribute shadows Linear.forward
    if packs(weight, kind):
        module.register_parameter("weight", None)
        if release is not None:
            release(weight)


def weight_bytes(module: torch.nn.Linear) -> int:
    """Bytes a product with this Linear streams, whichever kernel holds its weight."""
    kernel = module.__dict__.get("forward")
    if kernel is not None:
        return kernel.weight_nbytes
    return module.weight.numel() * module.weight.element_size()
