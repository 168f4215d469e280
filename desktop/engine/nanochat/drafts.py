"""Drafts for speculative decoding of a nanochat checkpoint (engine/decode/speculative.py).

A self-draft is the target's own weights in int8 or 16-bit kernels. When the target computes in
exact fp32 its weights are shared, not read again: the draft module is built on the target's
tensors and only the packed forms are new (an int8 draft of d20 costs about a quarter of the
target's matrices, nothing of its embeddings). Otherwise (the target is itself packed, or the
draft computes in another dtype) the checkpoint is loaded again at the draft's precision.

A checkpoint draft is another nanochat checkpoint (an earlier step, a smaller depth) whose
tokenizer gives ids the same meaning as the target's, compared by content.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from desktop.engine.decode.drafts import AUTO, DraftSpec, check_same_tokenizer
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.protocols import Tokenizer
from desktop.engine.decode.speculative import Draft, cheapest, ready_draft
from desktop.engine.kernels.device import pick_precision
from desktop.engine.kernels.memory import release_freed_memory
from desktop.engine.kernels.tuning import tuner_for
from desktop.engine.nanochat.loader import LoadedModel, load_model
from desktop.engine.nanochat.model import GPT

# (checkpoint directory, its vocab size, whether it is a fork) -> its tokenizer
FindTokenizer = Callable[[Path, int, bool], Tokenizer]


def self_precisions(device: torch.device, name: str) -> tuple[str, ...]:
    """The precisions a self-draft named ``name`` may take: ``auto`` is the cheaper of int8 and
    fp16 on a CPU (timed), the fast 16-bit form elsewhere."""
    if name != AUTO:
        return (name,)
    return ("int8", "fast") if device.type == "cpu" else ("fast",)


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


def make_draft(
    loaded: LoadedModel,
    tok: Tokenizer,
    spec: DraftSpec,
    find_tokenizer: FindTokenizer,
    kernel_cache: Path | None = None,
) -> Draft:
    """The draft ``spec`` names for the target ``loaded`` (whose tokenizer is ``tok``)."""
    if spec.is_self:
        makers = [
            partial(_self_draft, loaded, precision, kernel_cache)
            for precision in self_precisions(loaded.device, spec.precision)
        ]
        return cheapest(makers)
    assert spec.checkpoint is not None
    other = load_model(
        spec.checkpoint, spec.step, str(loaded.device), spec.precision, kernel_cache=kernel_cache
    )
    cfg = other.config
    check_same_tokenizer(find_tokenizer(other.directory, cfg.vocab_size, cfg.is_fork), tok)
    model, target = other.model, loaded.model
    name = f"{other.directory.name} · step {other.step:,}"
    return ready_draft(model, name, model.config.rope_len, _cache_of(model), target, _cache_of(target))
