"""Conversation data types shared by the engine, the store and the UI (Qt-free, torch-free).

A message is a list of parts so that tool calls survive a round trip through rendering,
storage and display: nanochat's assistant turns interleave text with
``<|python_start|>expr<|python_end|>`` calls and their forced ``<|output_start|>…`` results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant"]

# Part kinds. The first three are nanochat's; the rest appear with the fork's C++ tokenizer.
TEXT = "text"
PYTHON = "python"  # calculator expression between <|python_start|> and <|python_end|>
PYTHON_OUTPUT = "python_output"  # forced result between <|output_start|> and <|output_end|>
TOOL_QUERY = "tool_query"  # fork: <QUERY_TOOL> call <CODE_END> (shown, never executed)
TOOL_RESULT = "tool_result"  # fork: <TOOL_RESULT> result <CODE_END>
THOUGHT = "thought"  # fork: <THOUGHT_START> … <THOUGHT_END>
PART_KINDS = (TEXT, PYTHON, PYTHON_OUTPUT, TOOL_QUERY, TOOL_RESULT, THOUGHT)


@dataclass
class Part:
    kind: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Part:
        return cls(kind=str(d["kind"]), text=str(d["text"]))


BLOCK_KINDS = (PYTHON, PYTHON_OUTPUT, TOOL_QUERY, TOOL_RESULT, THOUGHT)
# The special tokens that open a part (by name, nanochat's and the fork's) and the part they open,
# and those that close one: how a reply's tokens become its parts, locally by id
# (decode/generation.py) and from a server by the names it writes (remote/events.py).
OPENING_SPECIALS = {
    "<|python_start|>": PYTHON,
    "<|output_start|>": PYTHON_OUTPUT,
    "<QUERY_TOOL>": TOOL_QUERY,
    "<TOOL_RESULT>": TOOL_RESULT,
    "<THOUGHT_START>": THOUGHT,
}
CLOSING_SPECIALS = ("<|python_end|>", "<|output_end|>", "<CODE_END>", "<THOUGHT_END>")
# Why a token the calculator forced cannot be forked (Chat, Compare and the token popup say it).
FORCED_FORK = (
    "the calculator forced this token: it is the tool's result, not a choice; fork inside the expression"
)
# What speculative decoding made of a token (TokenEvent.draft); "" is a token decoded without a draft.
DRAFT_MARKS = ("accepted", "corrected")
# One alternative in a token's top list: (token id, how it reads, log-probability).
Alternative = tuple[int, str, float]


@dataclass(frozen=True)
class TokenEvent:
    """One generated token as a backend streams it.

    ``text`` is the clean text delta this token adds to the reply (it may be empty while a
    multi-byte character is incomplete, and is empty for special tokens). ``kind`` says which
    part the token belongs to, so views can draw tool calls without re-parsing. ``id`` is -1
    where a backend gives no ids. ``continues`` marks text that belongs to the token before it
    (a decoder's held-back tail), not a token of its own. ``logprob`` and ``top`` are present
    when the request asked for them. ``given`` marks a token the user chose or wrote (a fork's
    alternative, a prefill), not one the model sampled. ``draft`` says what speculative decoding
    made of it: "accepted" (the draft proposed it and the target kept it), "corrected" (the
    target's own token where it rejected the draft), or "" (decoded without a draft).
    """

    id: int
    text: str
    forced: bool
    kind: str
    special: str | None = None  # the special token's name, e.g. "<|python_start|>"
    logprob: float | None = None
    top: tuple[Alternative, ...] | None = None
    continues: bool = False
    given: bool = False
    draft: str = ""


def _alternative(entry: Sequence[Any]) -> Alternative:
    """One top-list entry as (id, label, log-probability), whatever sequence it came as."""
    token_id, label, logprob = entry
    return int(token_id), str(label), float(logprob)


@dataclass
class TokenTrace:
    """A reply token by token: what each token was, the text it added, and how likely it was.

    This is the one encoding of tokens, in memory and in the history database (as the ``tokens``
    entry of a message's meta, column by column), for chats and comparisons alike.
    """

    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    specials: list[str | None] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    # Per token: (log-probability, top alternatives), or None where it was not computed.
    logprobs: list[tuple[float, list[Alternative]] | None] = field(default_factory=list)
    given: list[bool] = field(default_factory=list)  # chosen or written by the user
    drafts: list[str] = field(default_factory=list)  # "accepted" | "corrected" | ""

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, ev: TokenEvent) -> int:
        """Record one event; the index of the token its text belongs to (-1 before any token)."""
        if ev.continues:
            if self.ids:
                self.texts[-1] += ev.text
            return len(self.ids) - 1
        self.ids.append(ev.id)
        self.texts.append(ev.text)
        self.kinds.append(ev.kind)
        self.specials.append(ev.special)
        self.forced.append(ev.forced)
        self.given.append(ev.given)
        self.drafts.append(ev.draft)
        top = [_alternative(a) for a in ev.top or ()]
        self.logprobs.append((ev.logprob, top) if ev.logprob is not None else None)
        return len(self.ids) - 1

    @property
    def has_logprobs(self) -> bool:
        return bool(self.ids) and all(lp is not None for lp in self.logprobs)

    @property
    def has_ids(self) -> bool:
        """Whether the backend gave token ids (a served model may give text only)."""
        return bool(self.ids) and all(i >= 0 for i in self.ids)

    def events(self, stop: int) -> list[TokenEvent]:
        """Tokens ``0 .. stop-1`` as the events that recorded them (a fork copies the reply up to
        its fork point this way, through the same rule that built it)."""
        out = []
        for i in range(min(stop, len(self.ids))):
            lp = self.logprobs[i]
            out.append(
                TokenEvent(
                    self.ids[i],
                    self.texts[i],
                    self.forced[i],
                    self.kinds[i],
                    self.specials[i],
                    None if lp is None else lp[0],
                    None if lp is None else tuple(lp[1]),
                    given=self.given[i],
                    draft=self.drafts[i],
                )
            )
        return out

    def set_logprobs(self, chosen: list[float], top: list[list[Alternative]]) -> None:
        """Fill in probabilities computed after the reply (teacher-forced scoring)."""
        self.logprobs = [(c, list(t)) for c, t in zip(chosen, top, strict=True)]

    def labels(self) -> list[str]:
        """How each token reads on its own: a special token by name, else the text it added."""
        return [s or t for s, t in zip(self.specials, self.texts, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "ids": list(self.ids),
            "texts": list(self.texts),
            "kinds": list(self.kinds),
            "specials": list(self.specials),
            "forced": [int(f) for f in self.forced],
        }
        if any(self.given):
            d["given"] = [int(g) for g in self.given]
        if any(self.drafts):
            d["drafts"] = list(self.drafts)
        if any(lp is not None for lp in self.logprobs):
            d["logprobs"] = [None if lp is None else lp[0] for lp in self.logprobs]
            d["top"] = [None if lp is None else [list(a) for a in lp[1]] for lp in self.logprobs]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TokenTrace:
        """The reverse of ``to_dict``; a column of the wrong length is padded, never trusted."""
        ids = [int(i) for i in d.get("ids") or []]
        n = len(ids)

        def column(name: str, fill: Any) -> list:
            values = list(d.get(name) or [])
            return (values + [fill] * n)[:n]

        chosen, top = column("logprobs", None), column("top", None)
        return cls(
            ids=ids,
            texts=[str(t) for t in column("texts", "")],
            kinds=[str(k) for k in column("kinds", TEXT)],
            specials=[None if s is None else str(s) for s in column("specials", None)],
            forced=[bool(f) for f in column("forced", False)],
            given=[bool(g) for g in column("given", False)],
            drafts=[d if d in DRAFT_MARKS else "" for d in column("drafts", "")],
            logprobs=[
                None if c is None else (float(c), [_alternative(a) for a in t or ()])
                for c, t in zip(chosen, top, strict=True)
            ],
        )


@dataclass
class Message:
    """A chat message. An assistant reply also keeps its :class:`TokenTrace`; ``add_event`` is
    the one rule that turns streamed token events into message parts."""

    role: Role
    parts: list[Part] = field(default_factory=list)
    # Free-form metadata stored with the message (sampling values, checkpoint, stats...).
    meta: dict[str, Any] = field(default_factory=dict)
    tokens: TokenTrace = field(default_factory=TokenTrace)

    @classmethod
    def of_text(cls, role: Role, text: str) -> Message:
        return cls(role=role, parts=[Part(TEXT, text)])

    def plain_text(self) -> str:
        """The text parts joined; tool parts are left out."""
        return "".join(p.text for p in self.parts if p.kind == TEXT)

    def append(self, kind: str, text: str) -> None:
        """Append streamed text, extending the last part when it is of the same kind."""
        if self.parts and self.parts[-1].kind == kind:
            self.parts[-1].text += text
        else:
            self.parts.append(Part(kind, text))

    def add_event(self, ev: TokenEvent) -> int:
        """Add one streamed token: its text to the right part, the token to the trace.

        Special tokens of plain text (end of turn) add no text; a tool or thought block gets
        its part as soon as it opens, so a view can show the block before its first character.
        Returns the index of the token the event's text belongs to.
        """
        if ev.text and (ev.special is None or ev.kind != TEXT):
            self.append(ev.kind, ev.text)
        elif ev.special is not None and ev.kind in BLOCK_KINDS:
            self.append(ev.kind, "")
        return self.tokens.add(ev)

    def copy_text(self) -> Message:
        """Role and parts only (what a prompt needs), detached from this message."""
        return Message(self.role, [Part(p.kind, p.text) for p in self.parts])

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "parts": [p.to_dict() for p in self.parts], "meta": self.stored_meta()}

    def stored_meta(self) -> dict[str, Any]:
        """The meta as stored: the token trace rides along under ``tokens``."""
        meta = dict(self.meta)
        if self.tokens.ids:
            meta["tokens"] = self.tokens.to_dict()
        return meta

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls.restore(d["role"], [Part.from_dict(p) for p in d.get("parts", [])], d.get("meta", {}))

    @classmethod
    def restore(cls, role: Role, parts: list[Part], meta: dict[str, Any]) -> Message:
        """A message from its stored columns; the trace comes out of ``meta``."""
        meta = dict(meta)
        trace = meta.pop("tokens", None)
        tokens = TokenTrace.from_dict(trace) if isinstance(trace, dict) else TokenTrace()
        return cls(role=role, parts=parts, meta=meta, tokens=tokens)
