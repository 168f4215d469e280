"""How long a model's pass takes here, as speculative decoding weighs its drafts and its verifier.

Measured, not derived from the bytes each pass streams: on a 2-core AMD EPYC an int8 copy of a
depth-12 model streams a quarter of the bytes and takes two thirds of the time (per-call
quantisation and Python overheads), and a pass over five rows is not one row's time.

What is decided from these times is kept (:class:`Decisions`, beside the kernel timings, under
the same keys: the machine, torch's version, the thread count; and the target model and its
draft), because it changes the ids a seed gives, not only their speed. Rejection sampling keeps
the target's distribution whatever ``k``, but the draws a seed's random stream makes depend on
how many tokens each round drafts (chosen from the measured costs, :class:`~.speculative.DraftLength`),
on which draft ``auto`` picks (by the same costs), and, within float rounding, on which pass
computed the logits (the compiled twins, :mod:`.verifier`, :meth:`~.speculative.Draft.settle`).
Measured afresh at each start, a machine's wobble changed a seed's reply from one session to the
next. So each is measured once per model and machine, and re-measured only when the user asks
(:func:`~desktop.engine.kernels.tuning.remeasure`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from desktop.engine.decode.compiled_draft import ROOM
from desktop.engine.decode.protocols import DecodingModel
from desktop.engine.decode.sampling import draw_token, next_token_probs
from desktop.engine.kernels.gemv import few_rows
from desktop.engine.kernels.tuning import KernelTuner
from desktop.engine.params import SamplingParams

logger = logging.getLogger(__name__)

# The rows of a timed verifying pass, and how many times each pass is timed.
TIMED_ROWS = 5
TIMINGS = 3
# Measured costs are rounded to this, so that a machine's wobble rarely changes how many tokens
# are drafted (and so a seed's reply).
COST_STEP = 0.05
# A compile's kept decision "not compiled" without a timing: it failed here (Decisions.give_up).
FAILED = 2.0


def timed_ms(model: DecodingModel, make_cache: Callable[[int], Any], rows: int) -> float:
    """The median time of ``model``'s pass over ``rows`` new rows after a short context (the
    logits of the last row, or of every row of a pass over several, as a verifying pass takes
    them), the rows' distributions and a draw included (what a step costs besides the model: on a
    tiny model that is a fair share). The first pass is not timed: one-row products choose their
    routes on it."""
    context = 16
    # Room past the pass, as a reply's cache has: a pass that fills a cache exactly is a case of
    # its own to compiled code (the inlined attention's keys are then the whole cache), which
    # runs it eagerly, so timing it there would time the eager fallback.
    cache = make_cache(context + rows + ROOM)
    model(torch.zeros(1, context, dtype=torch.long, device=model.device), cache, last_only=True)
    plain = SamplingParams()
    rng = torch.Generator(device=model.device)
    times = []
    for _ in range(TIMINGS + 1):
        # A new tensor each pass, as the decode loop makes (compiled code is guarded on it).
        ids = torch.zeros(1, rows, dtype=torch.long, device=model.device)
        start = time.perf_counter()
        with few_rows():
            logits = model(ids, cache, last_only=rows == 1)[0, -rows:]
        draw_token(next_token_probs(logits.float(), plain)[-1], rng)
        times.append(time.perf_counter() - start)
        cache.truncate(context)
    return sorted(times[1:])[TIMINGS // 2] * 1000


def rounded_cost(cost: float) -> float:
    """``cost`` (a share of one target step) to a multiple of :data:`COST_STEP`, at least one."""
    return max(COST_STEP, round(cost / COST_STEP) * COST_STEP)


class Decisions:
    """The timing-driven decisions of speculative decoding for one target (and draft) on this
    machine, kept by ``tuner`` (:meth:`~desktop.engine.kernels.tuning.KernelTuner.remember`) under
    ``key``, which names the model(s). Without a tuner, or with one that keeps no file (a one-shot
    use, a test), they are measured each time, as a draft is made."""

    def __init__(self, tuner: KernelTuner | None, key: str) -> None:
        self.tuner = tuner if tuner is not None and tuner.cache_file is not None else None
        self.key = key

    def under(self, more: str) -> Decisions:
        """The decisions of a part of these (a draft of this target)."""
        return Decisions(self.tuner, f"{self.key} · {more}")

    def remember(self, name: str, measure: Callable[[], dict[str, float]]) -> tuple[dict[str, float], bool]:
        """``name``'s values as kept, else ``measure()``'s, kept from now on; and whether they were
        chosen anew over an earlier choice (another machine, torch or thread count; a re-measure)."""
        if self.tuner is None:
            return measure(), False
        return self.tuner.remember(f"speculative {self.key} · {name}", measure)

    def give_up(self, name: str, why: str) -> None:
        """Keep that the compile ``name`` decides on failed here (``why``: the error), as a form
        found slower is kept: no later session starts it again, until the user asks to
        re-measure. A decision kept already (a form found faster) stays. A compile merely
        stopped (the app quit, the draft let go) is not kept: it has not been measured, and
        inductor's on-disk cache makes the next try shorter."""
        logger.info("%s: not compiled again on this machine (%s)", name, why)
        self.remember(name, lambda: {"compiled": 0.0, "ended": FAILED})

    def recall(self, name: str) -> dict[str, float]:
        """``name``'s values as kept ({} when not decided on this machine yet)."""
        return {} if self.tuner is None else self.tuner.recall(f"speculative {self.key} · {name}")
