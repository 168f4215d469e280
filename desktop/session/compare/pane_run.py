"""One pane's reply to the current prompt, with what produced it (no Qt)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from desktop import __version__
from desktop.engine.backend import REPLY_META, ReplyStart
from desktop.engine.messages import FORCED_FORK, Message, TokenEvent, TokenTrace
from desktop.engine.params import SamplingParams


@dataclass(frozen=True)
class Fork:
    """A Chat reply's fork, raced on the panes: how every reply begins, the events of what the
    reply had said before the fork point, and the tokenizer those ids belong to."""

    start: ReplyStart
    said: tuple[TokenEvent, ...]
    tokenizer: str


def fork_of(trace: TokenTrace, position: int, token_id: int, text: str, tokenizer: str) -> Fork | str:
    """The fork of a reply (its ``trace``) at token ``position``: what it said up to there,
    then an alternative's ``token_id`` (with its ``text``, which a served model takes) or the
    ``text`` the user wrote (``token_id`` -1). Else why not: FORCED_FORK, or "" for a request
    that makes no sense (nothing to fork, nothing given)."""
    if not len(trace) or not 0 <= position <= len(trace) or (token_id < 0 and not text):
        return ""
    if position < len(trace) and trace.forced[position]:
        return FORCED_FORK
    start = ReplyStart(
        said_ids=tuple(trace.ids[:position]) if trace.has_ids else (),
        said_text="".join(trace.texts[:position]),
        given_ids=(token_id,) if token_id >= 0 else (),
        given_text=text,
    )
    return Fork(start, tuple(trace.events(position)), tokenizer)


@dataclass
class PaneRun:
    """The reply (a Message with its token trace), the model and sampling that wrote it, and
    what was measured about it."""

    params: SamplingParams | None = None
    model: dict[str, Any] = field(default_factory=dict)  # ModelInfo.reply_meta() of the writer
    overrides: dict[str, Any] = field(default_factory=dict)  # the pane's own sampling values
    reply: Message = field(default_factory=lambda: Message("assistant"))
    stats: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)  # Prompt.usage()
    prompt_ids: tuple[int, ...] | None = None  # the exact ids the pane's model was fed (local models)
    cross_scores: dict[str, dict] = field(default_factory=dict)  # scoring pane letter -> score
    error: str | None = None
    running: bool = False

    @property
    def trace(self) -> TokenTrace:
        return self.reply.tokens

    @property
    def tokens(self) -> list[Any]:
        """What divergence and diffs compare: token ids, or token texts where the backend gave
        no ids (a served model without ids)."""
        trace = self.reply.tokens
        return trace.ids if trace.has_ids or not trace.ids else trace.texts

    @property
    def has_reply(self) -> bool:
        return bool(self.trace.ids) or self.error is not None

    def add(self, ev: TokenEvent) -> int:
        """Record one streamed event; the index of the token its text belongs to."""
        return self.reply.add_event(ev)

    def to_message(self, letter: str) -> Message:
        """The reply as stored in history: everything needed to show it again."""
        meta: dict[str, Any] = {
            "pane": letter,
            **self.model,
            "sampling": self.params.to_dict() if self.params else {},
            "overrides": dict(self.overrides),
            "stats": dict(self.stats),
            "app_version": __version__,
        }
        if self.cross_scores:
            meta["cross_scores"] = copy.deepcopy(self.cross_scores)
        if self.error:
            meta["error"] = self.error
        reply = copy.deepcopy(self.reply)
        reply.meta = meta
        return reply

    @classmethod
    def from_message(cls, message: Message) -> PaneRun:
        """The reverse of ``to_message`` for a saved reply."""
        m = message.meta
        try:
            params = SamplingParams.from_dict(
                {k: v for k, v in (m.get("sampling") or {}).items() if v is not None}
            )
        except (ValueError, TypeError):
            params = None
        return cls(
            params=params,
            model={k: m.get(k) for k in REPLY_META},
            overrides=dict(m.get("overrides") or {}),
            reply=Message("assistant", copy.deepcopy(message.parts), {}, copy.deepcopy(message.tokens)),
            stats=dict(m.get("stats") or {}),
            cross_scores=dict(m.get("cross_scores") or {}),
            error=m.get("error"),
        )
