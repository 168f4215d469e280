"""Hugging Face safetensors directories (``model_type`` nanochat or llama) behind the Backend seam.

Open = config.json (:mod:`.hf_config`) → safetensors headers, strict keys/shapes/dtypes and the
memory budget, then the weights (:mod:`.hf_weights`) → ``tokenizer.json`` with the chat template
(:mod:`.hf_tokenizer`, :mod:`.chat_template`). Generation is the engine's own loop
(:func:`~desktop.engine.decode.generation.stream_reply`): the same sampling, the same KV cache and prefix
reuse, and the same calculator state machine, which finds nanochat's tool tokens by name in the
port's tokenizer. End of sequence comes from ``generation_config.json`` when it exists (what
transformers' ``generate`` uses), else ``config.json``, else the tokenizer's ``eos_token``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from desktop.engine.backend import (
    Capabilities,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    Progress,
    Prompt,
    StreamOptions,
)
from desktop.engine.chat_template import message_dicts
from desktop.engine.decode.drafts import DraftSpec, check_same_tokenizer, no_head, self_draft_kernels
from desktop.engine.decode.generation import begin_reply
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.pass_timing import Decisions
from desktop.engine.decode.scoring import score_reply, token_label
from desktop.engine.decode.speculative import Draft, DraftSlot, cheapest, ready_draft, stream_decoded
from desktop.engine.errors import CheckpointError, ContextError, TokenizerError
from desktop.engine.hf.config import HFConfig, parse_config, token_ids
from desktop.engine.hf.files import (
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    TOKENIZER_CONFIG_NAME,
    display_name,
    read_json,
    read_optional_json,
)
from desktop.engine.hf.model import HFCausalLM
from desktop.engine.hf.tokenizer import HFTokenizer
from desktop.engine.hf.weights import load_weights
from desktop.engine.kernels.device import describe_device, pick_device, pick_precision
from desktop.engine.kernels.gemv import APPROXIMATE_KINDS
from desktop.engine.kernels.tuning import tuner_for, tuning_progress
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams

logger = logging.getLogger(__name__)

# As the nanochat backend: a reply may take up to this share of the context when old turns make room.
REPLY_SHARE = 4
DEFAULT_OPTIONS = StreamOptions()


class HFBackend:
    """A loaded Hugging Face model. Every method runs on one thread."""

    def __init__(
        self, directory: Path, config: HFConfig, model: HFCausalLM, tok: HFTokenizer, info: ModelInfo
    ) -> None:
        self.directory = directory
        self.config = config
        self.model = model
        self.tok = tok
        self._info = info
        self._cache: KVCache | None = None
        self.load_options = LoadOptions()  # how it was opened (a draft is opened alike)
        self._renewal_unsaid = False  # the load chose kernels anew; the first reply says so
        self._draft = DraftSlot()

    @classmethod
    def open(
        cls, directory: Path, options: LoadOptions | None = None, progress: Progress | None = None
    ) -> HFBackend:
        opts = options or LoadOptions()
        directory = Path(directory).expanduser()
        report = progress or (lambda _p, _m: None)
        t0 = time.perf_counter()
        report(5, "Reading config.json")
        raw = read_json(directory / CONFIG_NAME, "model config")
        config = parse_config(raw, directory / CONFIG_NAME)
        generation = read_optional_json(directory / GENERATION_CONFIG_NAME, "generation config")
        tok_config = read_optional_json(directory / TOKENIZER_CONFIG_NAME, "tokenizer config")
        if opts.tokenizer is not None:
            raise TokenizerError(
                f"{directory}: a Hugging Face model uses its own tokenizer.json; drop --tokenizer"
            )
        eos = (
            token_ids(generation.get("eos_token_id"))
            if "eos_token_id" in generation
            else token_ids(raw.get("eos_token_id"))
        )
        bos = generation.get("bos_token_id", raw.get("bos_token_id"))
        tok = HFTokenizer(directory, tok_config, eos, bos if isinstance(bos, int) else None)
        if tok.vocab_size > config.vocab_size:
            raise TokenizerError(
                f"{tok.path}: the tokenizer has {tok.vocab_size} tokens, the model {config.vocab_size}"
            )
        device = pick_device(opts.device)
        # fp32 on the CPU by default (transformers' numbers). On a CPU "fast" and "int8" are the
        # contracts nanochat's checkpoints have too: fp32 activations, 16- or 8-bit weights by the
        # kernel timed fastest here within the mode's bound; elsewhere "fast" is a 16-bit dtype.
        precision = pick_precision(device, opts.dtype)
        report(20, "Reading weights")
        weights = load_weights(directory, config, precision.compute, device)
        tuner = tuner_for(opts.kernel_cache)
        with tuner.listening(tuning_progress(report, 40, 90)):
            model = HFCausalLM(config, weights, tuner)
            if precision.gemv in APPROXIMATE_KINDS:
                model.pack(precision.gemv)
        del weights  # the packed matrices' fp32 values go with the last reference
        report(90, "Warming up")
        info = ModelInfo(
            family=config.family,
            path=str(directory),
            name=display_name(directory),
            source="hf",
            tag=display_name(directory),
            step=None,
            parameters=config.n_params(),
            context_length=config.max_position_embeddings,
            device=str(device),
            device_name=describe_device(device),
            precision=precision.name,
            capabilities=Capabilities(chat=tok.has_chat_tokens),
            era=config.family,
            attention="sdpa",
            tokenizer=str(tok.path),
            tokenizer_kind=tok.kind,
            vocab_size=config.vocab_size,
            meta_hash=hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16],
            warnings=tuple(tok.warnings),
            load_seconds=round(time.perf_counter() - t0, 3),
        )
        backend = cls(directory, config, model, tok, info)
        backend.load_options = opts
        backend.warm_up()
        report(100, "Ready")
        return backend

    def warm_up(self) -> None:
        """A prefill and a one-token step: the first one-row products choose their routes, which
        the precision's tooltip then lists."""
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.model.device)
        cache = self._new_cache(4)
        self.model(ids, cache, last_only=True)
        self.model(ids[:, :1], cache, last_only=True)
        choices = self.model.kernel_choices()
        self._info = replace(
            self._info,
            kernels=tuple(choice.line() for choice in choices),
            choices_renewed=any(choice.renewed for choice in choices),
        )
        self._renewal_unsaid = self._info.choices_renewed  # the first reply says so

    def _new_cache(self, capacity: int) -> KVCache:
        # KVCache reads only the fields HFConfig shares with nanochat's ModelConfig.
        return KVCache(self.config, 1, capacity, self.model.device, self.model.compute_dtype)  # type: ignore[arg-type]

    def info(self) -> ModelInfo:
        return self._info

    def render(
        self,
        conversation: Sequence[Message] | str,
        max_tokens: int | None,
        chat: bool | None = None,
        cancel: threading.Event | None = None,
    ) -> Prompt:
        """Completion text through the tokenizer (its post-processor adds BOS where it says so), or a
        conversation through the chat template; the oldest turns make room for the reply."""
        seq = self.config.max_position_embeddings
        budget = None if max_tokens is None else max(1, seq - min(max_tokens, seq // REPLY_SHARE))
        if chat and self.tok.template is None:
            raise TokenizerError(f"{self.directory}: this model has no chat template; use completion mode")
        if isinstance(conversation, str) or not (chat or (chat is None and self.tok.template is not None)):
            text = conversation if isinstance(conversation, str) else _plain(conversation)
            ids = self.tok.encode_completion(text)
            truncated = budget is not None and len(ids) > budget
            ids = ids[len(ids) - budget :] if truncated and budget is not None else ids
            messages = () if isinstance(conversation, str) else tuple(conversation)
            return Prompt(messages, tuple(ids), len(ids), seq, truncated=truncated)
        return self._render_chat(list(conversation), budget)

    def _render_chat(self, messages: list[Message], budget: int | None) -> Prompt:
        seq = self.config.max_position_embeddings
        system = messages[:1] if messages and messages[0].role == "system" else []
        turns = messages[len(system) :]
        for first in range(0, max(1, len(turns)), 2):
            kept = system + turns[first:]
            ids = self.chat_ids(kept)
            if budget is None or len(ids) <= budget:
                return Prompt(tuple(kept), tuple(ids), len(ids), seq, dropped_turns=first)
        # The last message alone does not fit: keep the end of its text.
        last = turns[-1]
        text_ids = self.tok.encode(last.plain_text())
        keep = len(text_ids)
        while keep > 0:
            keep = keep // 2
            cut = Message.of_text(last.role, self.tok.decode(text_ids[len(text_ids) - keep :]))
            ids = self.chat_ids([*system, cut])
            if budget is None or len(ids) <= budget:
                return Prompt(
                    tuple([*system, cut]), tuple(ids), len(ids), seq, len(turns) - 1, truncated=True
                )
        raise ContextError(f"{self.directory}: the chat template alone needs more than {budget} tokens")

    def chat_ids(self, messages: Sequence[Message]) -> list[int]:
        """The ids transformers' ``apply_chat_template(..., add_generation_prompt=True)`` gives."""
        assert self.tok.template is not None
        text = self.tok.template.render(message_dicts(messages), add_generation_prompt=True)
        return self.tok.encode_rendered(text)

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        cancel: threading.Event,
        options: StreamOptions = DEFAULT_OPTIONS,
        stats: GenerationStats | None = None,
    ) -> Iterator[TokenEvent]:
        ids, said, given = begin_reply(prompt.require_ids(), options.start, self.tok)
        if not options.reuse_cache or self._cache is None:
            room = len(ids) + len(given) + (params.max_tokens or self.config.sequence_len)
            cap = min(self.config.rope_len, room)
            self._cache = self._new_cache(cap)
        draft = self._draft.for_reply(options.draft, self.draft)
        if stats is not None and self._renewal_unsaid:
            stats.choices_renewed, self._renewal_unsaid = True, False
        yield from stream_decoded(
            self.model,  # type: ignore[arg-type]  # the GPT call interface, duck-typed
            self.tok,
            ids,
            params,
            options,
            draft,
            cache=self._cache,
            limit=self.config.rope_len,
            cancel=cancel,
            stats=stats,
            said=said,
            given=given,
        )

    def draft(self, text: str) -> Draft:
        """The draft ``text`` names (engine/decode/drafts.py), made once and kept: the model's own
        weights through int8 or fp16 kernels (shared, not copied), or another Hugging Face
        folder whose tokenizer is this one's."""
        return self._draft.get(text, self._make_draft)

    def _make_draft(self, spec: DraftSpec) -> Draft:
        if spec.head:
            raise no_head(self.info().name)
        if spec.is_self:
            kinds = self_draft_kernels(
                self.model.device.type, spec.precision, self.model.kernel_kind, "Hugging Face"
            )
            return cheapest([partial(self._self_draft, kind) for kind in kinds])
        assert spec.checkpoint is not None
        if spec.step is not None:
            raise CheckpointError(f"{spec.checkpoint}: a Hugging Face folder has no steps")
        opts = replace(self.load_options, device=str(self.model.device), dtype=spec.precision, tokenizer=None)
        other = HFBackend.open(spec.checkpoint, opts)
        check_same_tokenizer(other.tok, self.tok)
        theirs = other.info()
        which = f"{Path(theirs.path).resolve()} {theirs.name} {spec.precision}"
        return self._ready(other.model, theirs.name, which)

    def _self_draft(self, kind: str) -> Draft:
        return self._ready(self.model.with_kernels(kind), f"self ({kind})")

    def _ready(self, model: HFCausalLM, name: str, which: str = "") -> Draft:
        """A draft of ``model`` named ``name``; ``which`` identifies a checkpoint draft (its folder
        and precision) where its decisions are kept (engine/decode/pass_timing.py)."""
        info = self.info()
        target = f"{info.family} {Path(info.path).resolve()} {self.load_options.dtype}"
        kept = Decisions(self.model.tuner, target).under(which or name)
        config = model.config

        def new_cache(capacity: int) -> KVCache:
            return KVCache(config, 1, capacity, model.device, model.compute_dtype)  # type: ignore[arg-type]

        return ready_draft(model, name, config.rope_len, new_cache, self.model, self._new_cache, kept)  # type: ignore[arg-type]

    def score(
        self,
        prompt: Prompt,
        reply_ids: Sequence[int],
        top: int = 0,
        skip: Sequence[bool] | None = None,
        choices: Sequence[int] = (),
    ) -> dict[str, Any]:
        ids = prompt.require_ids()
        model: Any = self.model  # the GPT call interface, duck-typed
        return score_reply(model, self.tok, ids, reply_ids, top=top, skip=skip, choices=choices)  # type: ignore[arg-type]

    def token_label(self, token_id: int) -> str:
        return token_label(self.tok, token_id) if token_id >= 0 else ""

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def tokenizer(self) -> HFTokenizer:
        return self.tok

    def close(self) -> None:
        self._cache = None
        self._draft.clear()
        self.model = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _plain(messages: Sequence[Message]) -> str:
    return "".join(m.plain_text() for m in messages if m.role != "system")
