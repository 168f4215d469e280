"""A plain reply's one-row decode step, compiled, where no bits are owed: fast and int8 mode.

A decode step of a small model is per-operation dispatch as much as weights: at depth 12 in int8
mode on a 2-core AMD EPYC (Zen 3), the products took ~9 ms of an 18 ms step, and the ~400 norms,
rotary products, slices, cache writes and the softcap the rest. The model's forward compiled by
inductor (:class:`~.compiled_draft.CompiledTwin`, with the products as calls into their kernels:
the native ones are torch operators, exact routes trace as ``F.linear``) fuses those into a few
loops: the same step took 12.4-12.7 ms (docs/PERFORMANCE.md, "Compiled steps").

Exact mode never runs it: its replies owe nanochat's bits, which a fused norm's other summation
order does not keep. Fast and int8 promise an error bound, not bits; the compiled step computes
the same function within float rounding of the eager one.

How it stays out of the user's way, and what it keeps, are the draft compiles' rules
(:mod:`.compiled_draft`, :mod:`.verifier`): compiled on a thread of its own at the lowest
priority, waiting while a reply streams; adopted at a reply's start once compiled and timed faster
here; the decision kept per model and machine (:class:`~.pass_timing.Decisions`), so a step found
slower is never compiled again. A reply says whether its steps ran compiled, or why not
(``GenerationStats.step_compiled``, ``step_eager``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from desktop.engine.decode.compiled_draft import CompiledTwin, take_compiled
from desktop.engine.decode.pass_timing import Decisions, timed_ms
from desktop.engine.decode.protocols import DecodingModel
from desktop.engine.kernels.threads import torch_threads

logger = logging.getLogger(__name__)
# The kept decision (Decisions): whether the compiled step is used, and the two times.
COMPILED = "step compiled"
# What a reply says of eager steps, and why.
COMPILING = "eager steps (compiling)"
SLOWER = "eager steps (compiled slower here)"
FAILED = "eager steps (could not compile here)"
STOPPED = "eager steps (compile stopped)"


class CompiledStep:
    """What computes a plain reply's one-row steps: ``eager`` (the model) until a compiled twin
    is adopted (:meth:`settle`); ``why`` says, in a few words, why the eager one runs."""

    def __init__(
        self,
        eager: DecodingModel,
        new_cache: Callable[[int], Any],
        decisions: Decisions,
    ) -> None:
        self.eager = eager
        self.model: DecodingModel = eager
        self.new_cache = new_cache
        self.decisions = decisions
        self.twin: CompiledTwin | None = None
        self.why = ""  # "" where compiled, or where no compiled step applies

    @property
    def compiled(self) -> bool:
        return self.model is not self.eager

    def compile(self, start: Callable[[], CompiledTwin]) -> None:
        """Start compiling (``start``), unless compiled or compiling already, or found slower (or
        failed) here before."""
        kept = self.decisions.recall(COMPILED)
        if kept.get("compiled") == 0.0:
            self.why = SLOWER if "eager_ms" in kept else FAILED
            return
        if not self.compiled and self.twin is None:
            self.twin = start()
            self.why = COMPILING

    def stop(self) -> None:
        """Let the compile go (the model closes)."""
        if self.twin is not None:
            self.twin.stop()
            self.twin = None

    @torch.inference_mode()
    def settle(self, threads: int | None = None) -> None:
        """Once the compile has ended: time a one-row step both ways here (the worker's thread,
        with ``threads`` as the reply will use), and step with the compiled code from now on if
        it is faster. Called at a reply's start; nothing happens while it compiles."""
        twin = self.twin
        switched = take_compiled(self, self.eager)
        if switched is None:
            if twin is not None and twin.error is not None:  # ended without code: not again
                self.decisions.give_up(COMPILED, twin.error)
                self.why = FAILED if twin.error != "stopped" else STOPPED
            return

        def measure() -> dict[str, float]:
            eager = timed_ms(self.eager, self.new_cache, 1)
            compiled = timed_ms(switched, self.new_cache, 1)
            logger.info("a one-row step: %.2f ms eager, %.2f ms compiled", eager, compiled)
            return {"compiled": float(compiled < eager), "eager_ms": eager, "compiled_ms": compiled}

        with torch_threads(threads):  # kept per thread count, as the reply will run
            kept, _ = self.decisions.remember(COMPILED, measure)
        if kept.get("compiled") == 1.0:
            self.model, self.why = switched, ""
        else:
            self.why = SLOWER
