"""Speculative decoding samples the target's own distribution (issue #22's contract).

A tiny E7 model with an 8-token vocabulary, and a draft that agrees with it about half the time
(its weights nudged), so proposals are both kept and rejected. For each sampling setting the
loop runs with hundreds of seeds; at each of the first three positions the tokens it gave are
compared, by a chi-square test, with the exact marginal distribution of the target's plain
sampler there, enumerated over every path (the same filtered distribution ``sample_next``
draws from: that identity is tested first, on a batch of draws).
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from support.tiny_models import cache_of, draft_of, ids_tokenizer, nudged, tiny_gpt, tiny_state

from desktop.engine.backend import GenerationStats
from desktop.engine.decode.sampling import draw_token, next_token_probs, sample_next
from desktop.engine.decode.speculative import stream_speculative
from desktop.engine.params import SamplingParams

VOCAB = 8
PROMPT = [1, 5, 2]
POSITIONS = 3
RUNS = 500
# A test at this level fails by chance once in a thousand; the seeds are fixed, so it never flaps.
ALPHA = 1e-3
SETTINGS = {
    "temperature": SamplingParams(temperature=1.0),
    "top-k": SamplingParams(temperature=0.7, top_k=4),
    "top-p": SamplingParams(temperature=1.2, top_p=0.8),
    "min-p": SamplingParams(temperature=1.0, min_p=0.15),
    "repetition": SamplingParams(temperature=1.0, repetition_penalty=1.8),
    "all": SamplingParams(temperature=0.9, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
}


@pytest.fixture(scope="module")
def models():
    state = tiny_state(VOCAB, seed=0)
    return tiny_gpt(state, VOCAB), tiny_gpt(nudged(state, seed=1, amount=0.3), VOCAB)


def chi_square_p(observed: Counter, expected: torch.Tensor, n: int) -> float:
    """The p-value of ``observed`` counts against the distribution ``expected``; bins expected
    fewer than 5 times are pooled (the test's approximation needs it)."""
    want = expected.double() * n
    big = want >= 5
    obs = torch.tensor([observed.get(i, 0) for i in range(len(expected))], dtype=torch.float64)
    o = torch.cat([obs[big], obs[~big].sum().view(1)]) if (~big).any() else obs[big]
    e = torch.cat([want[big], want[~big].sum().view(1)]) if (~big).any() else want[big]
    keep = e > 0
    stat = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


@torch.inference_mode()
def marginals(model, params: SamplingParams, prompt: list[int] = PROMPT) -> list[torch.Tensor]:
    """The exact distribution of the token at each position under the plain sampler: every path
    to that position weighted by its probability (the repetition penalty sees the whole path)."""
    out = []
    paths: list[tuple[list[int], float]] = [([], 1.0)]
    for _ in range(POSITIONS):
        seqs = torch.tensor([prompt + p for p, _ in paths])
        probs = next_token_probs(model(seqs)[:, -1], params, seqs).double()
        weights = torch.tensor([w for _, w in paths], dtype=torch.float64)
        out.append((weights[:, None] * probs).sum(0))
        paths = [
            ([*p, t], w * float(probs[i, t]))
            for (i, (p, w)), t in itertools.product(enumerate(paths), range(probs.size(-1)))
            if probs[i, t] > 0
        ]
    return out


_SAMPLED: dict[tuple[str, int], tuple[list[Counter], GenerationStats]] = {}


def speculative_samples(models, name: str, draft_k: int) -> tuple[list[Counter], GenerationStats]:
    """The tokens at each position over :data:`RUNS` seeds (kept for the module: the power test
    reuses a setting's samples)."""
    if (name, draft_k) not in _SAMPLED:
        _SAMPLED[name, draft_k] = _sample(models, SETTINGS[name], draft_k)
    return _SAMPLED[name, draft_k]


def _sample(models, params: SamplingParams, draft_k: int) -> tuple[list[Counter], GenerationStats]:
    target, draft_model = models
    draft = draft_of(draft_model)
    counts = [Counter() for _ in range(POSITIONS)]
    stats = GenerationStats()
    tok = ids_tokenizer(VOCAB)
    for seed in range(RUNS):
        draft.cache = None
        run = params.with_values(seed=seed, max_tokens=POSITIONS)
        events = stream_speculative(
            target,
            tok,
            PROMPT,
            run,
            draft,
            cache=cache_of(target),
            limit=64,
            stats=stats,
            draft_k=draft_k,
            threads=1,
        )
        for i, ev in enumerate(e for e in events if not e.continues):
            counts[i][ev.id] += 1
    return counts, stats


@pytest.mark.parametrize("name", list(SETTINGS))
def test_next_token_probs_is_the_distribution_sample_next_draws_from(models, name):
    params = SETTINGS[name]
    target, _ = models
    with torch.inference_mode():
        logits = target(torch.tensor([PROMPT]))[:, -1]
    history = torch.tensor([PROMPT])
    draws = 20000
    rng = torch.Generator().manual_seed(0)
    got = sample_next(logits.expand(draws, -1), rng, params, history.expand(draws, -1))[:, 0]
    expected = next_token_probs(logits, params, history)[0]
    assert chi_square_p(Counter(got.tolist()), expected, draws) > ALPHA


def test_a_drawn_token_is_distributed_as_its_probabilities_and_never_one_of_none():
    """Speculative decoding's draws (the inverse of the CDF, not multinomial): a chi-square test
    over 20,000 draws, from weights that do not sum to 1 and are zero at both ends and between."""
    weights = torch.tensor([0.0, 3.0, 0.0, 1.0, 1e-3, 5.0, 0.0, 0.5, 0.0])
    rng = torch.Generator().manual_seed(0)
    draws = 20000
    got = Counter(draw_token(weights, rng) for _ in range(draws))
    assert not {i for i in got if weights[i] == 0}
    assert chi_square_p(got, weights / weights.sum(), draws) > ALPHA


@pytest.mark.parametrize("name", list(SETTINGS))
def test_each_position_is_distributed_as_the_targets_own_samples(models, name):
    params = SETTINGS[name]
    # A fixed length for half the settings, the adaptive one for the others: both must hold.
    counts, stats = speculative_samples(models, name, 2 if name in ("temperature", "min-p", "all") else 0)
    # Both paths ran many times: proposals kept, and proposals rejected (then resampled).
    assert min(stats.accepted, stats.drafted - stats.accepted) >= 100
    for position, (seen, want) in enumerate(zip(counts, marginals(models[0], params), strict=True)):
        assert sum(seen.values()) == RUNS
        p = chi_square_p(seen, want, RUNS)
        assert p > ALPHA, f"position {position + 1}: p = {p:.2e}, {dict(seen)} vs {(want * RUNS).tolist()}"


def test_the_chi_square_test_tells_the_draft_from_the_target(models):
    """The test has the power to see a wrong distribution: the same samples are far from the
    draft's own marginals."""
    counts, _ = speculative_samples(models, "temperature", 2)
    draft_marginals = marginals(models[1], SETTINGS["temperature"])
    assert (
        min(chi_square_p(seen, want, RUNS) for seen, want in zip(counts, draft_marginals, strict=True)) < 1e-6
    )
