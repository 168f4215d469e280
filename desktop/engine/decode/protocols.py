"""What decoding needs of a model and its tokenizer, whatever family they come from.

Every family's backend passes its own model and tokenizer to :mod:`.generation` and
:mod:`.scoring`; these protocols say what those must offer, so the shared code names no family.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch


class CacheShape(Protocol):
    """The sizes a :class:`~.kvcache.KVCache` is allocated from (a model's config)."""

    @property
    def n_layer(self) -> int: ...
    @property
    def n_kv_head(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def has_smear(self) -> bool: ...
    @property
    def engram_layers(self) -> tuple[int, ...]: ...
    @property
    def engram_dim(self) -> int: ...
    @property
    def rope_len(self) -> int: ...


class DecodingModel(Protocol):
    """A model as the decode loop calls it: ``model(ids, cache, last_only=...)`` -> logits.

    ``cancel``: Stop, for a model that prefills a long prompt in parts; set between two, the pass
    ends there with the cache holding the rows done (nanochat's ``GPT.forward``). A model that
    prefills in one pass has nothing to stop between and ignores it."""

    @property
    def config(self) -> Any: ...  # a CacheShape
    @property
    def device(self) -> torch.device: ...
    @property
    def compute_dtype(self) -> torch.dtype: ...
    def __call__(
        self,
        ids: torch.Tensor,
        cache: Any = None,
        last_only: bool = False,
        cancel: threading.Event | None = None,
    ) -> torch.Tensor: ...


class Tokenizer(Protocol):
    """What generation, chat rendering and streaming need from a tokenizer."""

    kind: str  # "tiktoken" | "cpp"
    path: Path
    vocab_size: int
    bos_id: int
    stop_ids: frozenset[int]  # a generated token from this set ends the reply
    has_chat_tokens: bool  # <|user_start|>, <|assistant_start|> and <|assistant_end|> all exist
    warnings: list[str]  # things the user should know about this file, shown once at load time

    def encode(self, text: str, cancel: threading.Event | None = None) -> list[int]:
        """Ids of ordinary text; special-token names written in ``text`` stay ordinary text.

        A long text is encoded a chunk at a time; ``cancel`` set between two chunks raises
        :class:`~.tokenizer_checks.EncodingCancelled`. Lone surrogates encode as U+FFFD.
        """
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; incomplete UTF-8 at the end shows as U+FFFD."""
        ...

    def special_id(self, name: str) -> int | None:
        """Id of a special/control token by name, or None if this tokenizer lacks it."""
        ...

    def special_name(self, id: int) -> str | None:
        """Name of ``id`` if it is a special/control token, else None."""
        ...
