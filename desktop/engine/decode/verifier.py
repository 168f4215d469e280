"""What computes the target's passes in speculative rounds: the target itself, or its compiled twin.

A verifying pass owes the target its distribution, not nanochat's bits (a pass over a few rows
already sums in another order than one-row steps; :func:`~desktop.engine.kernels.gemv.few_rows`).
On a small model, where a pass is per-operation dispatch, the twin's compiled code
(:mod:`.compiled_draft`) takes a pass over five rows in about half the eager time. It is compiled
in the background once a reply drafts, adopted at a reply's start if it is faster here, and from
then on the draft lengths are chosen with its measured costs.

Whether it is faster here, and its costs, are decided once per model and machine and kept
(:class:`~.pass_timing.Decisions`): the draft lengths, hence a seed's ids, depend on the costs.
In a later session the kept decision holds from the first reply: a twin found slower is not
compiled again, and a twin found faster lends its costs to the rounds before its compile ends
(the eager passes meanwhile compute the same logits within float rounding, which flips a draw
only when its uniform falls within that rounding of a boundary).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from desktop.engine.decode.compiled_draft import CompiledTwin, take_compiled
from desktop.engine.decode.pass_timing import TIMED_ROWS, Decisions, rounded_cost, timed_ms
from desktop.engine.decode.protocols import DecodingModel
from desktop.engine.kernels.threads import torch_threads

logger = logging.getLogger(__name__)
# The kept decision (Decisions): whether the compiled twin verifies, and its costs.
COMPILED = "verifier compiled"


class Verifier:
    """The target's passes in speculative rounds: ``model`` is ``eager`` (the target) until a
    compiled twin is adopted. ``base``: a one-row pass as a share of the target's own step (1 for
    the target itself); ``verify_cost``: each row a pass has beyond the first, likewise (None:
    the draft's measure of the target's, :func:`~.speculative.measure_costs`)."""

    def __init__(
        self, eager: DecodingModel, new_cache: Callable[[int], Any], decisions: Decisions | None = None
    ) -> None:
        self.eager = eager
        self.model: DecodingModel = eager
        self.new_cache = new_cache
        self.twin: CompiledTwin | None = None
        self.base = 1.0
        self.verify_cost: float | None = None
        self.decisions = decisions if decisions is not None else Decisions(None, "")
        self.renewed = False  # its decision was made anew over an earlier one, not yet reported

    @property
    def compiled(self) -> bool:
        """Whether passes run the compiled twin (:meth:`settle` adopted it)."""
        return self.model is not self.eager

    def compile(self, start: Callable[[], CompiledTwin]) -> None:
        """Start compiling (``start``), unless compiled already or compiling, or the twin was found
        slower here before. One found faster lends its kept costs from now on."""
        kept = self.decisions.recall(COMPILED)
        if kept.get("compiled") == 0.0:
            return
        if kept:
            self._adopt_costs(kept)
        if not self.compiled and self.twin is None:
            self.twin = start()

    def _adopt_costs(self, kept: dict[str, float]) -> None:
        self.base = kept.get("base", 1.0)
        self.verify_cost = kept.get("verify_cost")

    def stop(self) -> None:
        """Let the compile go (the model closes): one under way ends (a later session may try it
        again: only a failed or slower compile is kept as not worth it). Plain replies meanwhile
        need not stop it: it waits while a reply streams (:mod:`desktop.engine.foreground`), and
        the next speculative reply takes it."""
        if self.twin is not None:
            self.twin.stop()
            self.twin = None

    @torch.inference_mode()
    def settle(self, threads: int | None = None) -> None:
        """Once the compile has ended: time the target's step and passes over :data:`TIMED_ROWS`
        rows both ways here (the worker's thread, with ``threads`` as the reply will use), and run
        passes with the compiled twin from now on if its wide pass is faster. Called at a reply's
        start; nothing happens while it compiles."""
        twin = self.twin
        switched = take_compiled(self, self.eager)
        if switched is None:
            if twin is not None and twin.error is not None:  # ended without code: not again
                self.decisions.give_up(COMPILED, twin.error)
            return

        def measure() -> dict[str, float]:
            with torch_threads(threads):
                step = timed_ms(self.eager, self.new_cache, 1)
                eager_wide = timed_ms(self.eager, self.new_cache, TIMED_ROWS)
                one = timed_ms(switched, self.new_cache, 1)
                wide = timed_ms(switched, self.new_cache, TIMED_ROWS)
            logger.info(
                "verifying %d rows: %.2f ms eager, %.2f ms compiled (one row %.2f ms; a plain step %.2f ms)",
                TIMED_ROWS,
                eager_wide,
                wide,
                one,
                step,
            )
            if wide >= eager_wide:
                return {"compiled": 0.0}
            verify_cost = rounded_cost((wide - one) / step / (TIMED_ROWS - 1))
            return {"compiled": 1.0, "base": rounded_cost(one / step), "verify_cost": verify_cost}

        with torch_threads(threads):  # kept per thread count, as the reply will run
            kept, renewed = self.decisions.remember(COMPILED, measure)
        self.renewed |= renewed
        if kept.get("compiled") == 1.0:
            self.model = switched
            self._adopt_costs(kept)

    def costs(self, verify_cost: float) -> tuple[float, float]:
        """(base, cost per extra row) of its passes; ``verify_cost``: the draft's measure of the
        target's, which holds while the target itself verifies."""
        return self.base, verify_cost if self.verify_cost is None else self.verify_cost
