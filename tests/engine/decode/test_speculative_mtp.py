"""The fork's MTP head drafting for its own trunk (issue #22): its next-token distribution is the
fork's formula (nanochat/mtp.py at 7e9ffe4) computed from scratch over a full forward pass; greedy
replies are the target's own and sampled ones keep its distribution (the contract test's
chi-square); both caches equal a fresh prefill after rejections; it proposes one token a round;
a checkpoint without the head is one line, in the backend and on the command line.

The golden case engram-mhc-mtp-swiglu was trained briefly by the fork's own code with the MTP loss
on: its head's weights are not the zeros the fork starts ``proj`` at, and its proposals are both
kept and rejected.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from support.golden import GOLDEN, PYTHON_END, check, manifest, reference
from support.reference_model import apply_rope, norm, reference_hidden, rope_tables
from test_speculative_contract import ALPHA, POSITIONS, chi_square_p, marginals

from desktop.cli.main import EXIT_ERROR, main
from desktop.engine.backend import GenerationStats, LoadOptions, Prompt, StreamOptions
from desktop.engine.bench import IdsOnlyTokenizer
from desktop.engine.decode.drafts import DraftSpec, parse_draft
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.speculative import Draft, DraftLength, cheapest, stream_speculative
from desktop.engine.errors import CheckpointError
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.nanochat.drafts import VERIFIED_ROWS, compile_twin, self_candidates
from desktop.engine.nanochat.mtp import follow
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

CASE = GOLDEN / "fork" / "engram-mhc-mtp-swiglu"
HEADLESS = GOLDEN / "fork" / "engram"
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)
RUNS = 500
# The first case's question cut mid-number ("What is 1"): the model must guess the rest, so its
# next tokens spread (further on, the tiny model is all but certain, and every proposal is kept).
CUT = 6
# Filtered settings only: the exact marginals enumerate every path a 300-token vocabulary allows.
SAMPLED = {
    "top-k": SamplingParams(temperature=1.0, top_k=4),
    "all": SamplingParams(temperature=0.9, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
}


def open_case(case: Path) -> NanochatBackend:
    m = manifest(case)
    return NanochatBackend.open(
        case / "chatsft_checkpoints" / m["tag"],
        LoadOptions(step=m["step"], device="cpu", dtype="float32", base_dir=case),
    )


@pytest.fixture(scope="module")
def golden():
    backend = open_case(CASE)
    yield manifest(CASE), backend
    backend.close()


def events_of(backend, ids, params, **options):
    stats = GenerationStats()
    prompt = Prompt((), tuple(ids), len(ids), backend.info().context_length)
    stream = backend.stream(prompt, params, threading.Event(), StreamOptions(threads=1, **options), stats)
    return [e for e in stream if not e.continues], stats


def fork_mtp_logits(sd: dict[str, torch.Tensor], mc: dict, ids: list[int]) -> torch.Tensor:
    """The fork's MTPModule.forward at inference, from its formula: row i ([T-1, V]) predicts
    token i+2 from the trunk's final-normed state at i (a full forward pass) and token i+1:
    ``proj([rmsnorm(h); rmsnorm(wte(next))])``, a plain Block (pre-norm attention with RoPE at i
    then QK-norm, full causal, SwiGLU MLP), rmsnorm, the shared lm_head, softcap 15."""
    w = {k.removeprefix("mtp."): v.float() for k, v in sd.items() if k.startswith("mtp.")}
    h = reference_hidden(sd, mc, "fork", ids)[:-1]
    T, C = h.shape
    H, Hkv = int(mc["n_head"]), int(mc["n_kv_head"])
    hd = C // H
    e = sd["transformer.wte.weight"].float()[torch.tensor(ids[1:])]
    x = torch.cat([norm(h), norm(e)], dim=-1) @ w["proj.weight"].T
    xn = norm(x)
    q = (xn @ w["block.attn.c_q.weight"].T).view(T, H, hd)
    k = (xn @ w["block.attn.c_k.weight"].T).view(T, Hkv, hd)
    v = (xn @ w["block.attn.c_v.weight"].T).view(T, Hkv, hd)
    cos, sin = rope_tables(T, hd, float(mc["rope_theta"]), bf16=True)
    q, k = norm(apply_rope(q, cos, sin)), norm(apply_rope(k, cos, sin))
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v).reshape(T, C)
    x = x + y @ w["block.attn.c_proj.weight"].T
    xn = norm(x)
    hidden = F.silu(xn @ w["block.mlp.c_gate.weight"].T) * (xn @ w["block.mlp.c_fc.weight"].T)
    x = x + hidden @ w["block.mlp.c_proj.weight"].T
    logits = (norm(x) @ sd["lm_head.weight"].float().T)[:, : int(mc["vocab_size"])]
    return 15.0 * torch.tanh(logits / 15.0)


def raw_checkpoint(m: dict) -> tuple[dict[str, torch.Tensor], dict]:
    folder = CASE / "chatsft_checkpoints" / m["tag"]
    sd = torch.load(folder / f"model_{m['step']:06d}.pt", map_location="cpu", weights_only=True)
    meta = json.loads((folder / f"meta_{m['step']:06d}.json").read_text(encoding="utf-8"))
    return sd, meta["model_config"]


def test_the_head_was_trained_not_left_at_the_forks_zero_init(golden):
    sd, _ = raw_checkpoint(golden[0])
    assert (
        sd["mtp.proj.weight"].abs().mean() > 0.01 and sd["mtp.block.attn.c_proj.weight"].abs().mean() > 0.01
    )


@torch.inference_mode()
def test_the_heads_next_token_distribution_is_the_forks_formula(golden):
    """As in a round: the target holds all but the token just sampled, and the head reads every
    token, fed in two pieces (a reused prefix, then the rest) to a cache following the target's."""
    m, backend = golden
    sd, mc = raw_checkpoint(m)
    draft = backend.draft("mtp")
    head, target = draft.model, backend.model
    for c in m["cases"]:
        whole = c["prompt_ids"] + c["naive_greedy"][:12]
        for length in (2, len(c["prompt_ids"]), len(whole)):
            seq = torch.tensor([whole[:length]])
            held = KVCache(target.config, 1, 4, target.device, target.compute_dtype)
            cache = head.new_cache(4)
            follow(cache, held)
            target(seq[:, :-1], held)
            cut = max(2, length // 2)
            if cut < length:  # a prefix first, as a reused cache holds one
                head(seq[:, :cut], cache)
            got = torch.softmax(head(seq[:, cache.pos :], cache, last_only=True)[0, -1], dim=-1)
            want = torch.softmax(fork_mtp_logits(sd, mc, whole[:length])[-1], dim=-1)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_greedy_replies_with_the_head_drafting_are_the_targets_own(golden):
    """Each case's greedy reply is the fork's own (its GPT.generate) and the plain loop's; the head
    proposes one token a round even when asked for three, so no kept proposal follows another."""
    m, backend = golden
    drafted = accepted = 0
    for c in m["cases"]:
        plain, _ = events_of(backend, c["prompt_ids"], GREEDY)
        got, stats = events_of(backend, c["prompt_ids"], GREEDY, draft="mtp", draft_k=3)
        ids = [e.id for e in got]
        assert ids == [e.id for e in plain]
        check(m, ids, reference(m, c)[0], PYTHON_END, c["text"])
        marks = [e.draft for e in got]
        assert all(not (a == b == "accepted") for a, b in itertools.pairwise(marks))
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > accepted > 0
    # A one-token prompt: the head has no state before the first token, so the first round is plain.
    first = m["cases"][0]["prompt_ids"][:1]
    plain, _ = events_of(backend, first, GREEDY)
    got, stats = events_of(backend, first, GREEDY, draft="mtp", draft_k=1)
    assert [e.id for e in got] == [e.id for e in plain] and stats.drafted > 0


_SAMPLES: dict[str, tuple[list[Counter], GenerationStats]] = {}


def head_samples(golden, name: str) -> tuple[list[Counter], GenerationStats]:
    """Tokens at each position over :data:`RUNS` seeds, the head drafting (costs given, not timed,
    so the adaptive length does not depend on the machine)."""
    if name not in _SAMPLES:
        m, backend = golden
        draft = replace(backend.draft("mtp"), cost=0.1, verify_cost=0.1, cache=None)
        prompt = m["cases"][0]["prompt_ids"][:CUT]
        counts = [Counter() for _ in range(POSITIONS)]
        stats = GenerationStats()
        tok = IdsOnlyTokenizer(backend.tok.vocab_size)  # no stop token: every run has every position
        target = backend.model
        for seed in range(RUNS):
            draft.cache = None
            cache = KVCache(target.config, 1, 16, target.device, target.compute_dtype)
            params = SAMPLED[name].with_values(seed=seed, max_tokens=POSITIONS)
            events = stream_speculative(
                target, tok, prompt, params, draft, cache=cache, limit=64, stats=stats, threads=1
            )
            for i, ev in enumerate(e for e in events if not e.continues):
                counts[i][ev.id] += 1
        _SAMPLES[name] = (counts, stats)
    return _SAMPLES[name]


@pytest.mark.parametrize("name", list(SAMPLED))
def test_sampled_replies_keep_the_targets_distribution(golden, name):
    m, backend = golden
    counts, stats = head_samples(golden, name)
    assert min(stats.accepted, stats.drafted - stats.accepted) >= 100  # both paths ran many times
    want = marginals(backend.model, SAMPLED[name], m["cases"][0]["prompt_ids"][:CUT])
    for position, (seen, expected) in enumerate(zip(counts, want, strict=True)):
        p = chi_square_p(seen, expected, RUNS)
        assert p > ALPHA, f"position {position + 1}: p = {p:.2e}"


@torch.inference_mode()
def test_both_caches_equal_a_fresh_prefill_after_rejections(golden):
    """Replies to every case one after the other, the caches reused (each keeps the prefix it
    shares with the next prompt): what they then hold is what a fresh pass over it computes."""
    m, backend = golden
    target = backend.model
    draft = replace(backend.draft("mtp"), cache=None)
    cache = KVCache(target.config, 1, 8, target.device, target.compute_dtype)
    stats = GenerationStats()
    prompts = [c["prompt_ids"][:cut] for cut in (CUT, None) for c in m["cases"]]
    for seed, prompt in enumerate(prompts * 2):
        params = SamplingParams(temperature=1.0, max_tokens=24, seed=seed)
        events = stream_speculative(
            target,
            backend.tok,
            prompt,
            params,
            draft,
            cache=cache,
            limit=256,
            stats=stats,
            draft_k=1,
            threads=1,
        )
        list(events)
    assert stats.drafted > stats.accepted > 0
    p, held = cache.pos, draft.cache
    fresh = KVCache(target.config, 1, p, target.device, target.compute_dtype)
    fresh.keep_hidden(True)
    target(cache.tokens[:, :p], fresh)
    for mine, theirs in ((cache.k, fresh.k), (cache.v, fresh.v)):
        torch.testing.assert_close(mine[:, :, :p], theirs[:, :, :p], atol=1e-5, rtol=1e-5)
    for layer, z in cache.engram.items():
        torch.testing.assert_close(z[:, :p], fresh.engram[layer][:, :p], atol=1e-5, rtol=1e-5)
    assert cache.hidden is not None and fresh.hidden is not None
    torch.testing.assert_close(cache.hidden[:, :p], fresh.hidden[:, :p], atol=1e-5, rtol=1e-5)
    n = held.pos
    assert 2 <= n <= p and torch.equal(held.tokens[:, :n], cache.tokens[:, :n])
    again = draft.model.new_cache(n)
    follow(again, fresh)
    draft.model(held.tokens[:, :n], again)
    for mine, theirs in ((held.kv.k, again.kv.k), (held.kv.v, again.kv.v)):
        torch.testing.assert_close(mine[:, :, : n - 1], theirs[:, :, : n - 1], atol=1e-5, rtol=1e-5)


def test_keeping_hidden_states_changes_no_logit_and_plain_decoding_stops_it(golden):
    m, backend = golden
    target, ids = backend.model, torch.tensor([m["cases"][0]["prompt_ids"]])
    with torch.inference_mode():
        plain = target(ids, KVCache(target.config, 1, 16, target.device, target.compute_dtype))
        kept = KVCache(target.config, 1, 16, target.device, target.compute_dtype)
        kept.keep_hidden(True)
        assert torch.equal(target(ids, kept), plain)
    events_of(backend, m["cases"][0]["prompt_ids"], GREEDY, draft="mtp", draft_k=1)
    assert backend._cache is not None and backend._cache.hidden is not None
    events_of(backend, m["cases"][0]["prompt_ids"], GREEDY)
    assert backend._cache.hidden is None


def test_the_head_is_named_mtp_and_auto_weighs_it_where_the_checkpoint_has_one(golden):
    _m, backend = golden
    assert parse_draft("mtp") == DraftSpec("mtp", head=True) and parse_draft(" MTP ").head
    assert not parse_draft("mtp").is_self
    assert self_candidates(backend.loaded, parse_draft("auto")) == ("int8", "fast", "mtp")
    assert self_candidates(backend.loaded, parse_draft("mtp")) == ("mtp",)
    assert backend.draft("auto").name in ("self (int8)", "self (fast)", "MTP head")
    assert backend.info().capabilities.draft_head
    headless = open_case(HEADLESS)
    assert self_candidates(headless.loaded, parse_draft("auto")) == ("int8", "fast")
    assert not headless.info().capabilities.draft_head
    headless.close()


def test_a_draft_cap_bounds_fixed_and_adaptive_lengths_and_ranks_drafts():
    capped = DraftLength(cost=0.05, verify_cost=0.05, fixed=3, cap=1)
    assert capped.next() == 1
    adaptive = DraftLength(cost=0.05, verify_cost=0.05, cap=1)
    for _ in range(10):
        k = adaptive.next()
        assert k <= 1
        if k:
            adaptive.record(k, k)
    assert DraftLength(cost=0.05, verify_cost=0.05).next() > 1  # uncapped, the same draft goes longer

    # A draft cheaper per step that proposes one token a round loses to one that proposes more.
    def made(cost: float, cap: int | None) -> Draft:
        return Draft(None, f"cap {cap}", 64, lambda n: None, cost, 0.1, cap=cap)  # type: ignore[arg-type]

    assert cheapest([lambda: made(0.05, 1), lambda: made(0.1, None)]).name == "cap None"
    assert cheapest([lambda: made(0.1, None), lambda: made(0.05, None)]).name == "cap None"
    assert cheapest([lambda: made(0.1, None), lambda: made(0.05, None)]).cost == 0.05


ONE_LINE = r"^draft mtp: .* has no multi-token-prediction head \(mtp\.\* weights"


def test_a_checkpoint_without_the_head_is_one_line_in_the_backend():
    m = manifest(HEADLESS)
    headless = open_case(HEADLESS)
    with pytest.raises(CheckpointError, match=ONE_LINE) as caught:
        headless.draft("mtp")
    assert f"model_{m['step']:06d}.pt" in str(caught.value) and "\n" not in str(caught.value)
    ids = m["cases"][0]["prompt_ids"]
    with pytest.raises(CheckpointError, match=ONE_LINE):
        events_of(headless, ids, GREEDY, draft="mtp")
    headless.close()
    hf = open_backend(GOLDEN / "transformers" / "nanochat", LoadOptions())
    with pytest.raises(CheckpointError, match=ONE_LINE):
        hf.draft("mtp")
    hf.close()


def test_a_checkpoint_without_the_head_is_one_line_and_exit_2_on_the_command_line(capsys, tmp_path):
    m = manifest(HEADLESS)
    folder = HEADLESS / "chatsft_checkpoints" / m["tag"]
    argv = ["--home", str(tmp_path), "generate", str(folder), "--chat", "hi", "--max-tokens", "8"]
    code = main([*argv, "--draft", "mtp", "--temperature", "0"])
    _out, err = capsys.readouterr()
    assert code == EXIT_ERROR
    lines = [line for line in err.splitlines() if line.startswith("nanoscope: error:")]
    assert len(lines) == 1 and "draft mtp: " in lines[0] and "has no multi-token-prediction head" in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (
            lambda sd: sd.pop("mtp.block.mlp.c_gate.weight"),
            r"the MTP head does not fit the model: mtp\.block\.mlp\.c_gate",
        ),
        (
            lambda sd: sd.__setitem__("mtp.proj.weight", torch.zeros(3, 3)),
            r"does not fit the model: mtp\.proj\.weight",
        ),
    ],
    ids=["missing", "wrong-shape"],
)
def test_a_spoiled_head_is_one_line_naming_the_file(tmp_path, spoil, says):
    """The loader leaves the head's keys out, so the model loads; the draft reads and checks them."""
    m = manifest(CASE)
    sd, _ = raw_checkpoint(m)
    spoil(sd)
    folder = tmp_path / "chatsft_checkpoints" / m["tag"]
    folder.mkdir(parents=True)
    name = f"{m['step']:06d}"
    torch.save(sd, folder / f"model_{name}.pt")
    source = CASE / "chatsft_checkpoints" / m["tag"] / f"meta_{name}.json"
    (folder / f"meta_{name}.json").write_bytes(source.read_bytes())
    backend = NanochatBackend.open(folder, LoadOptions(device="cpu", dtype="float32", base_dir=CASE))
    with pytest.raises(CheckpointError, match=rf"^draft mtp: {tmp_path}.*model_{name}\.pt: .*{says}"):
        backend.draft("mtp")
    backend.close()


