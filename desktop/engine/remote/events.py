"""Streamed chunks of an OpenAI-compatible server turned into TokenEvents (Qt-free, network-free).

A chunk carries a text delta and, where the server gives them, per-token log-probabilities
(``logprobs``) and token ids (vLLM's ``return_token_ids``). One chunk may hold several tokens,
or (a server whose detokenizer waited for a whole character) none. The text delta is what the
reply reads; per-token pieces only say how to split it between the chunk's tokens.

A server that streams each token's text on its own writes U+FFFD for a token that ends inside a
multi-byte UTF-8 character. As the local detokenizer does, a trailing U+FFFD is held back until
the next text shows whether it was completed (the server then sends the whole character) or was
really an invalid byte (it is kept).

A server whose detokenizer holds back an unfinished character itself (``transformers serve``'s
``DecodeStream``, vLLM's) never sends it when the reply ends inside one: the reply would end
short of the tokenizer's own decode of the same ids. Where the server gives each token's bytes
(the chat ``logprobs`` entries' ``bytes``), the end of the reply is decoded from them, as the
tokenizer decodes (each invalid sequence one U+FFFD).

A field that does not hold what its name says (token ids as text or ``Infinity``, a
log-probability that is text, not finite, or an integer too large for a float, a token count past
any real one) is ignored, as if the server had not sent it: the reply's text still reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from desktop.engine.messages import CLOSING_SPECIALS, OPENING_SPECIALS, TEXT, Alternative, TokenEvent
from desktop.engine.remote.http import MESSAGE_CHARS, RemoteError
from desktop.engine.text_lines import one_line

REPLACEMENT = "\ufffd"
# Above any vocabulary, and any prompt or reply length, a server really has.
MAX_COUNT = 2**31 - 1
STOP_LABEL = "<|end|>"  # the end-of-turn token of a server that reports it by finish_reason only


class Utf8Holdback:
    """Holds back a trailing run of U+FFFD until the next text decides what it was."""

    def __init__(self) -> None:
        self.held = ""

    def push(self, text: str) -> str:
        if not text:
            return ""
        if self.held:
            # A non-ASCII character after the held U+FFFD is the server re-sending the completed
            # character; ASCII or another U+FFFD means the held bytes really were invalid.
            completed = text[0] != REPLACEMENT and not text[0].isascii()
            text = text if completed else self.held + text
            self.held = ""
        body = text.rstrip(REPLACEMENT)
        self.held = text[len(body) :]
        return body

    def flush(self) -> str:
        text, self.held = self.held, ""
        return text


@dataclass
class _Token:
    id: int
    piece: str | None  # the server's text for this token alone, where it gave one
    logprob: float | None = None
    top: tuple[Alternative, ...] | None = None
    raw: bytes | None = None  # the token's bytes, where the server gave them
    forced: bool = False  # the tool forced it (``nanoscope serve``'s ``forced``, beside the ids)


@dataclass
class ChunkReader:
    """Reads one reply's chunks. ``chat``: chat-completion chunks (``delta.content``), else
    completion chunks (``text``). ``top``: alternatives asked for per token."""

    chat: bool
    top: int = 0
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)  # its token counts
    tokens: int = 0  # token events emitted
    saw_ids: bool = False
    saw_logprobs: bool = False
    _hold: Utf8Holdback = field(default_factory=Utf8Holdback)
    _texts: list[str] = field(default_factory=list)  # the text released so far
    _bytes: bytearray = field(default_factory=bytearray)  # every token's bytes, while all are known
    _bytes_known: bool = True
    _last_token_bytes: int = 0
    _kind: str = TEXT  # the part the reply is in: a server that writes special tokens by name

    def read(self, payload: dict[str, Any]) -> list[TokenEvent]:
        """The events of one chunk; RemoteError for an error the server streamed."""
        if "error" in payload and not payload.get("choices"):
            err = payload["error"]
            message = err.get("message") if isinstance(err, dict) else err
            said = one_line(message, fold=True, limit=MESSAGE_CHARS)
            raise RemoteError(f"the server failed mid-reply: {said}")
        if isinstance(payload.get("usage"), dict):
            self.usage = {k: v for k, v in payload["usage"].items() if _count(v)}
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return []
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        if self.chat:
            delta = choice.get("delta") or choice.get("message") or {}
            raw = delta.get("content") if isinstance(delta, dict) else None
        else:
            raw = choice.get("text")
        text = self._hold.push(raw if isinstance(raw, str) else "")
        tokens = self._tokens(choice)
        for tok in tokens:
            if tok.raw is None:
                self._bytes_known = False
            elif self._bytes_known:
                self._bytes += tok.raw
                self._last_token_bytes = len(tok.raw)
        if not tokens:
            if not text:
                return []
            self._bytes_known = False  # text from no token the server described
            tokens = [_Token(-1, None)]
        return self._events(tokens, text)

    def finish(self) -> list[TokenEvent]:
        """What the end of the reply releases: held-back text, and the end-of-turn token of a
        server that gives no ids (so a reply reads the same token by token as a local one)."""
        events = []
        tail = self._unsent_end(self._hold.flush())
        if tail:
            events.append(TokenEvent(-1, tail, False, TEXT, continues=self.tokens > 0))
            self.tokens = max(self.tokens, 1)
        if self.finish_reason == "stop" and not self.saw_ids:
            events.append(TokenEvent(-1, "", False, TEXT, STOP_LABEL))
            self.tokens += 1
        return events

    def _unsent_end(self, held: str) -> str:
        """The reply's last characters: what was held back, or, where every token's bytes are
        known and the reply ends inside a character the server kept to itself, their decode."""
        if not (self._bytes_known and self._bytes):
            return held
        sent = "".join(self._texts)
        ends = [bytes(self._bytes)]
        if self.finish_reason == "stop":  # the stop token's own bytes are not reply text
            ends.append(ends[0][: -self._last_token_bytes or None])
        for end in ends:
            full = end.decode("utf-8", errors="replace")
            rest = full[len(sent) :] if full.startswith(sent) else ""
            # Only an unfinished character's end, never text the server chose not to send.
            if rest.endswith(REPLACEMENT) and rest.startswith(held) and len(rest) > len(held):
                return rest
        return held

    def _tokens(self, choice: dict[str, Any]) -> list[_Token]:
        ids = choice.get("token_ids")
        ids = ids if isinstance(ids, list) and all(map(_count, ids)) else []
        forced = choice.get("forced")
        forced = forced if isinstance(forced, list) and len(forced) == len(ids) else [False] * len(ids)
        lps = _logprob_entries(choice.get("logprobs"), self.chat)
        if ids:
            self.saw_ids = True
        if lps:
            self.saw_logprobs = True
        count = max(len(ids), len(lps))
        tokens = []
        for i in range(count):
            tid = ids[i] if i < len(ids) else -1
            was_forced = i < len(forced) and forced[i] is True
            if i < len(lps):
                tokens.append(_Token(tid, *lps[i], forced=was_forced))
            else:
                tokens.append(_Token(tid, None, forced=was_forced))
        return tokens

    def _events(self, tokens: list[_Token], text: str) -> list[TokenEvent]:
        """Split ``text`` between ``tokens``: by their own pieces where these spell it out, else
        as far as they match, the rest on the last token (the reply's text is never changed)."""
        texts = [""] * len(tokens)
        pieces = [t.piece for t in tokens]
        if all(p is not None for p in pieces) and "".join(pieces) == text:  # type: ignore[arg-type]
            texts = list(pieces)  # type: ignore[arg-type]
        else:
            rest = text
            for i, piece in enumerate(pieces):
                if piece and rest.startswith(piece):
                    texts[i], rest = piece, rest[len(piece) :]
            texts[-1] += rest
        events = []
        for tok, piece in zip(tokens, texts, strict=True):
            # Log-probabilities asked for only to learn the bytes are not shown.
            logprob, top = (tok.logprob, tok.top) if self.top else (None, None)
            events.append(self._event(tok, piece, logprob, top))
            self._texts.append(piece)
            self.tokens += 1
        return events

    def _event(self, tok: _Token, piece: str, logprob: float | None, top: Any) -> TokenEvent:
        """A token as Nanoscope's own: a special token the server wrote by name (its own piece, all
        of it) opens or closes a part, as the local tracker does by id."""
        special = (
            piece if (piece == tok.piece and piece in OPENING_SPECIALS) or piece in CLOSING_SPECIALS else None
        )
        if special is None:
            return TokenEvent(tok.id, piece, tok.forced, self._kind, logprob=logprob, top=top)
        kind = self._kind
        self._kind = OPENING_SPECIALS.get(special, TEXT)
        shown = self._kind if special in OPENING_SPECIALS else kind
        return TokenEvent(tok.id, "", tok.forced, shown, special, logprob=logprob, top=top)


Entry = tuple[str, float, tuple[Alternative, ...] | None, bytes | None]


def _count(value: Any) -> bool:
    """A token id or count: a JSON integer in [0, MAX_COUNT] (not text, a float or a bool)."""
    return type(value) is int and 0 <= value <= MAX_COUNT


def _logprob(value: Any) -> float | None:
    """A finite JSON number as a float; None for anything else (text, a bool, NaN, Infinity, an
    integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _token_bytes(value: Any) -> bytes | None:
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value)
    return None


def _alternatives(pairs: Iterable[tuple[Any, Any]]) -> tuple[Alternative, ...]:
    """(token, log-probability) pairs as alternatives; a pair without a usable one is left out."""
    out: list[Alternative] = []
    for token, value in pairs:
        logprob = _logprob(value)
        if logprob is not None:
            out.append((-1, "" if token is None else str(token), logprob))
    return tuple(out)


def _logprob_entries(lp: Any, chat: bool) -> list[Entry]:
    """(piece, log-probability, alternatives, bytes) per token, from the chat form (``content``
    entries, with their ``bytes``) or the completion form (``tokens`` / ``token_logprobs`` /
    ``top_logprobs``, which has no bytes)."""
    if not isinstance(lp, dict):
        return []
    out: list[Entry] = []
    content = lp.get("content")
    if isinstance(content, list):
        for entry in content:
            chosen = _logprob(entry.get("logprob")) if isinstance(entry, dict) else None
            if chosen is None:
                continue
            alts = entry.get("top_logprobs")
            alts = [a for a in alts if isinstance(a, dict)] if isinstance(alts, list) else None
            top = None if alts is None else _alternatives((a.get("token"), a.get("logprob")) for a in alts)
            raw = _token_bytes(entry.get("bytes"))
            out.append((str(entry.get("token", "")), chosen, top, raw))
        return out
    tokens, chosen, tops = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
    if isinstance(tokens, list) and isinstance(chosen, list):
        for i, (piece, value) in enumerate(zip(tokens, chosen, strict=False)):
            logprob = _logprob(value)
            if logprob is None:
                continue
            alt = tops[i] if isinstance(tops, list) and i < len(tops) and isinstance(tops[i], dict) else None
            top = tuple(sorted(_alternatives(alt.items()), key=lambda a: -a[2])) if alt else None
            out.append((str(piece), logprob, top, None))
    return out
