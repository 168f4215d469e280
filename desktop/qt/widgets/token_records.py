"""The tokens of a reply as the token views show them (Qt-free): one record per token, its label,
and the glyph that marks where a fork took the user's token."""

from __future__ import annotations

import math
from dataclasses import dataclass

from desktop.engine.messages import TokenEvent, TokenTrace

FORK_GLYPH = "↳"  # where a forked reply took the user's token (in every common UI font)


@dataclass
class TokenRecord:
    """What the view knows about one token."""

    text: str
    special: str | None = None
    kind: str = "text"
    forced: bool = False
    logprobs: tuple[float, list] | None = None  # (chosen logprob, [[id, label, logprob], ...])
    given: bool = False  # the user's choice at a fork (or a prefill), not the model's
    draft: str = ""  # speculative decoding: "accepted" | "corrected" | ""

    @property
    def probability(self) -> float | None:
        return math.exp(self.logprobs[0]) if self.logprobs is not None else None


def record_of(ev: TokenEvent) -> TokenRecord:
    """How the view shows one streamed (or recorded) token."""
    logprobs = (ev.logprob, list(ev.top or ())) if ev.logprob is not None else None
    return TokenRecord(ev.text, ev.special, ev.kind, ev.forced, logprobs, ev.given, ev.draft)


def records_of(trace: TokenTrace) -> list[TokenRecord]:
    """A whole reply's tokens as the view shows them."""
    return [record_of(ev) for ev in trace.events(len(trace))]


def visible_text(text: str) -> str:
    """Whitespace drawn as symbols, for tooltips where a bare space would read as nothing."""
    return text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") or "∅"


def special_label(name: str) -> str:
    """A special token's label, "<|python_start|>" → "‹python_start›", never broken across lines."""
    return "‹" + name.strip("<>|").replace("_", "_\u2060") + "›"


def token_label(record: TokenRecord) -> str:
    """How a token reads on its own: a special token by name, else its text made visible."""
    return special_label(record.special) if record.special else visible_text(record.text)
