"""Streamed chunks of an OpenAI-compatible server turned into TokenEvents (Qt-free, network-free).

A chunk carries a text delta and, where the server gives them, per-token log-probabilities
(``logprobs``) and token ids (vLLM's ``return_token_ids``). One chunk may hold several tokens,
or (a server whose detokenizer waited for a whole character) none. The text delta is what the
reply reads; per-token pieces only say how to split it between the chunk's tokens.

A server that streams each token's text on its own writes U+FFFD for a token that ends inside a
multi-byte UTF-8 character. As the local detokenizer does, a trailing U+FFFD is held back until
the next text shows whether it was completed (the server then sends the whole character) or was
really an invalid byte (it is kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from desktop.engine.messages import TEXT, Alternative, TokenEvent
from desktop.engine.remote.http import RemoteError, one_line

REPLACEMENT = "\ufffd"
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


@dataclass
class ChunkReader:
    """Reads one reply's chunks. ``chat``: chat-completion chunks (``delta.content``), else
    completion chunks (``text``). ``top``: alternatives asked for per token."""

    chat: bool
    top: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] | None = None
    tokens: int = 0  # token events emitted
    saw_ids: bool = False
    saw_logprobs: bool = False
    _hold: Utf8Holdback = field(default_factory=Utf8Holdback)

    def read(self, payload: dict[str, Any]) -> list[TokenEvent]:
        """The events of one chunk; RemoteError for an error the server streamed."""
        if "error" in payload and not payload.get("choices"):
            err = payload["error"]
            message = err.get("message") if isinstance(err, dict) else err
            raise RemoteError(f"the server failed mid-reply: {one_line(str(message))}")
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        if isinstance(payload.get("prompt_token_ids"), list):
            self.prompt_ids = [int(i) for i in payload["prompt_token_ids"]]
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return []
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        if isinstance(choice.get("prompt_token_ids"), list):
            self.prompt_ids = [int(i) for i in choice["prompt_token_ids"]]
        if self.chat:
            delta = choice.get("delta") or choice.get("message") or {}
            raw = delta.get("content") if isinstance(delta, dict) else None
        else:
            raw = choice.get("text")
        text = self._hold.push(raw if isinstance(raw, str) else "")
        tokens = self._tokens(choice)
        if not tokens:
            if not text:
                return []
            tokens = [_Token(-1, None)]
        return self._events(tokens, text)

    def finish(self) -> list[TokenEvent]:
        """What the end of the reply releases: held-back text, and the end-of-turn token of a
        server that gives no ids (so a reply reads the same token by token as a local one)."""
        events = []
        tail = self._hold.flush()
        if tail:
            events.append(TokenEvent(-1, tail, False, TEXT, continues=self.tokens > 0))
            self.tokens = max(self.tokens, 1)
        if self.finish_reason == "stop" and not self.saw_ids:
            events.append(TokenEvent(-1, "", False, TEXT, STOP_LABEL))
            self.tokens += 1
        return events

    def _tokens(self, choice: dict[str, Any]) -> list[_Token]:
        ids = choice.get("token_ids")
        ids = [int(i) for i in ids] if isinstance(ids, list) else []
        lps = _logprob_entries(choice.get("logprobs"), self.chat)
        if ids:
            self.saw_ids = True
        if lps:
            self.saw_logprobs = True
        count = max(len(ids), len(lps))
        tokens = []
        for i in range(count):
            tid = ids[i] if i < len(ids) else -1
            if i < len(lps):
                piece, logprob, top = lps[i]
                tokens.append(_Token(tid, piece, logprob, top))
            else:
                tokens.append(_Token(tid, None))
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
            events.append(TokenEvent(tok.id, piece, False, TEXT, logprob=tok.logprob, top=tok.top))
            self.tokens += 1
        return events


def _logprob_entries(lp: Any, chat: bool) -> list[tuple[str, float, tuple[Alternative, ...] | None]]:
    """(piece, log-probability, alternatives) per token, from the chat form (``content`` entries)
    or the completion form (``tokens`` / ``token_logprobs`` / ``top_logprobs``)."""
    if not isinstance(lp, dict):
        return []
    out: list[tuple[str, float, tuple[Alternative, ...] | None]] = []
    content = lp.get("content")
    if isinstance(content, list):
        for entry in content:
            if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), (int, float)):
                continue
            alts = entry.get("top_logprobs")
            top = None
            if isinstance(alts, list):
                top = tuple(
                    (-1, str(a.get("token", "")), float(a["logprob"]))
                    for a in alts
                    if isinstance(a, dict) and isinstance(a.get("logprob"), (int, float))
                )
            out.append((str(entry.get("token", "")), float(entry["logprob"]), top))
        return out
    tokens, chosen, tops = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
    if isinstance(tokens, list) and isinstance(chosen, list):
        for i, (piece, value) in enumerate(zip(tokens, chosen, strict=False)):
            if not isinstance(value, (int, float)):
                continue
            alt = tops[i] if isinstance(tops, list) and i < len(tops) and isinstance(tops[i], dict) else None
            top = (
                tuple(sorted(((-1, str(k), float(v)) for k, v in alt.items()), key=lambda a: -a[2]))
                if alt
                else None
            )
            out.append((str(piece), float(value), top))
    return out
