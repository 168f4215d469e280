"""KempnerForge runs behind the :class:`~desktop.engine.backend.Backend` seam (checkpoint-formats spec §3).

Opening a run: resolve the step (``latest`` by default) and its DCP directories (``pp<k>``
stages merged) → the training TOML's ``[model]`` → the DCP ``.metadata`` read through the
restricted unpickler → ``model.*`` keys and shapes checked strictly → the run's Hugging Face
tokenizer → memory checked against what is free → the ``model.*`` byte ranges of the
``*.distcp`` files read into private memory (the optimizer's are never touched,
``train_state.pt`` never opened) → finite check.

KempnerForge trains base language models without a chat format, so prompts are completions:
the text encoded as ``AutoTokenizer.encode`` does (a tokenizer with a chat template renders
conversations through it). Replies follow its ``generate()``.
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
from desktop.engine.decode.pass_timing import Decisions
from desktop.engine.decode.scoring import score_reply, token_label
from desktop.engine.decode.speculative import Draft, DraftSlot, cheapest, ready_draft, stream_decoded
from desktop.engine.errors import (
    ContextError,
    OutOfMemoryError,
    TokenizerError,
    is_out_of_memory,
)
from desktop.engine.files import bounded
from desktop.engine.files.finite import check_finite
from desktop.engine.kempnerforge.config import KFModelConfig, KFRunConfig, load_config
from desktop.engine.kempnerforge.dcp_metadata import DcpMetadata, read_dcp_metadata
from desktop.engine.kempnerforge.dcp_reader import read_tensors
from desktop.engine.kempnerforge.generate import next_token_probs, stream_kf
from desktop.engine.kempnerforge.layout import KFCheckpoint, resolve_checkpoint
from desktop.engine.kempnerforge.model import Block, KFCache, KFTransformer, Norm
from desktop.engine.kempnerforge.tokenizer import KFTokenizer, load_run_tokenizer, resolve_tokenizer_dir
from desktop.engine.kempnerforge.weights import EMBEDDING, OUTPUT, check_weights, model_entries
from desktop.engine.kernels.device import (
    PACKED_NAMES,
    describe_device,
    dtype_name,
    pick_device,
    pick_precision,
)
from desktop.engine.kernels.gemv import APPROXIMATE_KINDS
from desktop.engine.kernels.memory import available_ram, human
from desktop.engine.kernels.threads import torch_threads
from desktop.engine.kernels.tuning import KernelTuner, tuner_for, tuning_progress
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams

logger = logging.getLogger(__name__)

FAMILY = "kempnerforge"
# The knobs KempnerForge's sample() has (min-p and the repetition penalty are not among them).
SAMPLING = frozenset({"temperature", "top_k", "top_p", "max_tokens", "seed"})
_DEFAULT_STREAM = StreamOptions()
REPLY_SHARE = 4  # a reply may take up to this share of the context when the prompt must be cut


def _norm(t: dict[str, torch.Tensor], name: str) -> Norm:
    return Norm(t[f"{name}.weight"], t.get(f"{name}.bias"))


def assemble(
    cfg: KFModelConfig, t: dict[str, torch.Tensor], device: torch.device, tuner: KernelTuner
) -> KFTransformer:
    blocks = []
    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        blocks.append(
            Block(
                attention_norm=_norm(t, f"{p}.attention_norm"),
                q=t[f"{p}.attention.q_proj.weight"],
                k=t[f"{p}.attention.k_proj.weight"],
                v=t[f"{p}.attention.v_proj.weight"],
                o=t[f"{p}.attention.o_proj.weight"],
                q_norm=t.get(f"{p}.attention.q_norm.weight"),
                k_norm=t.get(f"{p}.attention.k_norm.weight"),
                mlp_norm=_norm(t, f"{p}.mlp_norm"),
                gate=t.get(f"{p}.mlp.gate_proj.weight"),
                up=t[f"{p}.mlp.up_proj.weight"],
                down=t[f"{p}.mlp.down_proj.weight"],
            )
        )
    return KFTransformer(cfg, t[EMBEDDING], blocks, _norm(t, "norm"), t[OUTPUT], device, tuner)


def _tie(cfg: KFModelConfig, t: dict[str, torch.Tensor], stages: int, warnings: list[str]) -> None:
    """Embedding and head as KempnerForge ends up using them.

    Tied, one process: both keys are saved, and ``load_state_dict`` copies the head's last into
    the one shared matrix, so the stored head is both. Tied under pipeline parallelism: the
    first and last stages each trained their own matrix, so each is used as trained.
    """
    if not cfg.tie_embeddings:
        return
    if OUTPUT not in t:
        t[OUTPUT] = t[EMBEDDING]
    elif stages:
        if not torch.equal(t[OUTPUT], t[EMBEDDING]):
            warnings.append(
                "tie_embeddings is set, but the pipeline stages trained separate embedding and output "
                "matrices; each is used as trained"
            )
    else:
        t[EMBEDDING] = t[OUTPUT]


def _meta_hash(metas: list[DcpMetadata], run_cfg: KFRunConfig) -> str:
    h = hashlib.sha256()
    for meta in metas:
        h.update(bounded.read_bytes(meta.path, "dcp_metadata"))
    h.update(json.dumps(run_cfg.model.__dict__, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _check_memory(where: Path, numel: int, dtype: torch.dtype) -> None:
    needed = numel * torch.empty((), dtype=dtype).element_size()
    free = available_ram()
    if free is not None and needed > free:
        raise OutOfMemoryError(
            f"{where}: the weights need about {human(needed)} of RAM as {dtype_name(dtype)}; "
            f"only {human(free)} "
            "is free (close other programs, or try --dtype bfloat16)"
        )


class KempnerForgeBackend:
    """A KempnerForge checkpoint with its tokenizer, ready to stream replies. One thread uses it."""

    def __init__(
        self,
        checkpoint: KFCheckpoint,
        run_cfg: KFRunConfig,
        model: KFTransformer,
        tok: KFTokenizer,
        meta_hash: str,
        warnings: list[str],
        load_seconds: float,
    ) -> None:
        self.checkpoint, self.run_cfg, self.model, self.tok = checkpoint, run_cfg, model, tok
        self._cache: KFCache | None = None
        self.load_options = LoadOptions()  # how it was opened (a draft is opened alike)
        self._renewal_unsaid = False  # the load chose kernels anew; the first reply says so
        self._draft = DraftSlot()
        cfg = run_cfg.model
        run, step = checkpoint.run, checkpoint.step
        self._info = ModelInfo(
            family=FAMILY,
            path=str(run),
            name=f"{run.name} · step {step:,}" if step is not None else run.name,
            source=FAMILY,
            tag=run.name,
            step=step,
            parameters=model.n_params,
            context_length=cfg.max_seq_len,
            device=str(model.device),
            device_name=describe_device(model.device),
            precision=PACKED_NAMES.get(model.kernel_kind, dtype_name(model.compute_dtype)),
            capabilities=Capabilities(sampling=SAMPLING, chat=tok.template is not None),
            era="dense" + (f" · {checkpoint.stages} pipeline stages" if checkpoint.stages else ""),
            attention=cfg.describe(),
            tokenizer=str(tok.path),
            tokenizer_kind=tok.kind,
            vocab_size=cfg.vocab_size,
            meta_hash=meta_hash,
            warnings=tuple(warnings),
            load_seconds=round(load_seconds, 3),
        )

    @classmethod
    def open(
        cls, path: Path, options: LoadOptions | None = None, progress: Progress | None = None
    ) -> KempnerForgeBackend:
        opts = options or LoadOptions()
        report = progress or (lambda _p, _m: None)
        t0 = time.perf_counter()
        checkpoint = resolve_checkpoint(Path(path), opts.step)
        run_cfg = load_config(checkpoint, opts.config)
        cfg = run_cfg.model
        warnings = list(run_cfg.warnings)
        report(2, f"reading the DCP metadata of {checkpoint.step_dir.name}")
        metas = [read_dcp_metadata(d) for d in checkpoint.dcp_dirs]
        entries = model_entries(metas)
        shapes = {name: meta.tensors[key].size for name, (meta, key) in entries.items()}
        check_weights(cfg, shapes, str(checkpoint.step_dir), run_cfg.path.name)
        tok_dir = resolve_tokenizer_dir(
            run_cfg.tokenizer_path,
            [run_cfg.path.parent, checkpoint.run, checkpoint.run.parent],
            explicit=opts.tokenizer,
            toml=run_cfg.path,
        )
        tok = load_run_tokenizer(tok_dir, cfg.vocab_size)
        warnings.extend(tok.warnings)
        device = pick_device(opts.device)
        # On a CPU "fast" and "int8" are nanochat's contracts too: fp32 activations, 16- or 8-bit
        # weights by the kernel timed fastest here within the mode's bound (choose_precision).
        precision = pick_precision(device, opts.dtype)
        dtype = precision.compute
        _check_memory(
            checkpoint.step_dir, sum(meta.tensors[key].numel for meta, key in entries.values()), dtype
        )

        def on_read(done: int, total: int) -> None:
            report(5 + int(85 * done / max(total, 1)), f"reading weights ({human(done)} of {human(total)})")

        try:
            tensors = read_tensors(((m, k, name) for name, (m, k) in entries.items()), dtype, on_read)
            check_finite(tensors, checkpoint.step_dir)
            _tie(cfg, tensors, checkpoint.stages, warnings)
            if device.type != "cpu":
                report(92, f"moving the weights to {device}")
                moved: dict[int, torch.Tensor] = {}
                tensors = {k: moved.setdefault(id(v), v.to(device)) for k, v in tensors.items()}
            tuner = tuner_for(opts.kernel_cache)
            with tuner.listening(tuning_progress(report, 92, 99)):
                model = assemble(cfg, tensors, device, tuner)
                if precision.gemv in APPROXIMATE_KINDS:
                    model.pack(precision.gemv)
            del tensors  # the packed matrices' fp32 values go with the last reference
        except (RuntimeError, MemoryError) as exc:
            if is_out_of_memory(exc):
                raise OutOfMemoryError(
                    f"{checkpoint.step_dir}: out of memory while loading the weights"
                ) from None
            raise
        backend = cls(checkpoint, run_cfg, model, tok, _meta_hash(metas, run_cfg), warnings, 0.0)
        backend.load_options = opts
        backend.warm_up()
        backend._info = replace(backend._info, load_seconds=round(time.perf_counter() - t0, 3))
        report(100, f"loaded {backend._info.name}")
        return backend

    def warm_up(self) -> None:
        """One tiny forward (kernel choice, allocations); an SDPA backend the TOML forces that this
        device lacks falls back to PyTorch's choice, with a warning."""
        ids = torch.zeros(
            1, min(2, self.model.config.max_seq_len), dtype=torch.long, device=self.model.device
        )
        with torch.inference_mode():
            try:
                self.model(ids)
            except RuntimeError as exc:
                if self.model.sdpa_backend == "auto" or is_out_of_memory(exc):
                    raise
                note = f"sdpa_backend = {self.model.sdpa_backend!r} is not available here; torch picks one"
                logger.warning("%s (%s)", note, exc)
                self._info = replace(self._info, warnings=(*self._info.warnings, note))
                self.model.sdpa_backend = "auto"
                self.model(ids)
            self.model(ids[:, :1])  # one row: the products choose their routes, shown in the tooltip
        choices = self.model.kernel_choices()
        self._info = replace(
            self._info,
            kernels=tuple(choice.line() for choice in choices),
            choices_renewed=any(choice.renewed for choice in choices),
        )
        self._renewal_unsaid = self._info.choices_renewed  # the first reply says so

    def info(self) -> ModelInfo:
        return self._info

    def render(
        self,
        conversation: Sequence[Message] | str,
        max_tokens: int | None,
        chat: bool | None = None,
        cancel: threading.Event | None = None,
    ) -> Prompt:
        """A completion (text, or a conversation's messages joined) encoded as KempnerForge's
        script encodes it, its end kept to leave room for the reply; or, where the tokenizer has a
        chat template, a conversation rendered through it, the oldest turns dropped to fit."""
        template = self.tok.template
        if chat and template is None:
            raise TokenizerError(
                f"{self.checkpoint.run}: KempnerForge trains base models and this tokenizer has no chat "
                "template; use completion (--prompt)"
            )
        seq = self.model.config.max_seq_len
        budget = None if max_tokens is None else max(1, seq - min(max_tokens, seq // REPLY_SHARE))
        if isinstance(conversation, str):
            return self._completion((), conversation, budget)
        if chat or (chat is None and template is not None):
            return self._chat(list(conversation), budget)
        text = "".join(m.plain_text() for m in conversation if m.role != "system")
        return self._completion(tuple(conversation), text, budget)

    def _completion(self, messages: tuple[Message, ...], text: str, budget: int | None) -> Prompt:
        ids = self.tok.encode_prompt(text)
        truncated = budget is not None and len(ids) > budget
        if budget is not None and truncated:
            # Keep what the tokenizer puts in front (BOS), then the end of the text.
            lead = next((i for i, t in enumerate(ids) if self.tok.special_name(t) is None), len(ids))
            lead = min(lead, budget - 1)
            ids = ids[:lead] + ids[len(ids) - (budget - lead) :]
        return Prompt(messages, tuple(ids), len(ids), self.model.config.max_seq_len, truncated=truncated)

    def _chat(self, messages: list[Message], budget: int | None) -> Prompt:
        """What ``apply_chat_template(..., add_generation_prompt=True)`` gives, oldest turns dropped."""
        template = self.tok.template
        assert template is not None
        system = messages[:1] if messages and messages[0].role == "system" else []
        turns = messages[len(system) :]
        for first in range(0, max(1, len(turns)), 2):
            kept = [*system, *turns[first:]]
            text = template.render(message_dicts(kept), add_generation_prompt=True)
            ids = self.tok.encode_rendered(text)
            if budget is None or len(ids) <= budget:
                return Prompt(tuple(kept), tuple(ids), len(ids), self.model.config.max_seq_len, first)
        raise ContextError(f"{self.checkpoint.run}: the last message alone does not fit the context")

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        cancel: threading.Event,
        options: StreamOptions = _DEFAULT_STREAM,
        stats: GenerationStats | None = None,
    ) -> Iterator[TokenEvent]:
        ids, said, given = begin_reply(prompt.require_ids(), options.start, self.tok)  # type: ignore[arg-type]
        ignored = [k for k in ("min_p", "repetition_penalty") if k in params.active()]
        if ignored:
            logger.warning("KempnerForge's sampler has no %s; ignored", " or ".join(ignored))
        cfg = self.model.config
        want = min(cfg.max_seq_len, len(ids) + len(given) + (params.max_tokens or cfg.max_seq_len))
        if not options.reuse_cache or self._cache is None:
            self._cache = KFCache(cfg, want, self.model.device, self.model.compute_dtype)
        cache = self._cache
        draft = self._draft.for_reply(options.draft, self.draft)
        if stats is not None and self._renewal_unsaid:
            stats.choices_renewed, self._renewal_unsaid = True, False

        def plain() -> Iterator[TokenEvent]:  # KempnerForge's own sampler and loop
            with torch_threads(options.threads):
                yield from stream_kf(
                    self.model,
                    self.tok,
                    ids,
                    params,
                    cache,
                    cancel,
                    stats,
                    options.logprobs,
                    said,
                    given,
                )

        yield from stream_decoded(
            self.model,  # type: ignore[arg-type]  # the GPT call interface, duck-typed
            self.tok,  # type: ignore[arg-type]
            ids,
            params,
            options,
            draft,
            cache=cache,
            limit=cfg.max_seq_len,
            cancel=cancel,
            stats=stats,
            said=said,
            given=given,
            probs=next_token_probs,
            plain=plain,
        )

    def draft(self, text: str) -> Draft:
        """The draft ``text`` names (engine/decode/drafts.py), made once and kept: the model's own
        weights through int8 or fp16 kernels (shared, not copied; a CPU's), or another
        KempnerForge checkpoint whose tokenizer is this one's."""
        return self._draft.get(text, self._make_draft)

    def _make_draft(self, spec: DraftSpec) -> Draft:
        device = self.model.device
        if spec.head:
            raise no_head(self.info().name)
        if spec.is_self:
            kinds = self_draft_kernels(device.type, spec.precision, self.model.kernel_kind, FAMILY)
            return cheapest([partial(self._self_draft, kind) for kind in kinds])
        assert spec.checkpoint is not None
        opts = replace(
            self.load_options, step=spec.step, device=str(device), dtype=spec.precision, config=None
        )
        other = KempnerForgeBackend.open(spec.checkpoint, opts)
        check_same_tokenizer(other.tok, self.tok)
        theirs = other.info()
        which = f"{Path(theirs.path).resolve()} {theirs.name} {spec.precision}"
        return self._ready(other.model, theirs.name, which)

    def _self_draft(self, kind: str) -> Draft:
        return self._ready(self.model.with_kernels(kind), f"self ({kind})")

    def _ready(self, model: KFTransformer, name: str, which: str = "") -> Draft:
        """A draft of ``model`` named ``name``; ``which`` identifies a checkpoint draft (its folder
        and precision) where its decisions are kept (engine/decode/pass_timing.py)."""
        info = self.info()
        target = f"{info.family} {Path(info.path).resolve()} {self.load_options.dtype}"
        kept = Decisions(self.model.tuner, target).under(which or name)
        cfg, device = model.config, self.model.device

        def new_cache(capacity: int) -> KFCache:
            return KFCache(cfg, capacity, model.device, model.compute_dtype)

        def target_cache(capacity: int) -> KFCache:
            return KFCache(self.model.config, capacity, device, self.model.compute_dtype)

        return ready_draft(model, name, cfg.max_seq_len, new_cache, self.model, target_cache, kept)  # type: ignore[arg-type]

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
        return token_label(self.tok, token_id) if token_id >= 0 else ""  # type: ignore[arg-type]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def tokenizer(self) -> KFTokenizer:
        return self.tok

    def close(self) -> None:
        self._cache = None
        self._draft.clear()
        self.model = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
