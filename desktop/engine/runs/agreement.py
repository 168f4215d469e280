"""How much two checkpoints agree: the acceptance rate of one drafting for the other.

Checkpoint A drafts for checkpoint B greedily with a fixed draft length over a few prompts; a
proposal is kept exactly when it is B's own most likely next token after B's own reply so far,
so the rate is the share of positions where A, continuing B's text, would say what B says.
Unlike comparing two free-running replies, one early difference does not spoil the rest. It is
the figure speculative decoding lives on (engine/decode/speculative.py), so a high agreement
also says A is a good draft for B. Compare's agreement matrix is drawn from it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from desktop.engine.backend import Backend, GenerationStats, Prompt, StreamOptions
from desktop.engine.params import SamplingParams

# Tokens proposed per round: long enough that rounds rarely end early, short enough that a
# disagreement wastes little.
DRAFT_K = 4


@dataclass(frozen=True)
class Agreement:
    """Over all prompts: tokens the draft proposed, those the target kept, tokens decoded."""

    drafted: int
    accepted: int
    tokens: int

    @property
    def rate(self) -> float | None:
        """The share of proposals kept (None when nothing was proposed)."""
        return self.accepted / self.drafted if self.drafted else None


def agreement(
    target: Backend,
    draft: str,
    prompts: Sequence[Prompt],
    *,
    max_tokens: int = 64,
    cancel: threading.Event | None = None,
) -> Agreement:
    """How often ``draft`` (a draft name, e.g. ``"/runs/d12@300"``: engine/decode/drafts.py)
    proposes what ``target`` decodes greedily, over ``prompts`` (the target's own). Problems with
    the draft (a missing checkpoint, another tokenizer) are one line, as when chatting."""
    cancel = cancel or threading.Event()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    options = StreamOptions(draft=draft, draft_k=DRAFT_K)
    drafted = accepted = tokens = 0
    for prompt in prompts:
        if cancel.is_set():
            break
        stats = GenerationStats()
        for _event in target.stream(prompt, params, cancel, options, stats):
            pass
        drafted, accepted, tokens = (
            drafted + stats.drafted,
            accepted + stats.accepted,
            tokens + stats.new_tokens,
        )
    return Agreement(drafted, accepted, tokens)
