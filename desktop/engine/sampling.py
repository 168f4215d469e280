"""Next-token sampling.

With top-p, min-p and the repetition penalty off, this is nanochat's ``sample_next_token`` op for
op (same torch calls in the same order, the same Generator use), so a seed reproduces nanochat's
tokens exactly. The extra filters are applied only when they are switched on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .params import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty on tokens in ``history`` (B, N): divide positive logits, multiply negative ones."""
    picked = logits.gather(1, history)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter(1, history, picked)


def _filter_probs(probs: torch.Tensor, top_p: float, min_p: float) -> torch.Tensor:
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    if top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(dim=-1)
        drop = (cum - sorted_p) >= top_p * cum[..., -1:]  # keep the smallest prefix reaching top_p
        probs = probs.scatter(1, order, sorted_p.masked_fill(drop, 0.0))
    return probs


def sample_next(
    logits: torch.Tensor, rng: torch.Generator, params: SamplingParams, history: torch.Tensor | None = None
) -> torch.Tensor:
    """Sample one token per row from ``logits`` (B, V) float32. Returns (B, 1) int64."""
    if params.repetition_penalty != 1.0 and history is not None and history.numel():
        logits = apply_repetition_penalty(logits, history, params.repetition_penalty)
    temperature, top_k = params.temperature, params.top_k
    if temperature == 0.0:
        return torch.argmax(logits, dim=-1, keepdim=True)
    if top_k > 0:
        k = min(top_k, logits.size(-1))
        vals, idx = torch.topk(logits, k, dim=-1)
        vals = vals / temperature
        probs = F.softmax(vals, dim=-1)
        if not params.plain:
            probs = _filter_probs(probs, params.top_p, params.min_p)
        choice = torch.multinomial(probs, num_samples=1, generator=rng)
        return idx.gather(1, choice)
    logits = logits / temperature
    probs = F.softmax(logits, dim=-1)
    if not params.plain:
        probs = _filter_probs(probs, params.top_p, params.min_p)
    return torch.multinomial(probs, num_samples=1, generator=rng)
