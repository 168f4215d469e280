"""The Inside view across steps (issue #45): one token position, each pane's own Inside there.

Qt-free: which panes were asked, what each answered, and the one line a pane without an Inside
view shows. Each pane looks at the same reply token index of ITS OWN reply (prompt then that
pane's reply ids), so the layer where the answer forms can be read step against step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from desktop.engine.messages import TokenTrace

ASKING = "Looking inside the model…"
SERVED = "a served model has no inside to show (its weights are on the server)"
NOT_LOADED = "the model that wrote this reply is not loaded: load it to look inside"
NO_REPLY = "no reply in this round"
STILL = "still replying: its Inside view comes when the reply ends"
NO_IDS = "this reply has no token ids: a served model has no inside to show"


def too_short(token: int, length: int) -> str:
    return f"its reply has no token {token + 1} (it is {length} tokens long)"


@dataclass
class InsideColumn:
    """One pane's column: its letter and step, then its numbers (``source`` a ReplyInside and
    ``position`` in it) or the one line saying why there are none."""

    letter: str
    step: int | None
    line: str = ""
    source: Any = None
    position: int = -1
    token_logprob: float | None = None  # what the pane's own trace kept for this token
    token_id: int = -1

    @property
    def heading(self) -> str:
        return f"{self.letter} · step {self.step:,}" if self.step is not None else self.letter

    @property
    def waiting(self) -> bool:
        return self.source is None and self.line == ASKING


@dataclass
class CompareInside:
    """The reply token index ``token`` looked at in every pane (its columns, pane order)."""

    token: int
    columns: list[InsideColumn] = field(default_factory=list)
    asked: dict[int, int] = field(default_factory=dict)  # pane column -> request id

    def column_for(self, trace: TokenTrace, letter: str, step: int | None) -> InsideColumn:
        """The pane's column before any pass: the token's id and logprob, or why there is none."""
        col = InsideColumn(letter, step)
        if not len(trace):
            col.line = NO_REPLY
        elif not trace.has_ids:
            col.line = NO_IDS
        elif self.token >= len(trace):
            col.line = too_short(self.token, len(trace))
        else:
            col.token_id = trace.ids[self.token]
            lp = trace.logprobs[self.token]
            col.token_logprob = None if lp is None else lp[0]
        self.columns.append(col)
        return col

    def ready(self, request: int, source: Any) -> int | None:
        """A pane's pass ended (``source``: a ReplyInside); the column it fills, if still asked."""
        for i, asked in list(self.asked.items()):
            if asked == request:
                del self.asked[i]
                col = self.columns[i]
                col.source = source
                col.position = source.position_of(self.token)
                col.line = "" if source.at(col.position) is not None else "no Inside at this position"
                return i
        return None

    def failed(self, request: int, reason: str) -> int | None:
        for i, asked in list(self.asked.items()):
            if asked == request:
                del self.asked[i]
                self.columns[i].line = reason
                return i
        return None

    @property
    def done(self) -> bool:
        return not self.asked