def test_the_heads_rounds_are_verified_by_the_target_itself_even_once_a_twin_is_compiled():
    """The head reads the target's hidden states, which a compiled verifier's twin was not warmed up
    to write: with the twin adopted (as ``Verifier.settle`` adopts a faster one), the head's
    rounds still verify with the target, and give its greedy reply; a draft that reads nothing of
    the target's (its int8 copy) verifies with the twin."""
    m = manifest(CASE)
    backend = open_case(CASE)
    twin = compile_twin(backend.loaded, backend="eager", rows=VERIFIED_ROWS, every_row=True)
    assert twin.done.wait(600) and twin.error is None, twin.error
    verifier, switched = backend.verifier, twin.switched(backend.model)
    assert verifier is not None and switched is not None
    verifier.model, verifier.base = switched, 0.5
    ids = m["cases"][0]["prompt_ids"]
    plain, _ = events_of(backend, ids, GREEDY)
    got, stats = events_of(backend, ids, GREEDY, draft="mtp", draft_k=1)
    assert [e.id for e in got] == [e.id for e in plain]
    assert stats.drafted > 0 and not stats.verifier_compiled
    got, stats = events_of(backend, ids, GREEDY, draft="int8", draft_k=2)
    assert stats.drafted > 0 and stats.verifier_compiled
