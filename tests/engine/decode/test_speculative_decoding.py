"""Speculative decoding end to end (issue #22): greedy replies on the golden corpus, caches that
roll back exactly after rejections, the calculator's tokens never drafted, a useless draft
falling back by itself, and the limits a reply keeps (length, context, Stop).

Checkpoint drafts here are the golden cases' own base checkpoints (the same run, the same
tokenizer) drafting for their SFT step, with a fixed draft length: tiny models cost as much to
draft as to verify, so the adaptive length would rightly never draft.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from support.golden import CASES, PYTHON_END, check, manifest, reference
from support.tiny_models import cache_of, draft_of, ids_tokenizer, tiny_gpt, tiny_state

from desktop.engine.backend import GenerationStats, LoadOptions, Prompt, ReplyStart, StreamOptions
from desktop.engine.decode.generation import stream_reply
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.scoring import score_reply
from desktop.engine.decode.speculative import (
    K_MAX,
    MAX_ACCEPTANCE,
    MAX_PROBES,
    PROBE_K,
    DraftLength,
    stream_speculative,
)
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.nanochat.loader import load_model
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "resources" / "demo" / "chatsft_checkpoints" / "demo"
GOLDEN = ROOT / "tests" / "golden"
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)
# Two greedy replies may part where the target's two most likely tokens are this close: the
# verifying pass computes several rows at once, the plain loop one, and their sums round apart.
TIE_GAP = 1e-4
# Eras whose caches keep per-position state beyond keys and values (E4 bigram, E7 smear, the
# fork's Engram and mHC).
ROLLBACK_CASES = [
    GOLDEN / "nanochat" / "E4",
    GOLDEN / "nanochat" / "E7",
    GOLDEN / "fork" / "engram",
    GOLDEN / "fork" / "engram-mhc-mtp-swiglu",
]


def events_of(backend, prompt, params, **options) -> tuple[list[TokenEvent], GenerationStats]:
    stats = GenerationStats()
    if not isinstance(prompt, Prompt):
        prompt = Prompt((), tuple(prompt), len(prompt), backend.info().context_length)
    stream = backend.stream(prompt, params, threading.Event(), StreamOptions(**options), stats)
    return [e for e in stream if not e.continues], stats


def base_draft(case: Path) -> str:
    m = manifest(case)
    return f"{case / 'base_checkpoints' / m['tag']}@{m['base_step']}"


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def golden(request):
    case: Path = request.param
    m = manifest(case)
    backend = NanochatBackend.open(
        case / "chatsft_checkpoints" / m["tag"],
        LoadOptions(step=m["step"], device="cpu", dtype="float32", base_dir=case),
    )
    yield case, m, backend
    backend.close()


def test_greedy_replies_are_the_targets_own_on_the_golden_corpus(golden):
    """Every era: the ids nanochat's own code gives (the plain loop's), with the draft proposing;
    a reply may part from them only at a tie of the target's two most likely tokens."""
    case, m, backend = golden
    ties = 0
    drafted = accepted = 0
    for c in m["cases"]:
        plain, _ = events_of(backend, c["prompt_ids"], GREEDY, logprobs=2)
        got, stats = events_of(
            backend, c["prompt_ids"], GREEDY, draft=base_draft(case), draft_k=3, logprobs=2
        )
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
        ids, want = [e.id for e in got], [e.id for e in plain]
        if ids != want:
            at = next(i for i, (a, b) in enumerate(zip(ids, want, strict=False)) if a != b)
            top = plain[at].top
            assert top is not None and top[0][2] - top[1][2] < TIE_GAP, (c["text"], at)
            ties += 1
            continue
        check(m, ids, reference(m, c)[0], PYTHON_END, c["text"])
        assert [e.forced for e in got] == [e.forced for e in plain]
    assert drafted > accepted > 0  # the base step proposed, and was both kept and corrected
    assert ties == 0  # the corpus's top-2 gaps are all far above TIE_GAP (golden.json records them)


def test_the_logprobs_of_every_token_equal_a_full_forward_pass(golden):
    """After rejections the target's cache rolled back exactly: each streamed token's
    log-probability is the teacher-forced one of the whole sequence computed without a cache."""
    case, m, backend = golden
    for c in m["cases"][:2]:
        # The first of a few seeds whose reply had a proposal rejected (most do).
        for seed in range(3, 13):
            params = SamplingParams(temperature=1.0, max_tokens=30, seed=seed)
            events, stats = events_of(
                backend, c["prompt_ids"], params, draft=base_draft(case), draft_k=4, logprobs=1
            )
            if stats.drafted > stats.accepted:
                break
        assert stats.drafted > stats.accepted
        scored = score_reply(backend.model, backend.tok, c["prompt_ids"], [e.id for e in events])
        assert [e.logprob for e in events] == pytest.approx(scored["token_logprobs"], abs=1e-4)


