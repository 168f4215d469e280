"""Drafts for speculative decoding of a nanochat checkpoint (engine/decode/speculative.py).

A self-draft is the target's own weights in int8 or 16-bit kernels. When the target computes in
exact fp32 its weights are shared, not read again: the draft module is built on the target's
tensors and only the packed forms are new (an int8 draft of d20 costs about a quarter of the
target's matrices, nothing of its embeddings). Otherwise (the target is itself packed, or the
draft computes in another dtype) the checkpoint is loaded again at the draft's precision.

The MTP draft is the fork's multi-token-prediction head (:mod:`.mtp`), where the checkpoint has
one: it reads the target's own hidden states and proposes one token a round. ``auto`` weighs it
with the self-drafts by measured tokens per unit of cost.

A checkpoint draft is another nanochat checkpoint (an earlier step, a smaller depth) whose
tokenizer gives ids the same meaning as the target's, compared by content.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from desktop.engine.decode.compiled_draft import COMPILED_ROWS, CompiledTwin, shared_twin, why_not_compiled
from desktop.engine.decode.drafts import AUTO, MTP, DraftSpec, check_same_tokenizer
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.pass_timing import Decisions
from desktop.engine.decode.protocols import Tokenizer
from desktop.engine.decode.speculative import K_MAX, Draft, cheapest, measure_costs, ready_draft
from desktop.engine.kernels.device import pick_precision
from desktop.engine.kernels.gemv import APPROXIMATE_KINDS
from desktop.engine.kernels.memory import release_freed_memory
from desktop.engine.kernels.tuning import KernelTuner, tuner_for
from desktop.engine.nanochat.config import ModelConfig
from desktop.engine.nanochat.loader import LoadedModel, load_model
from desktop.engine.nanochat.model import GPT
from desktop.engine.nanochat.mtp import HeadDraft, follow, load_head

logger = logging.getLogger(__name__)
# How far into the context, or past a sliding window, a compiled draft is warmed up.
WARM_PAST = 8
# A target whose step reads at most this many bytes of weights is per-operation dispatch on a
# CPU, and its verifying passes are compiled (engine/decode/verifier.py): the demo's take half
# the eager time. Past it the products dominate, and a compile (minutes, ~200 MB) would not pay.
SMALL_TARGET_BYTES = 64 << 20
# A model whose step reads at most this many bytes of weights is compiled with its products and
# attention inlined (gemv.InlinedLinear, attention.inlined_attention): inductor fuses them into
# its own loops, where a BLAS or SDPA call costs more than such a small product computes (the
# demo's compiled one-row step: ~0.55 -> ~0.3 ms). Past it a product streams its weight, and a
# pass that ran eagerly (its guards failed) would hold rows x the largest matrix.
INLINED_BYTES = 16 << 20
# The most rows a verifying pass has: the pending token and the longest adaptive round.
VERIFIED_ROWS = K_MAX + 1

# (checkpoint directory, its vocab size, whether it is a fork) -> its tokenizer
FindTokenizer = Callable[[Path, int, bool], Tokenizer]


def self_candidates(loaded: LoadedModel, spec: DraftSpec) -> tuple[str, ...]:
    """What a draft of the target itself named ``spec`` may be: precisions of its own weights, or
    ``mtp``, its MTP head. ``auto`` is the best (as timed) of int8 and fp16 on a CPU, the fast
    16-bit form elsewhere, and the head where the checkpoint has one."""
    if spec.head:
        return (MTP,)
    if spec.precision != AUTO:
        return (spec.precision,)
    own = ("int8", "fast") if loaded.device.type == "cpu" else ("fast",)
    return (*own, MTP) if loaded.config.has_mtp else own


def _unpacked(loaded: LoadedModel) -> bool:
    """Whether ``loaded``'s matrices are its checkpoint's tensors, which another module can share."""
    return loaded.precision.gemv in ("exact", "plain")


def on_tensors(loaded: LoadedModel, gemv: str, tuner: KernelTuner) -> GPT:
    """A model on ``loaded``'s own tensors (nothing copied) under ``gemv``'s kernels."""
    with torch.device("meta"):
        model = GPT(loaded.config)
    model.load_state_dict(loaded.model.state_dict(), strict=True, assign=True)
    model.prepare(loaded.device, loaded.precision.compute, gemv, tuner)
    return model.eval()


def _shared(loaded: LoadedModel, precision: str, kernel_cache: Path | None) -> GPT | None:
    """The target's tensors under ``precision``'s kernels, or None where they cannot be shared."""
    wanted = pick_precision(loaded.device, precision)
    if not _unpacked(loaded) or wanted.compute != loaded.precision.compute:
        return None
    return on_tensors(loaded, wanted.gemv, tuner_for(kernel_cache))


def why_stays_eager(loaded: LoadedModel) -> str | None:
    """Why ``loaded``'s forward cannot be compiled (engine/decode/compiled_draft.py) where it
    could gain, or None: it can on the CPU (a GPU step is launches, not dispatch), in fp32 on its
    own tensors, which its twin shares (plain ``F.linear`` kernels, which dynamo traces whole)."""
    if loaded.device.type != "cpu" or not _unpacked(loaded) or loaded.precision.compute != torch.float32:
        return f"{loaded.precision.compute} {loaded.precision.gemv} kernels on {loaded.device.type}"
    return why_not_compiled()


def _compile_in_background(draft: Draft, other: LoadedModel) -> None:
    """Start compiling a checkpoint draft's forward, where it can be and may pay (it was not
    found slower here before: pass_timing.Decisions)."""
    why = why_stays_eager(other)
    if why is None and not draft.should_compile():
        why = "its compiled form was slower here (Re-measure kernels to time it again)"
    if why is not None:
        logger.info("draft %s stays eager: %s", draft.name, why)
        return
    draft.twin = compile_twin(other)


def verifier_compile(loaded: LoadedModel) -> Callable[[], CompiledTwin] | None:
    """What starts compiling the target's verifying passes (engine/decode/verifier.py), or None
    where that cannot be or would not pay (the log says why)."""
    why = why_stays_eager(loaded)
    reads = loaded.model.decode_bytes()
    if why is None and reads > SMALL_TARGET_BYTES:
        why = f"a step reads {reads >> 20} MB of weights, past {SMALL_TARGET_BYTES >> 20} MB"
    if why is not None:
        logger.info("the target's verifying passes stay eager: %s", why)
        return None
    return partial(compile_twin, loaded, rows=VERIFIED_ROWS, every_row=True)


def step_compile(loaded: LoadedModel) -> tuple[Callable[[], CompiledTwin] | None, str]:
    """What starts compiling ``loaded``'s own one-row step for plain replies
    (engine/decode/compiled_step.py), or None and why not (a few words): only fast and int8 mode
    on a CPU, which owe no bits, where a C++ compiler is found."""
    if loaded.device.type != "cpu" or loaded.precision.gemv not in APPROXIMATE_KINDS:
        return None, ""
    why = why_not_compiled()
    if why is not None:
        logger.info("plain steps stay eager: %s", why)
        return None, "eager steps (no compiler toolchain)"
    model, cfg = loaded.model, loaded.config

    def make() -> CompiledTwin:
        # Its whole rotary table at once (see compile_twin), made as the decode loop makes its
        # tensors: compiled code takes it as a constant.
        with torch.inference_mode():
            model.set_rotary(loaded.device, loaded.precision.compute, cfg.rope_len)
        return CompiledTwin(model, cache_of(model), warm_positions(cfg, 1), rows=1)

    key = f"{loaded.directory.resolve()}@{loaded.step} {loaded.precision} one-row step"
    return partial(shared_twin, key, make), ""


def compile_twin(
    loaded: LoadedModel, backend: str = "inductor", rows: int = COMPILED_ROWS, every_row: bool = False
) -> CompiledTwin:
    """Start compiling a twin of ``loaded`` (its own tensors; plain kernels, or inlined ones for a
    small model) with ``backend``, for passes of up to ``rows`` rows (``every_row``: see
    :class:`CompiledTwin`)."""
    kind = "inlined" if loaded.model.decode_bytes() <= INLINED_BYTES else "plain"

    def make() -> CompiledTwin:
        twin = on_tensors(loaded, kind, tuner_for(None))
        # Its whole rotary table at once: a table grown mid-reply is a branch the compiled code
        # was not warmed up for, so every pass after it would run eagerly.
        twin.set_rotary(loaded.device, loaded.precision.compute, loaded.config.rope_len)
        positions = warm_positions(loaded.config, rows)
        return CompiledTwin(twin, cache_of(twin), positions, backend, rows, every_row)

    # Once in the process for a checkpoint's step, kernels, rows and passes (two Compare panes of
    # one model, the model loaded again while its compile runs).
    what = f"{rows} rows, {'every row' if every_row else 'last row'}"
    key = f"{loaded.directory.resolve()}@{loaded.step} {loaded.precision} {kind} {backend} {what}"
    return shared_twin(key, make)


def warm_positions(cfg: ModelConfig, rows: int = COMPILED_ROWS) -> list[int]:
    """Where a twin compiled for passes of up to ``rows`` rows is warmed up: two positions a few
    tokens in (dynamo compiles the first position it meets as a constant, and makes it symbolic
    once it meets another), and past each sliding window shorter than the context (attention
    then skips the keys before the window: another graph)."""
    past = [w + WARM_PAST for w in set(cfg.window_sizes()) if w + WARM_PAST + rows < cfg.rope_len]
    return sorted({WARM_PAST, 2 * WARM_PAST, *past})


def cache_of(model: GPT) -> Callable[[int], KVCache]:
    return lambda capacity: KVCache(model.config, 1, capacity, model.device, model.compute_dtype)


def _self_draft(
    loaded: LoadedModel, precision: str, kernel_cache: Path | None, decisions: Decisions | None
) -> Draft:
    model = _shared(loaded, precision, kernel_cache)
    if model is None:
        model = load_model(
            loaded.directory, loaded.step, str(loaded.device), precision, kernel_cache=kernel_cache
        ).model
    release_freed_memory()  # conversions and tuning buffers, freed, go back to the OS
    target = loaded.model
    name = f"self ({precision})"
    kept = decisions.under(name) if decisions is not None else None
    return ready_draft(model, name, model.config.rope_len, cache_of(model), target, cache_of(target), kept)


def _head_draft(loaded: LoadedModel, decisions: Decisions | None) -> Draft:
    """The checkpoint's MTP head reading the target's hidden states, its costs measured (one line
    where it has none)."""
    target = loaded.model
    model = HeadDraft(target, load_head(loaded))
    release_freed_memory()  # the mapped file's pages and the conversions go back to the OS
    draft = Draft(model, "MTP head", target.config.rope_len, model.new_cache, cap=1, needs=2, follow=follow)
    if decisions is not None:
        draft.decisions = decisions.under(draft.name)
    measure_costs(target, cache_of(target), draft)
    return draft


def make_draft(
    loaded: LoadedModel,
    tok: Tokenizer,
    spec: DraftSpec,
    find_tokenizer: FindTokenizer,
    kernel_cache: Path | None = None,
    compile_draft: bool = False,
    decisions: Decisions | None = None,
) -> Draft:
    """The draft ``spec`` names for the target ``loaded`` (whose tokenizer is ``tok``).
    ``compile_draft``: a checkpoint draft's forward is compiled in the background, where it can.
    ``decisions``: where the target's speculative decisions are kept (each draft's under it)."""
    if spec.checkpoint is None:
        makers = [
            partial(_head_draft, loaded, decisions)
            if made == MTP
            else partial(_self_draft, loaded, made, kernel_cache, decisions)
            for made in self_candidates(loaded, spec)
        ]
        return cheapest(makers)
    other = load_model(
        spec.checkpoint, spec.step, str(loaded.device), spec.precision, kernel_cache=kernel_cache
    )
    cfg = other.config
    check_same_tokenizer(find_tokenizer(other.directory, cfg.vocab_size, cfg.is_fork), tok)
    model, target = other.model, loaded.model
    name = f"{other.directory.name} · step {other.step:,}"
    which = f"{other.directory.resolve()} step {other.step} {other.precision.name}"
    kept = decisions.under(which) if decisions is not None else None
    draft = ready_draft(model, name, model.config.rope_len, cache_of(model), target, cache_of(target), kept)
    if compile_draft:
        _compile_in_background(draft, other)
    return draft
