"""The matrix products of a decode step: exact (fp32, bit-identical to the plain path) or fast.

Decoding one token multiplies every weight matrix by one row, so a decode step is as fast as
these matrix-vector products stream the weights. Besides :class:`PlainLinear` (torch's own
``F.linear``, the reference), three kinds replace ``nn.Linear.forward``:

* :class:`ExactLinear` (fp32). With one input row, torch's CPU ``F.linear`` runs the BLAS GEMV,
  often on one core, at about half the memory bandwidth two cores reach. Viewing the weight's
  rows as P stacked blocks and calling ``bmm`` computes every output as a dot product over the
  same row on P threads at once. Whether that gives the plain path's bits is not assumed: a BLAS
  may sum some rows in another order depending on the shape, the thread count and the operands'
  alignment (MKL's threaded SGEMV on AVX-512 computes the last rows of each thread's share with
  another kernel), so every faster route is checked against the plain computation with random
  rows, for each shape, thread count and alignment it meets, and a route that differs is never
  used. A fused matrix (q|k|v) is checked against the separate products the plain path runs.
* :class:`PackedFp16Linear` (fast mode on x86 CPUs): fp16 weights packed for fbgemm's
  half-precision GEMM, fp32 activations and accumulation. Half the bytes per step, and closer
  to fp32 than bf16 compute.
* :class:`Int8Linear` (int8 mode on x86 CPUs): fbgemm's dynamic quantisation, int8 weights per
  output channel and int8 activations per call.

The fast kinds own their weights (packed), so the fp32 matrix can be freed after packing.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

# Below this size a split costs more (thread hand-off) than it saves.
MIN_SPLIT_BYTES = 128 << 10
# Blocks per thread: two balance better than one when a thread's block outlasts its cache.
BLOCKS_PER_THREAD = 2
# Address bits that may steer a BLAS kernel (MKL documents that, outside its conditional numerical
# reproducibility mode, results may change with the operands' alignment; on an AMD CPU a weight
# moved by 4 bytes does change them). Routes are chosen per input alignment modulo this.
ALIGNMENT = 64
# Random rows each route is checked with. A route that sums in another order usually does so for
# a few rows only (MKL: the tail rows of each thread's share), and a reordered row still gives
# the same bits for a random row about 1 time in 4, so one probe row can miss it; six miss a
# single reordered row less than 1 time in 4000, and the usual 2-8 rows practically never.
PROBE_ROWS = 6

Route = Callable[[torch.Tensor], torch.Tensor]

# (device, dtype, shape, parts, weight alignment, route, threads, input alignment) -> the route
# gives the plain path's bits. The summation order depends on these, not on the values.
_verdicts: dict[tuple, bool] = {}


def _blocks_for(rows: int, threads: int) -> int:
    """The largest block count <= BLOCKS_PER_THREAD * ``threads`` dividing ``rows`` (1: no split,
    as with a single thread, where blocks would only run one after another)."""
    if threads < 2:
        return 1
    for p in range(min(BLOCKS_PER_THREAD * threads, rows), 1, -1):
        if rows % p == 0:
            return p
    return 1


def alignment(t: torch.Tensor) -> int:
    """``t``'s address modulo :data:`ALIGNMENT`."""
    return t.data_ptr() % ALIGNMENT


