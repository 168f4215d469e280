"""A loaded model with its tokenizer and a prefix cache: what the worker and the CLI talk to.

The prefix cache keeps the KV cache of the last conversation. When the next prompt extends (or
shares a prefix with) the cached tokens, only the new tokens are prefilled; the cache's
per-position histories make this exact for every era (E7 smear, E4 bigram, Engram).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .chat_format import Rendered, render_completion_prompt, render_for_completion
from .generation import GenerationStats, stream_reply
from .kvcache import KVCache
from .loader import LoadedModel, Progress, load_model
from .messages import Message, TokenEvent
from .sampling import SamplingParams
from .tokenizer import Tokenizer, select_tokenizer


def tokenizer_dirs(directory: Path, base_dir: Path | None) -> list[Path]:
    """Where to look for a tokenizer: the checkpoint dir, ``<base>/tokenizer``, then $NANOCHAT_BASE_DIR."""
    from .discovery import PHASES, nanochat_base_dir

    dirs = [directory]
    if directory.parent.name in PHASES:
        dirs.append(directory.parent.parent / "tokenizer")
    dirs.append((base_dir or nanochat_base_dir()) / "tokenizer")
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


@dataclass
class SessionOptions:
    step: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    tokenizer: Path | None = None
    softcap: float | None = None
    base_dir: Path | None = None


class ChatSession:
    def __init__(self, loaded: LoadedModel, tok: Tokenizer) -> None:
        self.loaded = loaded
        self.tok = tok
        self.model = loaded.model
        # Base checkpoints and tokenizers without chat tokens (the fork's C++ one) complete text.
        self.chat_mode = tok.has_chat_tokens and loaded.directory.parent.name != "base_checkpoints"
        self._cache: KVCache | None = None

    @classmethod
    def open(
        cls, directory: Path, options: SessionOptions | None = None, progress: Progress | None = None
    ) -> ChatSession:
        opts = options or SessionOptions()
        directory = Path(directory).expanduser()
        loaded = load_model(directory, opts.step, opts.device, opts.dtype, opts.softcap, progress)
        tok = select_tokenizer(
            tokenizer_dirs(directory, opts.base_dir),
            loaded.config.vocab_size,
            loaded.config.is_fork,
            explicit=opts.tokenizer,
        )
        tok.special_id("<TOOL_RESULT>")  # resolves (and warns about) the fork's id-19 fallback now
        loaded.warnings.extend(tok.warnings)
        session = cls(loaded, tok)
        session.warm_up()
        return session

    def warm_up(self) -> None:
        """One tiny forward so the first reply does not pay for kernel selection and allocations."""
        with torch.inference_mode():
            ids = torch.zeros(1, 2, dtype=torch.long, device=self.model.device)
            cache = KVCache(self.model.config, 1, 4, self.model.device, self.model.compute_dtype)
            self.model(ids, cache, last_only=True)
            self.model(ids[:, :1], cache, last_only=True)

    def info(self) -> dict:
        d = self.loaded.info()
        d.update(chat_mode=self.chat_mode, tokenizer=str(self.tok.path), tokenizer_kind=self.tok.kind)
        return d

    def render(self, messages: Sequence[Message], max_new: int) -> Rendered:
        """Prompt ids for a conversation, oldest turns dropped to leave room for ``max_new`` tokens."""
        # Keep room for a reply of up to a quarter of the context; longer replies may run past
        # sequence_len, as they can in nanochat.
        seq = self.loaded.config.sequence_len
        budget = max(1, seq - min(max_new, seq // 4))
        if self.chat_mode:
            return render_for_completion(self.tok, list(messages), budget)
        text = "".join(m.plain_text() for m in messages if m.role != "system")
        return render_completion_prompt(self.tok, text, budget)

    def generate(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        cancel: threading.Event | None = None,
        stats: GenerationStats | None = None,
        reuse_cache: bool = True,
    ) -> Iterator[TokenEvent]:
        """Stream a reply to ``prompt`` ids. With ``reuse_cache`` the KV cache of the previous call
        is kept: generation prefills only what follows the longest prefix it shares with ``prompt``."""
        if not reuse_cache or self._cache is None:
            cfg = self.model.config
            cap = min(cfg.rope_len, len(prompt) + (params.max_tokens or cfg.sequence_len))
            self._cache = KVCache(cfg, 1, cap, self.model.device, self.model.compute_dtype)
        yield from stream_reply(
            self.model, self.tok, prompt, params, cache=self._cache, cancel=cancel, stats=stats
        )

    def reset_cache(self) -> None:
        self._cache = None

    def close(self) -> None:
        self.reset_cache()
        self.model = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
