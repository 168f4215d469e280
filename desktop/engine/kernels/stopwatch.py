"""How a candidate kernel is timed, so that the fastest on this machine wins its ranking.

Each sample is one product after evicting the caches (a big matrix, as in a decode step) or the
mean of a few warm calls (a small one); lossy candidates are timed streaming through copies of
their matrix in their own form, as a decode step streams its layers. The fastest sample counts:
a busy machine only ever adds time. :class:`OtherLoad` says how busy the machine was meanwhile,
which :mod:`.tuning` logs: what it measured is kept all the same (a choice once used must give the
same numbers at the next start), and re-measured only when the user asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from desktop.engine.kernels.gemv import Kernel
from desktop.engine.text_lines import error_text

ROUNDS = 9  # samples per candidate; the fastest is kept
# In a decode step every matrix comes from DRAM (the rest of the model evicts it), so a matrix of
# a megabyte or more is timed after reading this much other memory, more than the last-level cache
# of the desktop and laptop CPUs this runs on. Smaller ones are dominated by fixed costs, and timed
# warm, several calls per sample.
FLUSH_BYTES = 64 << 20
FLUSH_FROM = 1 << 20
WARM_CALLS = 8
# Lossy candidates are timed streaming through this many bytes of copies in their own form (more
# than the last-level cache of the desktop CPUs this runs on), in this many passes.
STREAM_BYTES = 64 << 20
STREAM_ROUNDS = 5
# At most this many copies: a matrix under 1 MB is mostly fixed costs (and building hundreds of
# packed copies would slow the first load more than it sharpens the ranking).
MAX_COPIES = 64


@dataclass(frozen=True)
class Candidate:
    """A kernel that may compute a mode's products: its name, and how to build it from a weight."""

    name: str
    build: Callable[[torch.Tensor], Kernel]


def best_us(calls: dict[str, Callable[[], object]], flush: torch.Tensor | None) -> dict[str, float]:
    """The fastest of :data:`ROUNDS` samples of each of ``calls``, in microseconds, each sample
    after evicting the caches when ``flush`` is given, else the mean of :data:`WARM_CALLS` calls.

    The candidates take turns within each round, so a burst of load hits them alike. And the
    minimum, not the median: on a busy machine (a browser, another model in Compare) a product
    whose threads lose the CPU takes a scheduler slice longer, often in most samples; that only
    ever adds time, so the fastest sample is the kernel's own speed."""
    for call in calls.values():
        call()
        call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            if flush is not None:
                flush.sum()  # reads FLUSH_BYTES: the weight is no longer in any cache
                t0 = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - t0)
            else:
                t0 = time.perf_counter()
                for _ in range(WARM_CALLS):
                    call()
                samples[name].append((time.perf_counter() - t0) / WARM_CALLS)
    return {name: min(times) * 1e6 for name, times in samples.items()}


class OtherLoad:
    """How much of the machine other processes used from creation to :meth:`share`."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._start = (time.monotonic(), self._busy(), self._mine())

    def _busy(self) -> float:
        t = psutil.cpu_times()
        return t.user + t.system + getattr(t, "nice", 0.0)

    def _mine(self) -> float:
        t = self._me.cpu_times()
        return t.user + t.system

    def share(self) -> float:
        """Other processes' CPU time over the wall time of every core, since creation (0..1)."""
        wall = (time.monotonic() - self._start[0]) * (psutil.cpu_count() or 1)
        others = (self._busy() - self._start[1]) - (self._mine() - self._start[2])
        return max(0.0, others / wall) if wall > 0 else 0.0


def stream_times(
    candidates: list[Candidate], part: torch.Tensor, refused: dict[str, str]
) -> dict[str, float]:
    """µs per product of each candidate, streaming: built on enough copies of ``part`` to fill
    :data:`STREAM_BYTES` in its own form, each sample runs them one after another, as a decode
    step runs its layers, so each product reads its matrix from DRAM with the prefetchers at work.

    (Timing one product alone after evicting the caches ranked torch's weight-only int8 10%
    ahead of fbgemm's int8 on an AMD EPYC, where a whole decode step with it was 45% slower;
    streamed, fbgemm came out 1.4-1.8x ahead, as in the step.) One candidate's copies exist at a
    time, so the candidates are timed in turn; the fastest of several passes over the copies
    counts (a busy machine only adds time)."""
    x = torch.randn(1, 1, part.shape[1], dtype=part.dtype)
    timed: dict[str, float] = {}
    for candidate in candidates:
        try:
            first = candidate.build(part.clone())  # a copy of its own, even for fp32
            first(x)
        except (RuntimeError, ValueError, NotImplementedError) as exc:  # not in this build
            refused[candidate.name] = f"unavailable ({error_text(exc, 80)})"
            continue
        count = min(MAX_COPIES, max(1, -(-STREAM_BYTES // max(1, first.weight_nbytes))))
        copies = [first, *(candidate.build(part.clone()) for _ in range(count - 1))]
        timed[candidate.name] = _stream_us(copies, x)
        del first, copies
    return timed


def _stream_us(copies: list[Kernel], x: torch.Tensor) -> float:
    """The fastest of :data:`STREAM_ROUNDS` passes over ``copies``, in µs per product."""
    for kernel in copies:
        kernel(x)
    samples = []
    for _ in range(STREAM_ROUNDS):
        t0 = time.perf_counter()
        for kernel in copies:
            kernel(x)
        samples.append((time.perf_counter() - t0) / len(copies))
    return min(samples) * 1e6


def bind(kernel: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], object]:
    """A call of ``kernel`` on ``x`` that takes no arguments, as :func:`best_us` times it."""
    return lambda: kernel(x)
