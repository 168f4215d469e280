"""The matrix products of a decode step: exact (fp32, bit-identical to the plain path) or fast.

Decoding one token multiplies every weight matrix by one row, so a decode step is as fast as
these matrix-vector products stream the weights. Which kernel is fastest changes with the CPU,
the shape and the thread count (fp32 ``F.linear`` streams at 13-16 GB/s on one AMD EPYC and at
27 GB/s on an Intel Sapphire Rapids), so nothing here decides by a table: the candidates of a
mode are timed on the machine and the fastest that keeps the mode's contract is kept
(:mod:`.kernel_tuning`). Besides :class:`PlainLinear` (torch's own ``F.linear``, the
reference), the kernels that replace ``nn.Linear.forward`` are:

* :class:`ExactLinear` (fp32). With one input row, torch's CPU ``F.linear`` runs the BLAS GEMV,
  often on one core, at about half the memory bandwidth two cores reach. Viewing the weight's
  rows as P stacked blocks and calling ``bmm`` computes every output as a dot product over the
  same row on P threads at once. Whether that gives the plain path's bits is not assumed: a BLAS
  may sum some rows in another order depending on the shape, the thread count and the operands'
  alignment (MKL's threaded SGEMV on AVX-512 computes the last rows of each thread's share with
  another kernel), so every faster route is checked against the plain computation with random
  rows, for each shape, thread count and alignment it meets, and a route that differs is never
  used. A fused matrix (q|k|v) is checked against the separate products the plain path runs.
  Among the routes that give the bits (splits into 1, 2 or 4 blocks per thread, one
  ``F.linear``), the fastest measured one is used.
* Fast mode's candidates: :class:`PackedFp16Linear` (fp16 weights packed for fbgemm's
  half-precision GEMM, fp32 activations and accumulation; x86), :class:`HalfLinear` (fp16 or
  bf16 weights and activations, ``F.linear``; bf16 runs on AMX or AVX512-BF16 through oneDNN
  where the CPU has them) and the fp32 routes.
* Int8 mode's candidates: :class:`Int8Linear` (fbgemm's dynamic quantisation, int8 weights per
  output channel and int8 activations per call; x86), :class:`Int8WeightOnlyLinear` (int8
  weights dequantised in registers, bf16 activations) and :class:`Int4WeightOnlyLinear` (4-bit
  groups of 32), each kept only where its error is within the mode's bound.
* Where a C++ compiler is found, :class:`NativeInt8Linear` and :class:`NativeHalfLinear` join
  int8 and fast mode's candidates: kernels compiled on the machine for its vector unit
  (:mod:`.native`), with fp32 activations.

The fast kinds own their weights (packed or cast), so the fp32 matrix can be freed afterwards.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from desktop.engine.kernels import fbgemm_ops
from desktop.engine.kernels.native import MAX_ROWS as MAX_NATIVE_ROWS

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
# (product, thread count, candidate routes by name, input rows) -> the names, fastest first
# (kernel_tuning).
Ranker = Callable[["ExactLinear", int, dict[str, Route], int], list[str]]

# (device, dtype, shape, parts, weight alignment, route, threads, input alignment) -> the route
# gives the plain path's bits. The summation order depends on these, not on the values.
_verdicts: dict[tuple, bool] = {}

# Within few_rows(): inputs of up to this many rows take the fastest few-row route; the routes are
# timed (by kernel_tuning) with this many rows, a typical verifying pass.
FEW_ROWS = 8
FEW_ROWS_TIMED = 5
FEW_ROWS_BLOCKS = 16
_few_rows = threading.local()


@contextmanager
def few_rows() -> Iterator[None]:
    """Within this block (on this thread), an exact product of 2 to :data:`FEW_ROWS` input rows
    takes the fastest of :meth:`ExactLinear.few_row_routes` as timed on this machine, so that a
    few rows cost about what one does: each streams the weight once.

    torch's ``F.linear`` over a few rows runs a GEMM whose packing and tiling make it compute
    bound: on a 2-core AMD EPYC (AVX2), five rows of a d20 model's matrices take 2.6-3.6x one
    row's time, and so does a ``bmm`` over blocks of the weight's rows. Multiplying the weight by
    the rows' transpose (``weight @ rows.T``, a GEMM whose small operand is transposed) takes
    1.1-1.7x there at two threads, yet loses to ``F.linear`` at four threads on the same cores;
    so nothing is assumed.

    The sums run in another order than ``F.linear``'s one-row products, so the bits are not the
    plain path's: it is for speculative decoding's verification (decode/speculative.py), whose
    rows differ from one-row steps' bits whichever way they are computed; nothing that promises
    nanochat's bits runs in it. Each route gives its own bits, so (unlike the one-row routes,
    which all give ``F.linear``'s) the choice changes a verifying pass's numbers: it is kept per
    machine and thread count like every timed choice (kernel_tuning), and a seed's speculative
    reply repeats in the next session."""
    before = getattr(_few_rows, "on", False)
    _few_rows.on = True
    try:
        yield
    finally:
        _few_rows.on = before


def _transposed(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` as ``weight @ rows.T``: the rows are the GEMM's small operand."""
    rows = x.reshape(-1, weight.shape[1])
    return (weight @ rows.T).T.reshape(*x.shape[:-1], weight.shape[0]).contiguous()


