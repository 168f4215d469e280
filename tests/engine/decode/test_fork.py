"""A reply that begins already: a fork at a token, a continuation, a prefill (issue #25).

On the demo (trained by tools/demo on nanochat's format, it answers with calculator calls) and on
golden checkpoints whose eras carry per-position state (E4's bigram, E7's smear, the fork's
Engram): a fork streams the user's token first with the model's own probability for it, then
continues exactly as the model continues a reply that said the same; the prefix cache makes the
fork point the only thing computed again; the calculator re-evaluates a call the fork closes.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
from support.golden import GOLDEN

from desktop.engine.backend import Backend, GenerationStats, LoadOptions, Prompt, ReplyStart, StreamOptions
from desktop.engine.errors import ContextError
from desktop.engine.messages import PYTHON_OUTPUT, Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "resources" / "demo" / "chatsft_checkpoints" / "demo"
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
TOP = 5


@pytest.fixture(scope="module")
def demo():
    backend = open_backend(DEMO, LoadOptions())
    yield backend
    backend.close()


def ask(backend: Backend, text: str) -> Prompt:
    return backend.render([Message.of_text("user", text)], GREEDY.max_tokens)


def run(
    backend: Backend,
    prompt: Prompt,
    params: SamplingParams = GREEDY,
    start: ReplyStart | None = None,
    reuse: bool = True,
) -> tuple[list[TokenEvent], GenerationStats]:
    stats = GenerationStats()
    options = StreamOptions(logprobs=TOP, start=start, reuse_cache=reuse)
    events = [e for e in backend.stream(prompt, params, threading.Event(), options, stats) if not e.continues]
    return events, stats


def fork_point(events: list[TokenEvent]) -> tuple[int, int, float]:
    """The first sampled token past the second whose runner-up differs from it: (position,
    the runner-up's id, its log-probability)."""
    for i, ev in enumerate(events[2:], start=2):
        if not ev.forced and ev.top and len(ev.top) > 1:
            alt_id, _label, alt_lp = ev.top[1]
            if alt_id != ev.id:
                return i, alt_id, alt_lp
    raise AssertionError("no token with a distinct runner-up")


def test_a_fork_streams_the_alternative_then_continues_as_a_reply_that_said_it(demo) -> None:
    prompt = ask(demo, "What is 12 times 7?")
    reply, _ = run(demo, prompt)
    i, alt, alt_lp = fork_point(reply)
    said = tuple(e.id for e in reply[:i])

    forked, stats = run(demo, prompt, start=ReplyStart(said_ids=said, given_ids=(alt,)))

    first = forked[0]
    assert first.id == alt and first.given and not first.forced
    # The popup's probability and the fork's own agree: the same position, the same logits.
    assert first.logprob is not None and math.isclose(first.logprob, alt_lp, abs_tol=1e-4)
    assert not any(e.given for e in forked[1:])
    # The cache held the reply: only the fork point was computed again.
    assert stats.prefilled_tokens == 1
    # A fresh cache and a reply that simply said the alternative continue the same way.
    plain, fresh = run(demo, prompt, start=ReplyStart(said_ids=(*said, alt)), reuse=False)
    assert fresh.prefilled_tokens == prompt.tokens + i + 1
    assert [e.id for e in plain] == [e.id for e in forked[1:]]


def test_a_seeded_fork_repeats_itself(demo) -> None:
    prompt = ask(demo, "Tell me about the sea.")
    reply, _ = run(demo, prompt)
    i, alt, _ = fork_point(reply)
    start = ReplyStart(said_ids=tuple(e.id for e in reply[:i]), given_ids=(alt,))
    sampled = SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=16)
    once, _ = run(demo, prompt, sampled, start)
    again, _ = run(demo, prompt, sampled, start)
    assert [e.id for e in once] == [e.id for e in again]


def test_continue_extends_a_reply_that_hit_its_token_limit(demo) -> None:
    prompt = ask(demo, "What is 15 plus 27?")
    whole, _ = run(demo, prompt, SamplingParams(temperature=0.0, max_tokens=20))
    head, stats = run(demo, prompt, SamplingParams(temperature=0.0, max_tokens=8))
    assert stats.stopped == "max_tokens"
    tail, _ = run(
        demo,
        prompt,
        SamplingParams(temperature=0.0, max_tokens=12),
        ReplyStart(said_ids=tuple(e.id for e in head)),
    )
    assert [e.id for e in head + tail] == [e.id for e in whole]
    assert not any(e.given for e in tail)


