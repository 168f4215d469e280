"""Tiny random nanochat models built in memory (no files), for tests that run a decode loop
thousands of times: the current architecture (E7, with its smear history) at a vocabulary small
enough that every next-token distribution can be enumerated exactly."""

from __future__ import annotations

import torch

from desktop.engine.bench import IdsOnlyTokenizer
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.speculative import Draft
from desktop.engine.nanochat.classify import expected_shapes
from desktop.engine.nanochat.config import e7_config
from desktop.engine.nanochat.model import GPT


def tiny_state(vocab: int, seed: int, layers: int = 1, embd: int = 32) -> dict[str, torch.Tensor]:
    """Random weights, scaled so each next-token distribution spreads over a few tokens."""
    cfg = e7_config(64, vocab, layers, 2, embd)
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for key, shape in expected_shapes(cfg).items():
        fan_in = shape[-1] if len(shape) > 1 else 1
        sd[key] = torch.randn(shape, generator=g) * (1.0 / fan_in**0.5 if len(shape) > 1 else 0.3)
    sd["lm_head.weight"] *= 3.0
    sd["resid_lambdas"] = torch.ones(layers)
    sd["x0_lambdas"] = torch.full((layers,), 0.1)
    return sd


def tiny_gpt(state: dict[str, torch.Tensor], vocab: int, layers: int = 1, embd: int = 32) -> GPT:
    with torch.device("meta"):
        model = GPT(e7_config(64, vocab, layers, 2, embd))
    model.load_state_dict(state, strict=True, assign=True)
    model.prepare(torch.device("cpu"), torch.float32, "exact")
    return model.eval()


def nudged(state: dict[str, torch.Tensor], seed: int, amount: float) -> dict[str, torch.Tensor]:
    """``state`` with every weight moved by ``amount`` times its own scale of noise: a draft that
    agrees with the model often, not always."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + amount * v.abs().mean() * torch.randn(v.shape, generator=g) for k, v in state.items()}


def cache_of(model: GPT, capacity: int = 32) -> KVCache:
    return KVCache(model.config, 1, capacity, model.device, model.compute_dtype)


def draft_of(model: GPT, cost: float = 0.3, verify_cost: float = 0.1) -> Draft:
    """``model`` as a draft whose costs are given, not timed (a test's draft lengths then do not
    depend on the machine)."""
    return Draft(model, "tiny", model.config.rope_len, lambda n: cache_of(model, n), cost, verify_cost)


def ids_tokenizer(vocab: int) -> IdsOnlyTokenizer:
    return IdsOnlyTokenizer(vocab)