def _split(view: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One row times the weight viewed as ``(blocks, C, N / blocks)``: one ``bmm``, a block a thread."""
    blocks, c, _ = view.shape
    # expand adds the block dimension to a (1, C) or (1, 1, C) row without copying it
    return torch.bmm(x.expand(blocks, 1, c), view).view(*x.shape[:-1], -1)


def _probe_row(weight: torch.Tensor, align: int, generator: torch.Generator) -> torch.Tensor:
    """A random ``(1, 1, C)`` row on ``weight``'s device whose address is ``align`` modulo
    :data:`ALIGNMENT`, like the input it stands for."""
    c = weight.shape[1]
    buf = torch.empty(c + ALIGNMENT, dtype=weight.dtype, device=weight.device)
    start = (align - alignment(buf)) % ALIGNMENT // buf.element_size()
    row = buf[start : start + c]
    row.copy_(torch.randn(c, generator=generator))
    return row.view(1, 1, c)


class ExactLinear:
    """The plain path's ``F.linear(x, weight)`` bits for a bias-free weight, by the fastest route
    checked to give them; one-row CPU inputs use every thread.

    ``parts`` (row counts) marks a fused matrix such as q|k|v: the plain path multiplies its parts
    one by one, so that is what every route is checked against, and what runs when none agrees.
    """

    def __init__(self, weight: torch.Tensor, parts: Sequence[int] = ()) -> None:
        self.weight = weight
        self.weight_nbytes = weight.numel() * weight.element_size()
        self.in_features = weight.shape[1]
        self.part_rows = tuple(parts) if len(parts) > 1 else ()
        self.parts = weight.split(list(self.part_rows)) if self.part_rows else ()
        self._part_products = tuple(ExactLinear(p) for p in self.parts)
        self._splittable = (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and self.weight_nbytes >= MIN_SPLIT_BYTES
        )
        self._routes: dict[tuple[int, int], Route] = {}  # (threads, input alignment) -> route

    def plain(self, x: torch.Tensor) -> torch.Tensor:
        """What the plain path computes: ``F.linear``, once per part of a fused matrix."""
        if not self.parts:
            return F.linear(x, self.weight)
        return torch.cat([F.linear(x, part) for part in self.parts], -1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != self.in_features or x.dim() > 3:
            return self.plain(x)  # several rows (prefill): BLAS GEMM, already on every thread
        # Per call, not per model: torch's thread count is per thread, and may change between calls.
        key = (torch.get_num_threads(), alignment(x))
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = self._choose(*key)
        return route(x)

    def _choose(self, threads: int, align: int) -> Route:
        """The first candidate route that gives the plain bits here, else the plain route."""
        n, c = self.weight.shape
        candidates: list[tuple[str, Route]] = []
        blocks = _blocks_for(n, threads) if self._splittable else 1
        if blocks > 1:
            view = self.weight.view(blocks, n // blocks, c).mT
            candidates.append((f"split into {blocks}", partial(_split, view)))
        if self.parts:
            candidates.append(("one F.linear", self._linear))
        for name, route in candidates:
            if self._verdict(name, route, threads, align):
                return route
        if self.parts:  # each part by its own fastest route that gives F.linear's bits
            return self._by_parts
        return self._linear

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def _by_parts(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([product(x) for product in self._part_products], -1)

    def _verdict(self, name: str, route: Route, threads: int, align: int) -> bool:
        w = self.weight
        key = (w.device.type, w.dtype, tuple(w.shape), self.part_rows, alignment(w), name, threads, align)
        if key not in _verdicts:
            _verdicts[key] = self._matches(route, align)
            if not _verdicts[key]:
                logger.info(
                    "exact: %s x %s%s by %s at %d threads differs from the plain path; not used",
                    *w.shape,
                    f" (parts {self.part_rows})" if self.part_rows else "",
                    name,
                    threads,
                )
        return _verdicts[key]

    def _matches(self, route: Route, align: int) -> bool:
        """Whether ``route`` gives the plain bits for :data:`PROBE_ROWS` random rows (a real
        activation could be all zeros and prove nothing)."""
        generator = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            for _ in range(PROBE_ROWS):
                x = _probe_row(self.weight, align, generator)
                if not torch.equal(route(x), self.plain(x)):
                    return False
        return True


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


Kernel = PlainLinear | ExactLinear | PackedFp16Linear | Int8Linear
_KERNELS = {"plain": PlainLinear, "exact": ExactLinear, "fp16": PackedFp16Linear, "int8": Int8Linear}
GEMV_KINDS = tuple(_KERNELS)
MIN_PACKED_SIDE = 64  # gates (a dozen rows or columns) stay fp32: packing them saves nothing


def packs(weight: torch.Tensor, kind: str) -> bool:
    """Whether ``kind`` packs this weight into a form of its own (the fp32 matrix is then unused)."""
    return kind in ("fp16", "int8") and weight.device.type == "cpu" and min(weight.shape) >= MIN_PACKED_SIDE


def make_product(weight: torch.Tensor, kind: str, parts: Sequence[int] = ()) -> Kernel:
    """The kernel computing ``x @ weight.T`` for ``kind`` (a bias-free weight). ``parts``: the
    row counts of the matrices fused into ``weight``, which exact mode must match one by one."""
    if kind not in GEMV_KINDS:
        raise ValueError(f"unknown matrix-vector kind {kind!r}")
    if kind in ("fp16", "int8") and not packs(weight, kind):
        kind = "exact"
    if kind == "exact":
        return ExactLinear(weight, parts)
    return _KERNELS[kind](weight)


Release = Callable[[torch.Tensor], object]


def install_gemv(module: torch.nn.Linear, kind: str, release: Release | None = None) -> None:
    """Route a bias-free Linear through ``kind``'s kernel.

    A packing kind takes over the weight: the module's own ``weight`` becomes None, and the fp32
    matrix, which the model no longer needs, goes to ``release`` at once (to drop its pages from
    memory before the next one is packed).
    """
    weight = module.weight
    # An instance attribute shadows Linear.forward (mypy: a kernel is the same kind of callable).
    module.forward = make_product(weight, kind)  # type: ignore[method-assign, assignment]
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