def test_typed_text_is_given_token_by_token_and_the_model_goes_on(demo) -> None:
    prompt = ask(demo, "Say something.")
    typed = "The answer is"
    events, _ = run(demo, prompt, start=ReplyStart(given_text=typed))
    given = [e for e in events if e.given]
    assert [e.id for e in given] == demo.encode(typed)
    assert "".join(e.text for e in given) == typed
    assert all(e.logprob is not None for e in given)  # the model's view of the user's words
    assert len(events) > len(given)


@pytest.mark.parametrize("draft", ["", "int8"])
def test_max_tokens_counts_the_models_own_tokens_not_the_users(demo, draft) -> None:
    """Words longer than the reply's token limit are all given, and the model still says its
    own max_tokens after them (plainly and speculatively)."""
    prompt = ask(demo, "Say something.")
    typed = "The answer to your question is that the sea is wide and deep"
    params = SamplingParams(temperature=0.0, max_tokens=3)
    options = StreamOptions(start=ReplyStart(given_text=typed), draft=draft, draft_k=2 if draft else 0)
    events = [e for e in demo.stream(prompt, params, threading.Event(), options) if not e.continues]
    given = [e for e in events if e.given]
    assert [e.id for e in given] == demo.encode(typed) and len(given) > params.max_tokens
    own = events[len(given) :]
    assert len(own) == params.max_tokens or own[-1].special == "<|assistant_end|>"


def test_a_fork_that_closes_a_calculator_call_gets_the_new_result(demo) -> None:
    prompt = ask(demo, "What is 12 times 7?")
    reply, _ = run(demo, prompt, SamplingParams(temperature=0.0, max_tokens=40))
    opened = next(i for i, e in enumerate(reply) if e.special == "<|python_start|>")
    python_end = next(e.id for e in reply if e.special == "<|python_end|>")
    said = tuple(e.id for e in reply[: opened + 1])
    given = (*demo.encode("2+3"), python_end)

    events, _ = run(demo, prompt, start=ReplyStart(said_ids=said, given_ids=given))

    after = events[len(given) :]
    forced = [e for e in after if e.forced]
    assert forced and forced[0].special == "<|output_start|>" and forced[-1].special == "<|output_end|>"
    message = Message("assistant")
    for e in events:
        message.add_event(e)
    assert [p.text for p in message.parts if p.kind == PYTHON_OUTPUT] == ["5"]


def test_a_continuation_right_after_a_call_owes_its_result(demo) -> None:
    prompt = ask(demo, "What is 12 times 7?")
    reply, _ = run(demo, prompt, SamplingParams(temperature=0.0, max_tokens=40))
    closed = next(i for i, e in enumerate(reply) if e.special == "<|python_end|>")
    events, _ = run(demo, prompt, start=ReplyStart(said_ids=tuple(e.id for e in reply[: closed + 1])))
    n = next(i for i, e in enumerate(reply) if e.special == "<|output_end|>") - closed
    assert [(e.id, e.forced) for e in events[:n]] == [
        (e.id, e.forced) for e in reply[closed + 1 : closed + 1 + n]
    ]


def test_ids_outside_the_vocabulary_are_one_line(demo) -> None:
    prompt = ask(demo, "Hi")
    with pytest.raises(ContextError, match="outside this vocabulary"):
        run(demo, prompt, start=ReplyStart(given_ids=(10**9,)))


@pytest.mark.parametrize(
    "case", ["nanochat/E4", "nanochat/E7", "fork/engram"], ids=lambda c: c.replace("/", "-")
)
def test_a_fork_rolls_the_cache_back_exactly_on_every_era(case) -> None:
    """Per-position state (bigram ids, smear embeddings, Engram activations) rolls back with the
    cache: a cached fork equals one computed from nothing, ids and probabilities."""
    folder = next((GOLDEN / case).glob("*sft_checkpoints/*"))
    backend = open_backend(folder, LoadOptions(base_dir=GOLDEN / case))
    try:
        prompt = backend.render("The quick brown fox", 20, chat=False)
        reply, _ = run(backend, prompt, SamplingParams(temperature=0.0, max_tokens=20))
        i, alt, _ = fork_point(reply)
        start = ReplyStart(said_ids=tuple(e.id for e in reply[:i]), given_ids=(alt,))
        cached, stats = run(backend, prompt, start=start)
        fresh, _ = run(backend, prompt, start=start, reuse=False)
        assert stats.prefilled_tokens == 1
        assert [e.id for e in cached] == [e.id for e in fresh]
        for a, b in zip(cached, fresh, strict=True):
            assert a.logprob is not None and b.logprob is not None
            assert math.isclose(a.logprob, b.logprob, abs_tol=1e-4)
    finally:
        backend.close()
