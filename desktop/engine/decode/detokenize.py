"""Turn a stream of generated token ids into clean text deltas.

Decoding tokens one at a time is wrong twice over: a byte-level BPE token can end in the middle
of a multi-byte UTF-8 character, and the fork's C++ tokenizer decides spacing from neighbouring
tokens. So, like nanochat's old web UI, :class:`StreamDecoder` decodes the reply so far with
the tokenizer's own ``decode`` and emits only what lies beyond the text it already emitted,
holding back a trailing U+FFFD that the next token may still complete.

To keep each push O(1) instead of O(reply), only a tail window of ids is re-decoded. The window
is shortened only at a cut that provably leaves future text unchanged:

* tiktoken decoding is byte concatenation followed by UTF-8 decoding, so any cut works once the
  dropped text is a verified prefix of the window's text and at least ``CONTEXT`` tokens (≥ that
  many bytes, more than a UTF-8 character) remain for the decoder to resynchronise;
* for the C++ tokenizer the cut must also sit right after whitespace: a space is only ever
  inserted after the spacing rules reset their state, and newline tokens reset it too, so the
  window then spaces its tokens exactly as the full decode does.
"""

from __future__ import annotations

from collections.abc import Iterable

from desktop.engine.decode.protocols import Tokenizer

REPLACEMENT = "\ufffd"
CONTEXT = 16  # tokens kept in the window after a cut


class StreamDecoder:
    """Incremental decoder for one reply.

    ``prefix_ids`` are tokens that precede the reply (the end of the prompt). They are decoded
    for context only -- the C++ tokenizer needs the previous token to space the first reply
    token -- and never emitted.
    """

    def __init__(self, tok: Tokenizer, prefix_ids: Iterable[int] = ()) -> None:
        self._tok = tok
        self._concatenative = tok.kind == "tiktoken"
        self._window: list[int] = list(prefix_ids)[-CONTEXT:]
        text = tok.decode(self._window)
        # The window text already accounted for: emitted, or part of the prefix.
        self._done = text[:-1] if text.endswith(REPLACEMENT) else text

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it makes final (possibly "")."""
        self._window.append(token_id)
        text = self._tok.decode(self._window)
        delta = self._advance(text, hold_back=True)
        if len(self._window) >= 2 * CONTEXT:
            self._try_cut(text)
        return delta

    def flush(self) -> str:
        """Release whatever is still held back (call once the reply has ended)."""
        return self._advance(self._tok.decode(self._window), hold_back=False)

    def _advance(self, text: str, hold_back: bool) -> str:
        if not text.startswith(self._done):
            # The decode no longer extends what was emitted; never take text back, wait instead.
            return ""
        # With errors="replace", only the last U+FFFD can still turn into a real character:
        # an incomplete sequence at the end decodes to exactly one U+FFFD, earlier ones are final.
        end = len(text) - 1 if hold_back and text.endswith(REPLACEMENT) else len(text)
        if end <= len(self._done):
            return ""
        delta = text[len(self._done) : end]
        self._done = text[:end]
        return delta

    def _try_cut(self, text: str) -> None:
        """Drop old window tokens if a cut ``CONTEXT`` tokens from the end is safe (see module doc)."""
        if not text.startswith(self._done):
            return
        keep = self._window[-CONTEXT:]
        kept_text = self._tok.decode(keep)
        dropped = len(text) - len(kept_text)
        if dropped < 0 or not text.endswith(kept_text) or dropped > len(self._done):
            return
        if not self._concatenative and not (dropped > 0 and text[dropped - 1].isspace()):
            return
        self._window = keep
        self._done = self._done[dropped:]
