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

from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from desktop.engine.decode.drafts import AUTO, MTP, DraftSpec, check_same_tokenizer
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.protocols import Tokenizer
from desktop.engine.decode.speculative import Draft, cheapest, measure_costs, ready_draft
from desktop.engine.kernels.device import pick_precision
from desktop.engine.kernels.memory import release_freed_memory
from desktop.engine.kernels.tuning import tuner_for
from desktop.engine.nanochat.loader import LoadedModel, load_model
from desktop.engine.nanochat.model import GPT
from desktop.engine.nanochat.mtp import HeadDraft, follow, load_head

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


def _shared(loaded: LoadedModel, precision: str, kernel_cache: Path | None) -> GPT | None:
    """The target's tensors under ``precision``'s kernels, or None where they cannot be shared."""
    wanted = pick_precision(loaded.device, precision)
    if loaded.precision.gemv not in ("exact", "plain") or wanted.compute != loaded.precision.compute:
        return None
    with torch.device("meta"):
        model = GPT(loaded.config)
    model.load_state_dict(loaded.model.state_dict(), strict=True, assign=True)
    model.prepare(loaded.device, wanted.compute, wanted.gemv, tuner_for(kernel_cache))
    return model.eval()


def _cache_of(model: GPT) -> Callable[[int], KVCache]:
    return lambda capacity: KVCache(model.config, 1, capacity, model.device, model.compute_dtype)


def _self_draft(loaded: LoadedModel, precision: str, kernel_cache: Path | None) -> Draft:
    model = _shared(loaded, precision, kernel_cache)
    if model is None:
        model = load_model(
            loaded.directory, loaded.step, str(loaded.device), precision, kernel_cache=kernel_cache
        ).model
    release_freed_memory()  # conversions and tuning buffers, freed, go back to the OS
    target = loaded.model
    name = f"self ({precision})"
    return ready_draft(model, name, model.config.rope_len, _cache_of(model), target, _cache_of(target))


def _head_draft(loaded: LoadedModel) -> Draft:
    """The checkpoint's MTP head reading the target's hidden states, its costs measured (one line
    where it has none)."""
    target = loaded.model
    model = HeadDraft(target, load_head(loaded))
    release_freed_memory()  # the mapped file's pages and the conversions go back to the OS
    draft = Draft(model, "MTP head", target.config.rope_len, model.new_cache, cap=1, needs=2, follow=follow)
    measure_costs(target, _cache_of(target), draft)
    return draft


def make_draft(
    loaded: LoadedModel,
    tok: Tokenizer,
    spec: DraftSpec,
    find_tokenizer: FindTokenizer,
    kernel_cache: Path | None = None,
) -> Draft:
    """The draft ``spec`` names for the target ``loaded`` (whose tokenizer is ``tok``)."""
    if spec.checkpoint is None:
        makers = [
            partial(_head_draft, loaded) if made == MTP else partial(_self_draft, loaded, made, kernel_cache)
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
    return ready_draft(model, name, model.config.rope_len, _cache_of(model), target, _cache_of(target))
