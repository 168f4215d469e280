"""The nanochat engine behind the :class:`~desktop.engine.backend.Backend` seam.

A loaded nanochat-family checkpoint (every upstream era and the C++ fork) with its tokenizer and
a prefix cache. The prefix cache keeps the KV cache of the last request: when the next prompt
extends (or shares a prefix with) the cached tokens, only the new tokens are prefilled; the
cache's per-position histories make this exact for every era (E7 smear, E4 bigram, Engram).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from desktop.engine.backend import (
    DEFAULT_STREAM,
    Capabilities,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    Progress,
    Prompt,
    StreamOptions,
)
from desktop.engine.decode.compiled_draft import keep_compiled_code_in
from desktop.engine.decode.compiled_step import CompiledStep
from desktop.engine.decode.drafts import DraftSpec
from desktop.engine.decode.generation import begin_reply
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.pass_timing import Decisions
from desktop.engine.decode.scoring import score_reply, token_label
from desktop.engine.decode.speculative import Draft, DraftSlot, stream_decoded
from desktop.engine.decode.verifier import Verifier
from desktop.engine.discovery import PHASES, run_tag, source_of
from desktop.engine.errors import NanoscopeError, TokenizerError
from desktop.engine.kernels.tuning import shown_precision
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.nanochat.chat_format import render_completion_prompt, render_for_completion
from desktop.engine.nanochat.drafts import cache_of, make_draft, step_compile, verifier_compile
from desktop.engine.nanochat.experiment_layout import is_stage_folder
from desktop.engine.nanochat.loader import LoadedModel, load_model
from desktop.engine.nanochat.tokenizer import Tokenizer, select_tokenizer
from desktop.engine.params import SamplingParams

# A reply may take up to this share of the context when old turns must make room for it; longer
# replies may run past sequence_len, as they can in nanochat.
REPLY_SHARE = 4


def tokenizer_dirs(directory: Path, base_dir: Path | None) -> list[Path]:
    """Where to look for a tokenizer: the checkpoint dir, ``<phase dir>/../tokenizer``, then
    ``<base_dir>/tokenizer``."""
    dirs = [directory]
    if directory.parent.name in PHASES or is_stage_folder(directory):
        # <base>/<phase>_checkpoints/<tag>, or an experiment's <name>/<tag>/<stage>: the
        # tokenizer is two levels up in both layouts
        dirs.append(directory.parent.parent / "tokenizer")
    if base_dir is not None:
        dirs.append(base_dir / "tokenizer")
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def display_name(directory: Path, step: int | None) -> str:
    """ "sft/d20 · step 1,500", "sft/exp/d20 · step 1,500" in the experiment layout (a folder
    outside both layouts goes by its own name)."""
    source = source_of(directory)
    where = f"{source}/{run_tag(directory)}" if source else directory.name
    return f"{where} · step {step:,}" if step is not None else where


class NanochatBackend:
    """A nanochat checkpoint, ready to stream replies. Every method runs on one thread."""

    def __init__(self, loaded: LoadedModel, tok: Tokenizer) -> None:
        self.loaded = loaded
        self.tok = tok
        self.model = loaded.model
        # Base checkpoints and tokenizers without chat tokens (the fork's C++ one) complete text.
        self.chat_mode = tok.has_chat_tokens and source_of(loaded.directory) != "base"
        self._cache: KVCache | None = None
        self._info = self._describe()
        self.load_options = LoadOptions()  # how it was opened (a draft is opened alike)
        self._draft = DraftSlot()
        self._verifier: Verifier | None = Verifier(self.model, cache_of(self.model), self.decisions())
        # A plain reply's one-row steps, compiled in fast and int8 mode (compile_steps below).
        self._step = CompiledStep(self.model, cache_of(self.model), self.decisions())
        self._renewal_unsaid = False  # the load chose kernels anew; the first reply says so

    @classmethod
    def open(
        cls, directory: Path, options: LoadOptions | None = None, progress: Progress | None = None
    ) -> NanochatBackend:
        opts = options or LoadOptions()
        directory = Path(directory).expanduser()
        loaded = load_model(
            directory, opts.step, opts.device, opts.dtype, opts.softcap, progress, opts.kernel_cache
        )
        tok = select_tokenizer(
            tokenizer_dirs(directory, opts.base_dir),
            loaded.config.vocab_size,
            loaded.config.is_fork,
            explicit=opts.tokenizer,
        )
        tok.special_id("<TOOL_RESULT>")  # resolves (and warns about) the fork's id-19 fallback now
        loaded.warnings.extend(tok.warnings)
        backend = cls(loaded, tok)
        backend.load_options = opts
        backend.warm_up()
        if opts.compile_drafts:
            backend.compile_steps()
        return backend

    def _keep_compiled_code(self) -> None:
        """Inductor's on-disk cache beside the kernel timings, where they are kept."""
        if self.load_options.kernel_cache is not None:
            keep_compiled_code_in(self.load_options.kernel_cache.parent / "inductor")

    def compile_steps(self) -> None:
        """Start compiling plain replies' one-row steps in the background where they may be
        (fast and int8 mode on a CPU with a C++ compiler: nanochat/drafts.step_compile); each reply
        says whether its steps ran compiled, or why not."""
        start, why = step_compile(self.loaded)
        if start is None:
            self._step.why = why
            return
        self._keep_compiled_code()
        self._step.compile(start)
        twin = self._step.twin
        if twin is not None and self.load_options.compile_wait_s > 0:
            twin.done.wait(self.load_options.compile_wait_s)

    def warm_up(self) -> None:
        """One tiny forward so the first reply does not pay for kernel selection and allocations."""
        with torch.inference_mode():
            ids = torch.zeros(1, 2, dtype=torch.long, device=self.model.device)
            cache = KVCache(self.model.config, 1, 4, self.model.device, self.model.compute_dtype)
            self.model(ids, cache, last_only=True)
            self.model(ids[:, :1], cache, last_only=True)
        # The first one-row products chose their routes: now the choices can be shown.
        choices = self.model.kernel_choices()
        self._info = replace(
            self._info,
            kernels=tuple(choice.line() for choice in choices),
            precision=shown_precision(self._info.precision, choices),
            choices_renewed=any(choice.renewed for choice in choices),
        )
        self._renewal_unsaid = self._info.choices_renewed

    def decisions(self) -> Decisions:
        """Where speculative decoding's timing-driven decisions for this model are kept, beside
        its kernel timings (engine/decode/pass_timing.py)."""
        loaded = self.loaded
        key = f"nanochat {loaded.directory.resolve()} step {loaded.step} {loaded.precision.name}"
        return Decisions(self.model.tuner, key)

    def _describe(self) -> ModelInfo:
        loaded, cfg = self.loaded, self.loaded.config
        return ModelInfo(
            family="nanochat-fork" if cfg.is_fork else "nanochat",
            path=str(loaded.directory),
            name=display_name(loaded.directory, loaded.step),
            source=source_of(loaded.directory) or "folder",
            tag=run_tag(loaded.directory),
            step=loaded.step,
            parameters=loaded.n_params,
            context_length=cfg.sequence_len,
            device=str(loaded.device),
            device_name=loaded.device_name,
            precision=loaded.precision.name,
            capabilities=Capabilities(chat=self.chat_mode, draft_head=cfg.has_mtp),
            era=cfg.era,
            attention=loaded.attention,
            tokenizer=str(self.tok.path),
            tokenizer_kind=self.tok.kind,
            vocab_size=cfg.vocab_size,
            meta_hash=loaded.meta_hash,
            warnings=tuple(loaded.warnings),
            load_seconds=round(loaded.load_seconds, 3),
        )

    def info(self) -> ModelInfo:
        return self._info

    def render(
        self,
        conversation: Sequence[Message] | str,
        max_tokens: int | None,
        chat: bool | None = None,
        cancel: threading.Event | None = None,
    ) -> Prompt:
        """Prompt ids; with ``max_tokens``, the oldest turns make room for a reply of up to a
        quarter of the context (None: nothing is dropped)."""
        seq = self.loaded.config.sequence_len
        budget = None if max_tokens is None else max(1, seq - min(max_tokens, seq // REPLY_SHARE))
        if chat and not self.tok.has_chat_tokens:
            raise TokenizerError(f"{self.tok.path}: this tokenizer has no chat tokens")
        tok = _Cancellable(self.tok, cancel) if cancel is not None else self.tok
        if isinstance(conversation, str):
            messages: tuple[Message, ...] = ()
            rendered = render_completion_prompt(tok, conversation, budget)
        elif chat or (chat is None and self.chat_mode):
            messages = tuple(conversation)
            rendered = render_for_completion(tok, list(messages), budget)
            messages = messages[rendered.dropped_turns :] if rendered.dropped_turns else messages
        else:
            messages = tuple(conversation)
            text = "".join(m.plain_text() for m in messages if m.role != "system")
            rendered = render_completion_prompt(tok, text, budget)
        return Prompt(
            messages=messages,
            ids=tuple(rendered.ids),
            tokens=len(rendered.ids),
            context_length=seq,
            dropped_turns=rendered.dropped_turns,
            truncated=rendered.truncated,
        )

    def prompt_of_ids(self, ids: Sequence[int]) -> Prompt:
        """A prompt given as token ids (checked against the vocabulary)."""
        vocab = self.loaded.config.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise NanoscopeError(f"token ids out of range for vocab {vocab}: {bad[:5]}")
        return Prompt((), tuple(ids), len(ids), self.loaded.config.sequence_len)

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        cancel: threading.Event,
        options: StreamOptions = DEFAULT_STREAM,
        stats: GenerationStats | None = None,
    ) -> Iterator[TokenEvent]:
        """Stream a reply to ``prompt``. With ``options.reuse_cache`` the KV cache of the previous
        request is kept: generation prefills only what follows the longest prefix it shares.
        ``options.start``: a reply that begins already (a fork: the cache still holds the reply
        it forks, so only the fork point is computed again)."""
        ids, said, given = begin_reply(prompt.require_ids(), options.start, self.tok)
        if not options.reuse_cache or self._cache is None:
            cfg = self.model.config
            cap = min(cfg.rope_len, len(ids) + len(given) + (params.max_tokens or cfg.sequence_len))
            self._cache = KVCache(cfg, 1, cap, self.model.device, self.model.compute_dtype)
        # Speculative decoding off lets the draft go, not the verifier's compile: it waits while
        # replies stream (desktop.engine.foreground), and a later speculative reply takes it.
        draft = self._draft.for_reply(options.draft, self.draft)
        if stats is not None and self._renewal_unsaid:
            stats.choices_renewed, self._renewal_unsaid = True, False
        yield from stream_decoded(
            self.model,
            self.tok,
            ids,
            params,
            options,
            draft,
            cache=self._cache,
            limit=self.model.config.rope_len,
            cancel=cancel,
            stats=stats,
            said=said,
            given=given,
            verifier=self._verifier,
            step=self._step,
        )

    @property
    def verifier(self) -> Verifier | None:
        """What computes the target's passes when a reply drafts (None once closed)."""
        return self._verifier

    def draft(self, text: str) -> Draft:
        """The draft ``text`` names (engine/decode/drafts.py), loaded once and kept."""
        opts = self.load_options

        def find_tokenizer(directory: Path, vocab: int, is_fork: bool) -> Tokenizer:
            return select_tokenizer(tokenizer_dirs(directory, opts.base_dir), vocab, is_fork)

        def make(spec: DraftSpec) -> Draft:
            if opts.compile_drafts:
                self._keep_compiled_code()
            draft = make_draft(
                self.loaded,
                self.tok,
                spec,
                find_tokenizer,
                opts.kernel_cache,
                opts.compile_drafts,
                self.decisions(),
            )
            start = verifier_compile(self.loaded) if opts.compile_drafts else None
            if start is not None and self._verifier is not None:
                self._verifier.compile(start)
            return draft

        return self._draft.get(text, make)

    def score(
        self,
        prompt: Prompt,
        reply_ids: Sequence[int],
        top: int = 0,
        skip: Sequence[bool] | None = None,
        choices: Sequence[int] = (),
    ) -> dict[str, Any]:
        return score_reply(
            self.model, self.tok, prompt.require_ids(), reply_ids, top=top, skip=skip, choices=choices
        )

    def token_label(self, token_id: int) -> str:
        return token_label(self.tok, token_id) if token_id >= 0 else ""

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def tokenizer(self) -> Tokenizer:
        return self.tok

    def reset_cache(self) -> None:
        self._cache = None
        self._draft.forget_cache()

    def close(self) -> None:
        self.reset_cache()
        self._draft.clear()
        self._step.stop()
        if self._verifier is not None:
            self._verifier.stop()
        self._verifier = None
        self.model = None  # type: ignore[assignment]
        self.loaded.model = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class _Cancellable:
    """The tokenizer with Stop wired into every encode, for chat rendering (which calls
    ``encode`` per turn and knows nothing of cancellation)."""

    def __init__(self, tok: Tokenizer, cancel: threading.Event) -> None:
        self._tok = tok
        self._cancel = cancel

    def encode(self, text: str, cancel: threading.Event | None = None) -> list[int]:
        return self._tok.encode(text, cancel or self._cancel)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)
