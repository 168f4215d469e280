"""A Hugging Face ``tokenizer.json`` behind the app's :class:`~desktop.engine.nanochat.tokenizer.Tokenizer`
interface, so generation's calculator state machine and the stream decoder work unchanged.

Three ways to encode, each matching what transformers does where it matters:

* :meth:`HFTokenizer.encode`: ordinary text (a calculator result, a user message cut to fit);
  special-token names written in the text stay text;
* :meth:`HFTokenizer.encode_rendered`: a rendered chat template, whose special-token names *are*
  the tokens (``apply_chat_template`` encodes with ``add_special_tokens=False``);
* :meth:`HFTokenizer.encode_completion`: plain text for completion, through the tokenizer's own
  post-processor (which adds BOS where the tokenizer says so), as ``tokenizer(text)`` does.

Special tokens are the added tokens marked special; :meth:`special_id` finds the nanochat tool
tokens (``<|python_start|>``...) by name, which is how the port's calculator keeps working.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as RustTokenizer

from desktop.engine.chat_template import SPECIAL_TOKEN_KEYS, ChatTemplate, template_source, token_text
from desktop.engine.files.tokenizer_checks import (
    checked_tokenizer_json,
    id_space,
    rust_errors,
    rust_tokenizer_digest,
    utf8_encodable,
)
from desktop.engine.hf.files import TOKENIZER_NAME

logger = logging.getLogger(__name__)


def _load(path: Path, text: str) -> RustTokenizer:
    """The library's tokenizer from text :func:`checked_tokenizer_json` passed."""
    with rust_errors(path, "loading"):
        tok = RustTokenizer.from_str(text)
        # Prompts are never cut or padded behind the user's back.
        tok.no_truncation()
        tok.no_padding()
    return tok


class HFTokenizer:
    """A ``tokenizers`` tokenizer with the model's end-of-sequence ids and its chat template."""

    kind = "hf"

    def __init__(
        self,
        directory: Path,
        tokenizer_config: dict[str, Any],
        eos_ids: Sequence[int],
        bos_id: int | None,
    ) -> None:
        self.path = directory / TOKENIZER_NAME
        # The same checks as every tokenizer: bounded JSON, normalizers, pre-tokenizers and
        # decoders that cannot blow up, sane lengths.
        text, self.warnings = checked_tokenizer_json(self.path)
        self._tok = _load(self.path, text)
        # The same tokenizer with special tokens split like text, for ordinary encoding.
        self._plain = _load(self.path, text)
        self._plain.encode_special_tokens = True
        added = self._tok.get_added_tokens_decoder()
        self._added = {t.content: i for i, t in added.items()}
        self._names = {i: t.content for i, t in added.items() if t.special}
        self.vocab_size = id_space(self._tok)
        tokens = {key: token_text(tokenizer_config.get(key)) for key in SPECIAL_TOKEN_KEYS}
        self.special_tokens = {k: v for k, v in tokens.items() if v is not None}
        bos_text = self.special_tokens.get("bos_token")
        found_bos = self._tok.token_to_id(bos_text) if bos_text else None
        self.bos_id = found_bos if found_bos is not None else (bos_id if bos_id is not None else -1)
        eos = list(eos_ids)
        if not eos and self.special_tokens.get("eos_token"):
            eos_id = self._tok.token_to_id(self.special_tokens["eos_token"])
            eos = [eos_id] if eos_id is not None else []
        if not eos:
            self.warnings.append(
                f"{directory}: no end-of-sequence token is configured; replies run to the token limit"
            )
        self.stop_ids = frozenset(eos)
        found = template_source(tokenizer_config, directory)
        self.template = ChatTemplate(found[0], found[1], self.special_tokens) if found else None
        self.has_chat_tokens = self.template is not None

    def encode(self, text: str, cancel: threading.Event | None = None) -> list[int]:
        # One call to the library: there is no point between chunks where ``cancel`` is looked at.
        with rust_errors(self.path, "encoding"):
            return list(self._plain.encode(utf8_encodable(text), add_special_tokens=False).ids)

    def encode_rendered(self, text: str) -> list[int]:
        with rust_errors(self.path, "encoding"):
            return list(self._tok.encode(utf8_encodable(text), add_special_tokens=False).ids)

    def encode_completion(self, text: str) -> list[int]:
        with rust_errors(self.path, "encoding"):
            return list(self._tok.encode(utf8_encodable(text), add_special_tokens=True).ids)

    def decode(self, ids: Sequence[int]) -> str:
        with rust_errors(self.path, "decoding"):
            return self._tok.decode(list(ids), skip_special_tokens=True)

    def special_id(self, name: str) -> int | None:
        return self._added.get(name)

    def special_name(self, id: int) -> str | None:
        return self._names.get(id)

    def content_digest(self) -> str:
        """What the ids mean, by content (see :func:`rust_tokenizer_digest`)."""
        return rust_tokenizer_digest(self._tok)