def _linear(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def _by_parts(products: Sequence[ExactLinear], x: torch.Tensor) -> torch.Tensor:
    """A fused matrix's product as its parts' own products, side by side."""
    return torch.cat([product(x) for product in products], -1)


def _by_blocks(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` for a few rows: each block of the weight's rows times all rows."""
    n, c = weight.shape
    blocks = _blocks_for(n, FEW_ROWS_BLOCKS, 1)
    rows = x.reshape(-1, c)
    out = torch.bmm(weight.view(blocks, n // blocks, c), rows.T.expand(blocks, c, rows.shape[0]))
    return out.permute(2, 0, 1).reshape(*x.shape[:-1], n)


def _blocks_for(rows: int, threads: int, per_thread: int = BLOCKS_PER_THREAD) -> int:
    """The largest block count <= ``per_thread * threads`` dividing ``rows`` (1: no split, as
    with a single thread, where blocks would only run one after another)."""
    if threads < 2:
        return 1
    for p in range(min(per_thread * threads, rows), 1, -1):
        if rows % p == 0:
            return p
    return 1


def _split_counts(rows: int, threads: int) -> list[int]:
    """The block counts worth timing: 1, 2 and 4 blocks per thread, where they divide ``rows``.
    Which one streams fastest depends on the CPU's caches and prefetchers, so all are measured."""
    counts = {_blocks_for(rows, threads, per) for per in (1, BLOCKS_PER_THREAD, 4)}
    return sorted(c for c in counts if c > 1)


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
        self._few_routes: dict[int, Route] = {}  # threads -> the few-row route
        self.chosen = "F.linear"  # the name of the route the last choice settled on
        self.rank: Ranker | None = None  # set by kernel_tuning: orders the routes by speed

    def plain(self, x: torch.Tensor) -> torch.Tensor:
        """What the plain path computes: ``F.linear``, once per part of a fused matrix."""
        if not self.parts:
            return F.linear(x, self.weight)
        return torch.cat([F.linear(x, part) for part in self.parts], -1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # a compiled step (decode/compiled_step.py): one route
            return self.plain(x)
        if x.numel() != self.in_features or x.dim() > 3:
            if (
                self._splittable
                and x.numel() <= FEW_ROWS * self.in_features
                and getattr(_few_rows, "on", False)
            ):
                return self._few_route(torch.get_num_threads())(x)
            return self.plain(x)  # several rows (prefill): BLAS GEMM, already on every thread
        # Per call, not per model: torch's thread count is per thread, and may change between calls.
        key = (torch.get_num_threads(), alignment(x))
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = self._choose(*key)
        return route(x)

    def routes(self, threads: int) -> dict[str, Route]:
        """The candidate routes at ``threads`` threads, by name. "F.linear" on an unfused weight
        is the plain path itself; every other route must prove it gives the same bits."""
        n, c = self.weight.shape
        found: dict[str, Route] = {}
        if self._splittable:
            for blocks in _split_counts(n, threads):
                view = self.weight.view(blocks, n // blocks, c).mT
                found[f"split into {blocks}"] = partial(_split, view)
        found["F.linear"] = partial(_linear, self.weight)
        if self.parts:  # each part by its own fastest route that gives F.linear's bits
            found["by parts"] = partial(_by_parts, self._part_products)
        return found

    def _choose(self, threads: int, align: int) -> Route:
        """The fastest candidate route (as measured by ``rank``) that gives the plain bits here."""
        routes = self.routes(threads)
        ranked = self.rank is not None and len(routes) > 1
        names = self.rank(self, threads, routes, 1) if self.rank is not None and ranked else list(routes)
        # Exact by construction: F.linear is the plain path of an unfused weight, and the parts
        # are each their own ExactLinear. Every other route must prove itself.
        safe = "by parts" if self.parts else "F.linear"
        self.chosen = next(
            name for name in names if name == safe or self._verdict(name, routes[name], threads, align)
        )
        return routes[self.chosen]

    def few_row_routes(self) -> dict[str, Route]:
        """The candidate routes for 2 to :data:`FEW_ROWS` rows within :func:`few_rows`, by name
        (values as ``F.linear``'s within rounding; none gives its bits)."""
        return {
            "rows transposed": partial(_transposed, self.weight),
            "blocks": partial(_by_blocks, self.weight),
            "F.linear": partial(_linear, self.weight),
        }

    def _few_route(self, threads: int) -> Route:
        route = self._few_routes.get(threads)
        if route is None:
            routes = self.few_row_routes()
            first = self.rank(self, threads, routes, FEW_ROWS_TIMED)[0] if self.rank else "F.linear"
            route = self._few_routes[threads] = routes[first]
        return route

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
        self._handle = fbgemm_ops.register(self)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # the packed weight is not traceable; its handle is
            return fbgemm_ops.fp16_linear(x, self._handle, self.out_features)
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
        self._handle = fbgemm_ops.register(self)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # the packed weight is not traceable; its handle is
            return fbgemm_ops.int8_linear(x, self._handle, self.out_features)
        return torch.ops.quantized.linear_dynamic(x, self._packed)


class HalfLinear:
    """fp16 or bf16 weights and activations through ``F.linear`` (oneDNN on x86, which uses AMX
    and AVX512-BF16 where the CPU has them), fp32 out. The fp32 weight is not kept."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.weight = weight.to(dtype).contiguous()
        self.weight_nbytes = self.weight.numel() * self.weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.dtype), self.weight).float()


class Int8WeightOnlyLinear:
    """int8 weights (per output channel, symmetric) dequantised inside torch's
    ``_weight_int8pack_mm``; bf16 activations (with fp32 ones that kernel is 10x slower)."""

    def __init__(self, weight: torch.Tensor) -> None:
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        self.q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.scale = scale.bfloat16()
        self.in_features = w.shape[1]
        self.weight_nbytes = self.q.numel() + self.scale.numel() * 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).bfloat16()
        out = torch._weight_int8pack_mm(rows, self.q, self.scale)
        return out.float().view(*x.shape[:-1], -1)


INT4_GROUP = 32  # columns per scale and offset: 64 or 128 save a little memory and lose more


class Int4WeightOnlyLinear:
    """4-bit weights (asymmetric, a scale and an offset per group of :data:`INT4_GROUP` columns)
    in torch's packed CPU layout, dequantised inside ``_weight_int4pack_mm_for_cpu``; bf16
    activations. A quarter of fp16's bytes; kept only where its error fits the mode."""

    def __init__(self, weight: torch.Tensor) -> None:
        n, k = weight.shape
        if k % INT4_GROUP:
            raise ValueError(f"{k} columns are not a multiple of {INT4_GROUP}")
        groups = weight.float().view(n, k // INT4_GROUP, INT4_GROUP)
        low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        scale = ((high - low) / 15).clamp_min(1e-12)
        q = torch.clamp(torch.round((groups - low) / scale), 0, 15).to(torch.int32).view(n, k)
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        # torch's convention: w = (q - 8) * scale + offset, as (groups, rows, 2) bf16
        offset = low + 8 * scale
        self.scales = torch.stack([scale.view(n, -1), offset.view(n, -1)], -1).transpose(0, 1).contiguous()
        self.scales = self.scales.bfloat16()
        self.in_features = k
        self.weight_nbytes = self.packed.numel() * self.packed.element_size() + self.scales.numel() * 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).bfloat16()
        out = torch._weight_int4pack_mm_for_cpu(rows, self.packed, INT4_GROUP, self.scales)
        return out.float().view(*x.shape[:-1], -1)


class _NativeLinear:
    """A native kernel's product (:mod:`.native`, fp32 activations and sums) for passes of up to
    :data:`~.native.MAX_ROWS` rows; a longer pass (a prompt) multiplies the weight widened to
    fp32 by torch's GEMM."""

    in_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] > MAX_NATIVE_ROWS:
            return F.linear(x, self.widened())
        return self.rows_times(rows.float().contiguous()).view(*x.shape[:-1], -1)

    def rows_times(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def widened(self) -> torch.Tensor:
        raise NotImplementedError


class NativeInt8Linear(_NativeLinear):
    """int8 weights (per output channel, symmetric) by the native kernel."""

    def __init__(self, weight: torch.Tensor, ops: Any) -> None:
        w = weight.float()
        self.scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        self.q = torch.round(w / self.scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.in_features = w.shape[1]
        self.weight_nbytes = self.q.numel() + self.scale.numel() * 4
        self._ops = ops

    def rows_times(self, rows: torch.Tensor) -> torch.Tensor:
        return self._ops.int8_rows(rows, self.q, self.scale)

    def widened(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None]


class NativeHalfLinear(_NativeLinear):
    """fp16 weights by the native kernel."""

    def __init__(self, weight: torch.Tensor, ops: Any) -> None:
        self.weight = weight.to(torch.float16).contiguous()
        self.in_features = weight.shape[1]
        self.weight_nbytes = self.weight.numel() * 2
        self._ops = ops

    def rows_times(self, rows: torch.Tensor) -> torch.Tensor:
        return self._ops.fp16_rows(rows, self.weight)

    def widened(self) -> torch.Tensor:
        return self.weight.float()


class PlainLinear:
    """torch's own ``F.linear``: the reference the other kinds are checked against."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.weight_nbytes = weight.numel() * weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class InlinedLinear(PlainLinear):
    """``F.linear`` as a broadcast product summed over the inner dimension, for the compiled twin
    of a small model (engine/decode/compiled_draft.py): inductor compiles it into its own loops
    with the ops around it, where ``F.linear`` stays a call to the BLAS, ~23 us each for the
    demo's 128x512 matrices, most of its compiled step (2-core AMD EPYC). Run eagerly, it
    materialises ``rows x weight``: a twin runs passes of a few rows of a small model."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x.unsqueeze(-2) * self.weight).sum(-1)


Kernel = (
    PlainLinear
    | ExactLinear
    | PackedFp16Linear
    | Int8Linear
    | HalfLinear
    | Int8WeightOnlyLinear
    | Int4WeightOnlyLinear
    | NativeInt8Linear
    | NativeHalfLinear
)
GEMV_KINDS = ("plain", "inlined", "exact", "fp16", "int8")
# Kinds whose products promise a bound on the error, not nanochat's bits (fast and int8 modes).
APPROXIMATE_KINDS = ("fp16", "int8")
MIN_PACKED_SIDE = 64  # gates (a dozen rows or columns) stay fp32: packing them saves nothing


def packs(weight: torch.Tensor, kind: str) -> bool:
    """Whether ``kind`` stores this weight in a form of its own (the fp32 matrix is then unused)."""
    return kind in APPROXIMATE_KINDS and weight.device.type == "cpu" and min(weight.shape) >= MIN_PACKED_SIDE


def weight_bytes(module: torch.nn.Linear) -> int:
    """Bytes a product with this Linear streams, whichever kernel holds its weight."""
    kernel = module.__dict__.get("forward")
    if kernel is not None:
        return kernel.weight_nbytes
    return module.weight.numel() * module.weight.element_size()