@pytest.mark.parametrize("case", ROLLBACK_CASES, ids=[f"{c.parent.name}/{c.name}" for c in ROLLBACK_CASES])
def test_both_caches_equal_a_fresh_prefill_of_what_they_hold_after_rejections(case):
    m = manifest(case)
    target = load_model(case / "chatsft_checkpoints" / m["tag"], m["step"], "cpu", "float32")
    draft_model = load_model(case / "base_checkpoints" / m["tag"], m["base_step"], "cpu", "float32").model
    backend = NanochatBackend.open(
        case / "chatsft_checkpoints" / m["tag"], LoadOptions(step=m["step"], dtype="float32", base_dir=case)
    )
    draft = draft_of(draft_model)
    cache = cache_of(target.model, 8)
    stats = GenerationStats()
    for seed, c in enumerate(m["cases"]):
        params = SamplingParams(temperature=1.0, max_tokens=24, seed=seed)
        list(
            stream_speculative(
                target.model,
                backend.tok,
                c["prompt_ids"],
                params,
                draft,
                cache=cache,
                limit=target.model.config.rope_len,
                stats=stats,
                draft_k=4,
            )
        )
    assert stats.drafted > stats.accepted > 0
    for model, held in ((target.model, cache), (draft_model, draft.cache)):
        fresh = KVCache(model.config, 1, held.pos, model.device, model.compute_dtype)
        with torch.inference_mode():
            model(held.tokens[:, : held.pos], fresh)
        p = held.pos
        torch.testing.assert_close(held.k[:, :, :p], fresh.k[:, :, :p], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(held.v[:, :, :p], fresh.v[:, :, :p], atol=1e-5, rtol=1e-5)
        if held.embeds is not None:
            torch.testing.assert_close(held.embeds[:, :p], fresh.embeds[:, :p])
        for layer, z in held.engram.items():
            torch.testing.assert_close(z[:, :p], fresh.engram[layer][:, :p], atol=1e-5, rtol=1e-5)
    backend.close()


@pytest.fixture(scope="module")
def demo():
    backend = open_backend(DEMO, LoadOptions())
    yield backend
    backend.close()


def test_the_calculators_tokens_are_never_drafted(demo):
    """The demo answers with calculator calls: its forced result tokens stream unmarked, the
    reply is the plain greedy one, and the draft proposed around them."""
    prompt = demo.render([Message.of_text("user", "What is 12 times 7?")], 40)
    plain, _ = events_of(demo, prompt, GREEDY)
    got, stats = events_of(demo, prompt, GREEDY, draft=f"{DEMO}@300", draft_k=4, logprobs=3)
    assert [e.id for e in got] == [e.id for e in plain]
    forced = [e for e in got if e.forced]
    assert forced and all(e.draft == "" and e.logprob is not None for e in forced)
    assert stats.accepted > 0 and any(e.draft == "accepted" for e in got)
    assert sum(e.draft == "accepted" for e in got) == stats.accepted


def test_a_forks_given_tokens_stream_first_unmarked_then_the_draft_proposes(demo):
    prompt = demo.render([Message.of_text("user", "What is 12 times 7?")], 40)
    plain, _ = events_of(demo, prompt, GREEDY)
    said = tuple(e.id for e in plain[:3])
    start = ReplyStart(said_ids=said, given_ids=(plain[3].id,))
    got, _ = events_of(demo, prompt, GREEDY, start=start, draft=f"{DEMO}@300", draft_k=3)
    assert got[0].given and got[0].draft == "" and got[0].id == plain[3].id
    assert [e.id for e in got] == [e.id for e in plain[3:]]


def test_a_tiny_temperature_is_taken_greedily_and_counted_once_per_token(golden):
    """A temperature of 1e-40 overflows every distribution, so each token is the target's most
    likely one, as the greedy reply's; the footer's count of tokens taken greedily is one per
    token streamed, even where a round's pass computed rows it did not use (after a rejection)."""
    case, m, backend = golden
    c = m["cases"][0]
    greedy, _ = events_of(backend, c["prompt_ids"], GREEDY, draft=base_draft(case), draft_k=3)
    tiny, stats = events_of(
        backend, c["prompt_ids"], GREEDY.with_values(temperature=1e-40), draft=base_draft(case), draft_k=3
    )
    assert [e.id for e in tiny] == [e.id for e in greedy]
    assert stats.drafted > stats.accepted  # rows past a rejection were computed
    forced = sum(e.forced or e.given for e in tiny)
    assert stats.greedy_fallbacks == len(tiny) - forced > 0


def test_a_draft_whose_tokenizer_differs_is_one_line(demo):
    other = GOLDEN / "nanochat" / "E7" / "chatsft_checkpoints" / "d2"
    prompt = demo.render([Message.of_text("user", "hi")], 8)
    with pytest.raises(Exception, match=r"^draft .*d2: its tokenizer .* differs from the model's"):
        events_of(demo, prompt, GREEDY, draft=str(other))


def test_a_reply_says_why_its_draft_drafted_nothing(demo):
    """The int8 copy measured as costly as the model (as on a CPU without int8 products): an
    adaptive reply decodes plainly and says why; a fixed length drafts and says nothing; a
    reply stopped before its first round says it ended first."""
    prompt = demo.render([Message.of_text("user", "What is 12 times 7?")], 40)
    draft = demo.draft("int8")
    measured = draft.cost
    draft.cost = 1.0  # one draft step costs one target step: no length can pay
    try:
        got, stats = events_of(demo, prompt, GREEDY, draft="int8")
        assert stats.drafted == 0 and not any(e.draft for e in got)
        assert stats.draft_skipped == "int8 copy not faster on this CPU: drafted nothing"
        _, fixed = events_of(demo, prompt, GREEDY, draft="int8", draft_k=3)
        assert fixed.drafted > 0 and fixed.draft_skipped == ""
        _, short = events_of(demo, prompt, GREEDY.with_values(max_tokens=1), draft="int8", draft_k=3)
        assert short.drafted == 0 and short.draft_skipped == "drafted nothing: the reply ended first"
    finally:
        draft.cost = measured
    _, plain = events_of(demo, prompt, GREEDY)
    assert plain.draft_skipped == "" and plain.drafted == 0


def test_draft_length_grows_while_kept_shrinks_when_not_and_falls_back():
    length = DraftLength(cost=0.3, verify_cost=0.1)
    first = length.next()
    for _ in range(4):
        k = length.next()
        length.record(k, k)  # everything kept
    assert length.next() > first
    drafted = 0
    for _ in range(400):
        k = length.next()
        if k:
            drafted += k
            length.record(k, 0)  # nothing kept
    # A few shrinking rounds to notice; a draft never right is then not even probed again.
    assert length.next() == 0 and drafted <= 3 * K_MAX
    # One that is right a third of the time does not pay either, but is probed now and then.
    middling = DraftLength(cost=0.3, verify_cost=0.1)
    lengths = []
    for _ in range(400):
        k = middling.next()
        lengths.append(k)
        if k:
            middling.record(k, k // 3)
    assert lengths[-1] == 0 and lengths.count(PROBE_K) >= MAX_PROBES
    assert DraftLength(cost=1.0, verify_cost=0.2).hopeless  # as slow as the target: never drafts
    # Nor one that pays only if every proposal is kept: 4% at k = 6 if so, a loss if one in 20 is not.
    assert DraftLength(cost=0.6, verify_cost=0.3).hopeless
    assert DraftLength(cost=0.3, verify_cost=0.1, fixed=5).next() == 5


def test_a_compiled_verifier_makes_a_draft_pay_that_the_targets_own_passes_could_not():
    """Costs of the kinds measured on a 2-core AMD EPYC: a target pass over 5 rows taking 3 of
    its step (d20's took 2.9), so 0.5 a row beyond the first; the demo's compiled twin, a one-row
    pass in 0.65 of the eager step and 0.05 a row more. A draft whose step costs 0.3 of the
    target's cannot pay against the first, and drafts against the second; and where drafting
    would not pay even then, the reply's rounds still take the compiled one-row pass rather than
    plain decoding's step."""
    assert DraftLength(cost=0.3, verify_cost=0.5).hopeless
    length = DraftLength(cost=0.3, verify_cost=0.05, base=0.65)
    assert not length.hopeless and length.best(MAX_ACCEPTANCE) >= 4
    # Even a draft as slow as the target: a round without a draft costs 0.65 of a step.
    slow = DraftLength(cost=1.0, verify_cost=0.05, base=0.65)
    assert not slow.hopeless and slow.best(MAX_ACCEPTANCE) == 0 and slow.next() == 0


def test_a_draft_that_waits_to_be_probed_and_keeps_nothing_is_probed_once():
    """Costs that say no draft length pays at the prior acceptance: the reply decodes plainly and
    probes the draft once; a probe that keeps nothing, with nothing kept before it, ends drafting
    for the reply (each probe costs the draft's catching up on the tokens decoded since)."""
    length = DraftLength(cost=0.45, verify_cost=0.2)
    assert length.next() == 0 and not length.hopeless
    lengths = []
    for _ in range(200):
        k = length.next()
        lengths.append(k)
        if k:
            length.record(k, 0)
    assert lengths.count(PROBE_K) == 1 and sum(lengths) == PROBE_K
    # One that kept something before is probed again after a bad probe: it may recover.
    recovering = DraftLength(cost=0.3, verify_cost=0.1)
    recovering.record(4, 4)
    probes = 0
    for _ in range(400):
        k = recovering.next()
        if k:
            probes += recovering.probing
            recovering.record(k, 0)
    assert probes == MAX_PROBES


def test_a_draft_that_never_agrees_falls_back_to_plain_decoding():
    vocab = 64
    target = tiny_gpt(tiny_state(vocab, seed=0), vocab)
    stranger = tiny_gpt(tiny_state(vocab, seed=7), vocab)
    tok = ids_tokenizer(vocab)
    params = SamplingParams(temperature=0.0, max_tokens=50)
    plain = [
        e.id for e in stream_reply(target, tok, [1, 2, 3], params, cache=cache_of(target)) if not e.continues
    ]
    stats = GenerationStats()
    events = stream_speculative(
        target, tok, [1, 2, 3], params, draft_of(stranger), cache=cache_of(target), limit=64, stats=stats
    )
    assert [e.id for e in events if not e.continues] == plain
    assert stats.accepted <= stats.drafted / 2
    assert stats.drafted <= 3 * K_MAX


def test_a_reply_keeps_its_length_its_context_and_stop():
    vocab = 16
    target = tiny_gpt(tiny_state(vocab, seed=0), vocab)
    twin = tiny_gpt(tiny_state(vocab, seed=0), vocab)  # always right: every round drafts fully
    tok = ids_tokenizer(vocab)

    def run(params, limit=64, cancel=None) -> tuple[list[int], GenerationStats]:
        stats = GenerationStats()
        draft = draft_of(twin)
        events = stream_speculative(
            target,
            tok,
            [1, 2, 3],
            params,
            draft,
            cache=cache_of(target),
            limit=limit,
            stats=stats,
            cancel=cancel,
        )
        ids = []
        for e in events:
            ids.append(e.id)
            if cancel is not None and len(ids) == 5:
                cancel.set()
        return ids, stats

    ids, stats = run(SamplingParams(temperature=0.8, max_tokens=11))
    assert len(ids) == 11 and stats.stopped == "max_tokens" and stats.accepted == stats.drafted > 0
    ids, stats = run(SamplingParams(temperature=0.8), limit=13)
    assert len(ids) == 10 and stats.stopped == "context"
    ids, stats = run(SamplingParams(temperature=0.8, max_tokens=40), cancel=threading.Event())
    assert len(ids) == 5 and stats.stopped == "cancelled"


@pytest.mark.parametrize(
    ("target", "drafts"),
    [
        (GOLDEN / "transformers" / "nanochat", ["int8", "fp16"]),
        (GOLDEN / "transformers" / "llama-bf16", ["int8", str(GOLDEN / "transformers" / "llama-bf16")]),
        (
            GOLDEN / "kempnerforge" / "dense-gqa-qknorm" / "run",
            ["int8", f"{GOLDEN}/kempnerforge/dense-gqa-qknorm/run@120"],
        ),
    ],
    ids=["hf-nanochat", "hf-llama", "kempnerforge"],
)
def test_hf_and_kempnerforge_greedy_replies_are_their_own(target, drafts):
    backend = open_backend(target, LoadOptions())
    prompt = backend.render("Once upon a time", 30)
    params = SamplingParams(temperature=0.0, max_tokens=30)
    plain, _ = events_of(backend, prompt, params)
    for draft in drafts:
        got, stats = events_of(backend, prompt, params, draft=draft, draft_k=3)
        assert [e.id for e in got] == [e.id for e in plain], draft
        assert stats.drafted > 0
    assert backend.draft("int8") is backend.draft("int8")  # loaded once, kept
    backend.close()
