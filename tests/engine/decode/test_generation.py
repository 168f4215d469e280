"""Generation against an independent copy of nanochat's Engine loop, plus sampling, streaming and caching.

``nanochat_engine_mimic.mimic_generate`` re-implements ``Engine.generate`` (spec §1.9) on top of the
reference forward; ``generate_columns`` must give the same token ids for greedy and seeded sampling. A
"calculator trap" checkpoint (its greedy chain spells ``<|python_start|>7*6<|python_end|>``) makes the
forced ``<|output_start|>42<|output_end|>`` path run for real.
"""

from __future__ import annotations

import itertools
import pickle
import threading

import pytest
import torch
from support import backend_helpers
from support.checkpoint_factory import read_checkpoint, write_checkpoint
from support.nanochat_engine_mimic import (
    CppJsonNanochatTokenizer,
    TiktokenNanochatTokenizer,
    mimic_generate,
    sample_next_token,
    use_calculator,
    write_calculator_trap,
)
from support.reference_model import reference_greedy, reference_logits
from support.tokenizer_factory import make_tiktoken_encoding

from desktop.engine.backend import LoadOptions
from desktop.engine.decode.generation import GenerationStats, generate_columns, stream_reply
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.sampling import sample_next
from desktop.engine.errors import ContextError
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.nanochat.loader import load_model
from desktop.engine.nanochat.tokenizer import load_tokenizer
from desktop.engine.params import SamplingParams

EQUIVALENCE_ERAS = ("E2", "E4", "E7", "fork_engram")
SAMPLING = {
    "greedy": {"temperature": 0.0},
    "top_k": {"temperature": 0.9, "top_k": 5},
    "temperature": {"temperature": 1.0},
}
EXPRESSION = "7*6"


class Fixture:
    """A loaded model with the engine's tokenizer and, independently, nanochat's view of the same files."""

    def __init__(self, ckpt, era: str) -> None:
        self.ckpt, self.era = ckpt, era
        self.loaded = load_model(ckpt, device="cpu")
        self.model = self.loaded.model
        sd, meta = read_checkpoint(ckpt)
        self.sd, self.mc = sd, meta["model_config"]
        tok_dir = ckpt.parent.parent / "tokenizer"
        if era.startswith("fork"):
            self.tok = load_tokenizer(tok_dir / "tokenizer.json")
            self.nano = CppJsonNanochatTokenizer(tok_dir / "tokenizer.json")
        else:
            self.tok = load_tokenizer(tok_dir / "tokenizer.pkl")
            with (tok_dir / "tokenizer.pkl").open("rb") as f:  # our own test file: plain pickle is fine
                self.nano = TiktokenNanochatTokenizer(pickle.load(f))

    def columns(self, params: SamplingParams, **kw):
        return generate_columns(self.model, self.tok, self.prompt(), params, **kw)

    def stream(self, params: SamplingParams, **kw):
        return stream_reply(self.model, self.tok, self.prompt(), params, **kw)

    def reference_last(self, ids) -> torch.Tensor:
        return reference_logits(self.sd, self.mc, self.era, ids)[-1]

    def special(self, name: str) -> int:
        token = self.nano.encode_special(name)
        assert token is not None
        return token

    def prompt(self, text: str = "Hello there! How are you today?") -> list[int]:
        """nanochat's chat prompt for upstream eras, BOS + text for the fork's C++ tokenizer."""
        enc = self.nano.encode
        if self.era.startswith("fork"):
            return [self.nano.get_bos_token_id(), *enc("int main ( ) { return 0 ; }")]
        sp = self.special
        return [
            sp("<|bos|>"),
            sp("<|user_start|>"),
            *enc(text),
            sp("<|user_end|>"),
            sp("<|assistant_start|>"),
        ]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Fixture]:
    root = tmp_path_factory.mktemp("gen")
    out = {}
    for era in EQUIVALENCE_ERAS:
        phase = "sft" if era.startswith("fork") else "chatsft"
        out[era] = Fixture(write_checkpoint(root / era, era, phase=phase, seed=7), era)
    return out


def _trap_map(stop: bool) -> dict[int, int]:
    """Greedy chain: assistant_start -> python_start 7 * 6 python_end; with ``stop``, output_end -> end."""
    enc = make_tiktoken_encoding(300)  # the encoding write_calculator_trap pickles
    sp = enc.encode_single_token
    chain = [sp("<|assistant_start|>"), sp("<|python_start|>"), *enc.encode_ordinary(EXPRESSION)]
    chain.append(sp("<|python_end|>"))
    assert len(chain) == 6 and len(set(chain)) == 6  # "7", "*", "6" are three distinct tokens
    successors = dict(itertools.pairwise(chain))
    if stop:
        successors[sp("<|output_end|>")] = sp("<|assistant_end|>")
    return successors


@pytest.fixture(scope="module")
def trap(tmp_path_factory) -> Fixture:
    """Stops with <|assistant_end|> right after the calculator's forced output."""
    root = tmp_path_factory.mktemp("trap")
    return Fixture(write_calculator_trap(root, _trap_map(stop=True)), "E0")


@pytest.fixture(scope="module")
def open_trap(tmp_path_factory) -> Fixture:
    """Never stops under greedy decoding; after the forced output it samples from soft distributions."""
    root = tmp_path_factory.mktemp("open_trap")
    return Fixture(write_calculator_trap(root, _trap_map(stop=False)), "E0")


def run_columns(fx: Fixture, prompt, params: SamplingParams, num_samples: int = 1, **kw):
    cols = list(generate_columns(fx.model, fx.tok, prompt, params, num_samples=num_samples, **kw))
    return [c.tokens for c in cols], [c.forced for c in cols]


def run_mimic(fx: Fixture, prompt, params: SamplingParams, num_samples: int = 1):
    gen = mimic_generate(
        fx.reference_last,
        fx.nano,
        prompt,
        num_samples=num_samples,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_k=params.top_k,
        seed=params.seed,
    )
    cols = list(gen)
    return [c for c, _ in cols], [[m == 0 for m in masks] for _, masks in cols]


def calculator_output_ids(fx: Fixture) -> list[int]:
    """What nanochat forces after <|python_end|>: output_start, encode(str(result)), output_end."""
    result = use_calculator(EXPRESSION)
    assert result == 7 * 6
    return [fx.special("<|output_start|>"), *fx.nano.encode(str(result)), fx.special("<|output_end|>")]


# ---------------------------------------------------------------------------------------------------
# equivalence with nanochat's Engine


@pytest.mark.parametrize("num_samples", [1, 3])
@pytest.mark.parametrize("mode", SAMPLING)
@pytest.mark.parametrize("era", EQUIVALENCE_ERAS)
def test_same_tokens_as_nanochat_engine(models, era, mode, num_samples):
    fx = models[era]
    params = SamplingParams(**SAMPLING[mode], max_tokens=14, seed=1234)
    prompt = fx.prompt()
    tokens, forced = run_columns(fx, prompt, params, num_samples)
    expected_tokens, expected_forced = run_mimic(fx, prompt, params, num_samples)
    assert tokens == expected_tokens
    assert forced == expected_forced
    if mode != "greedy" and num_samples == 3:
        assert len({tuple(col[i] for col in tokens) for i in range(3)}) > 1  # the rows really diverge


@pytest.mark.parametrize("num_samples", [1, 3])
def test_calculator_trap_forces_the_result(trap, num_samples):
    sp = trap.special
    prompt = trap.prompt("What is 7*6?")
    params = SamplingParams(temperature=0.0, max_tokens=40)
    tokens, forced = run_columns(trap, prompt, params, num_samples)
    assert (tokens, forced) == run_mimic(trap, prompt, params, num_samples)

    calc = calculator_output_ids(trap)
    sampled_head = [sp("<|python_start|>"), *trap.nano.encode(EXPRESSION), sp("<|python_end|>")]
    expected = [*sampled_head, *calc, sp("<|assistant_end|>")]
    for row in range(num_samples):
        assert [col[row] for col in tokens] == expected  # it stopped on <|assistant_end|>
        flags = [col[row] for col in forced]
        assert flags == [False] * len(sampled_head) + [True] * len(calc) + [False]


@pytest.mark.parametrize("params", [{"temperature": 1.0}, {"temperature": 0.9, "top_k": 5}])
@pytest.mark.parametrize("seed", [0, 1])
def test_forced_tokens_still_consume_a_sample(open_trap, params, seed):
    # After the forced output the model samples freely; if forced steps skipped their draw, the
    # Generator would be out of step with nanochat's and the later tokens would differ.
    prompt = open_trap.prompt("What is 7*6?")
    sampling = SamplingParams(**params, max_tokens=40, seed=seed)
    tokens, forced = run_columns(open_trap, prompt, sampling, num_samples=2)
    assert (tokens, forced) == run_mimic(open_trap, prompt, sampling, num_samples=2)
    assert any(any(col) for col in forced)  # the calculator path really ran
    first_forced = next(i for i, col in enumerate(forced) if any(col))
    assert len(tokens) - first_forced > 10  # and plenty was sampled after it


def test_stream_shows_the_calculator_parts(trap):
    sp = trap.special
    stats = GenerationStats()
    params = SamplingParams(temperature=0.0, max_tokens=40)
    events = list(trap.stream(params, stats=stats))
    by_kind: dict[str, str] = {}
    for ev in events:
        by_kind[ev.kind] = by_kind.get(ev.kind, "") + ev.text
    assert by_kind[PYTHON] == EXPRESSION
    assert by_kind[PYTHON_OUTPUT] == str(use_calculator(EXPRESSION))
    output = [ev for ev in events if ev.kind == PYTHON_OUTPUT and ev.special is None]
    assert output and all(ev.forced for ev in output)
    names = [ev.special for ev in events if ev.special]
    assert names == [
        "<|python_start|>",
        "<|python_end|>",
        "<|output_start|>",
        "<|output_end|>",
        "<|assistant_end|>",
    ]
    assert events[-1].id == sp("<|assistant_end|>") and events[-1].kind == TEXT
    assert stats.stopped == "stop_token"
    assert stats.new_tokens == len(events)


# ---------------------------------------------------------------------------------------------------
# stopping: cancel, max_tokens, context


@pytest.mark.parametrize("cancel_after", [1, 3])
def test_cancel_stops_within_one_token(open_trap, cancel_after):
    cancel = threading.Event()
    params = SamplingParams(temperature=0.0, max_tokens=50)
    got = 0
    for _ in open_trap.columns(params, cancel=cancel):
        got += 1
        if got == cancel_after:
            cancel.set()
    assert cancel_after <= got <= cancel_after + 1


def test_cancelled_stream_says_so(open_trap):
    cancel = threading.Event()
    stats = GenerationStats()
    params = SamplingParams(temperature=0.0, max_tokens=50)
    n = 0
    for ev in open_trap.stream(params, cancel=cancel, stats=stats):
        n += ev.id >= 0
        if n == 2:
            cancel.set()
    assert stats.stopped == "cancelled"
    assert 2 <= stats.new_tokens <= 3


def test_cancel_before_the_first_token(open_trap):
    cancel = threading.Event()
    cancel.set()
    params = SamplingParams(temperature=0.0, max_tokens=50)
    assert len(list(open_trap.columns(params, cancel=cancel))) <= 1


@pytest.mark.parametrize("max_tokens", [1, 7, 23])
def test_max_tokens_is_respected(open_trap, max_tokens):
    stats = GenerationStats()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    events = list(open_trap.stream(params, stats=stats))
    assert len([ev for ev in events if ev.id >= 0]) == max_tokens  # greedy never ends this model's reply
    assert (stats.new_tokens, stats.stopped) == (max_tokens, "max_tokens")


@pytest.mark.parametrize("era", ["E2", "fork_engram"])
def test_greedy_matches_reference_greedy(models, era):
    fx = models[era]
    tokens, _ = run_columns(fx, fx.prompt(), SamplingParams(temperature=0.0, max_tokens=12))
    expected = reference_greedy(fx.sd, fx.mc, era, fx.prompt(), 12)
    stop = fx.tok.stop_ids
    ended = next((i + 1 for i, t in enumerate(expected) if t in stop), len(expected))
    assert [col[0] for col in tokens] == expected[:ended]


def test_prompt_must_fit_the_rotary_table(models):
    fx = models["E2"]
    limit = 10 * fx.mc["sequence_len"]  # nanochat's rotary table (spec §1.3)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    with pytest.raises(ContextError):
        list(generate_columns(fx.model, fx.tok, [1] * limit, params))
    with pytest.raises(ContextError):
        list(generate_columns(fx.model, fx.tok, [], params))


def test_decoding_stops_at_the_end_of_the_rotary_table(models):
    fx = models["E2"]
    limit = 10 * fx.mc["sequence_len"]
    prompt = torch.randint(0, 290, (limit - 3,), generator=torch.Generator().manual_seed(0)).tolist()
    tokens, _ = run_columns(fx, prompt, SamplingParams(temperature=0.0, max_tokens=20))
    assert len(tokens) <= 3  # the last decoded position is limit - 1


# ---------------------------------------------------------------------------------------------------
# sampling filters, as documented in sampling.py


def _probs_logits(probs: list[float], rows: int) -> torch.Tensor:
    return torch.tensor(probs).log().expand(rows, -1).contiguous()


PROBS = [0.40, 0.25, 0.15, 0.10, 0.05, 0.03, 0.02]
ROWS = 4000


def _frequencies(samples: torch.Tensor, n: int) -> torch.Tensor:
    return torch.bincount(samples.flatten(), minlength=n).float() / samples.numel()


def _draw(params: SamplingParams, probs=PROBS, history=None) -> torch.Tensor:
    rng = torch.Generator().manual_seed(params.seed)
    return sample_next(_probs_logits(probs, ROWS), rng, params, history)


@pytest.mark.parametrize("top_p", [0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("top_k", [0, 5])
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p, top_k):
    p = torch.tensor(PROBS)
    kept = p[:top_k] if top_k else p  # top-k first, then the nucleus of what is left
    cum = (kept / kept.sum()).cumsum(0)
    nucleus = int((cum < top_p).sum()) + 1
    freq = _frequencies(_draw(SamplingParams(top_p=top_p, top_k=top_k, seed=3)), len(PROBS))
    assert set(freq.nonzero().flatten().tolist()) == set(range(nucleus))
    expected = kept[:nucleus] / kept[:nucleus].sum()
    torch.testing.assert_close(freq[:nucleus], expected, atol=0.04, rtol=0)


@pytest.mark.parametrize("min_p", [0.1, 0.3, 0.5])
def test_min_p_drops_tokens_below_a_fraction_of_the_top(min_p):
    p = torch.tensor(PROBS)
    keep = p >= min_p * p.max()
    freq = _frequencies(_draw(SamplingParams(min_p=min_p, seed=4)), len(PROBS))
    assert torch.equal(freq > 0, keep)
    torch.testing.assert_close(freq[keep], p[keep] / p[keep].sum(), atol=0.04, rtol=0)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    # Greedy: the repeated best token loses its place once its positive logit is divided enough.
    logits = torch.tensor([[2.0, 1.5, -1.0, 0.5]])
    history = torch.tensor([[0]])

    def greedy(penalty: float) -> int:
        params = SamplingParams(temperature=0.0, repetition_penalty=penalty)
        return int(sample_next(logits, torch.Generator(), params, history))

    assert greedy(1.0) == 0
    assert greedy(1.2) == 0  # 2.0 / 1.2 > 1.5
    assert greedy(2.0) == 1  # 2.0 / 2.0 < 1.5
    # Sampling: a repeated token with a negative logit becomes rarer (its logit is multiplied).
    neg = [0.6, 0.3, 0.1]
    history = torch.tensor([[2]] * ROWS)
    plain = _frequencies(_draw(SamplingParams(seed=5), neg, history), 3)
    penalised = _frequencies(_draw(SamplingParams(repetition_penalty=2.0, seed=5), neg, history), 3)
    log = torch.tensor(neg).log()
    log[2] *= 2.0
    torch.testing.assert_close(penalised, log.softmax(0), atol=0.03, rtol=0)
    assert penalised[2] < plain[2]


@pytest.mark.parametrize(("temperature", "top_k"), [(0.0, 0), (1.0, 0), (0.7, 0), (0.9, 5), (1.3, 50)])
def test_plain_sampling_draws_like_nanochat(temperature, top_k):
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(9)) * 4
    params = SamplingParams(temperature=temperature, top_k=top_k)
    ours = sample_next(logits, torch.Generator().manual_seed(11), params)
    theirs = sample_next_token(logits, torch.Generator().manual_seed(11), temperature, top_k)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -0.1},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": 1.0},
        {"repetition_penalty": 0.0},
        {"max_tokens": 0},
    ],
)
def test_invalid_sampling_values_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_logprobs_describe_the_chosen_token(models):
    fx = models["E7"]
    params = SamplingParams(temperature=0.0, max_tokens=4)
    seq = list(fx.prompt())
    for col in generate_columns(fx.model, fx.tok, fx.prompt(), params, logprobs=3):
        assert col.logprobs is not None
        chosen, top = col.logprobs[0]
        expected = torch.log_softmax(fx.reference_last(seq), -1)
        assert [t for t, _ in top] == expected.topk(3).indices.tolist()
        assert top[0][0] == col.tokens[0]  # greedy picks the most likely token
        assert chosen == pytest.approx(float(expected[col.tokens[0]]), abs=1e-4)
        seq.append(col.tokens[0])


# ---------------------------------------------------------------------------------------------------
# streaming text


def _segments_text(tok, ids: list[int]) -> str:
    """Text of the ordinary ids, each run between special tokens decoded on its own."""
    text, run = "", []
    for token in [*ids, None]:
        if token is None or tok.special_name(token) is not None:
            text += tok.decode(run) if run else ""
            run = []
        else:
            run.append(token)
    return text


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("era", ["E2", "E7"])
def test_stream_text_equals_decoding_the_generated_ids(models, era, seed):
    fx = models[era]
    params = SamplingParams(temperature=1.2, max_tokens=40, seed=seed)
    events = list(stream_reply(fx.model, fx.tok, fx.prompt(), params))
    ids = [ev.id for ev in events if ev.id >= 0]
    assert ids == [col.tokens[0] for col in generate_columns(fx.model, fx.tok, fx.prompt(), params)]
    text = "".join(ev.text for ev in events)
    assert text == _segments_text(fx.tok, ids)
    if all(fx.tok.special_name(t) is None for t in ids[:-1]):  # no special token inside the reply
        assert text == fx.tok.decode([t for t in ids if fx.tok.special_name(t) is None])
    for ev in events:
        assert (ev.special is not None) == (ev.id >= 0 and fx.tok.special_name(ev.id) is not None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fork_stream_text_continues_the_prompt_text(models, seed):
    # The C++ tokenizer spaces a token by its neighbours, so the reply's text is what decoding prompt and
    # reply together adds to the prompt's own text.
    fx = models["fork_engram"]
    params = SamplingParams(temperature=1.0, max_tokens=40, seed=seed)
    events = list(fx.stream(params))
    ordinary = [ev.id for ev in events if ev.id >= 0 and fx.tok.special_name(ev.id) is None]
    head = fx.tok.decode(fx.prompt())
    full = fx.tok.decode([*fx.prompt(), *ordinary])
    assert full.startswith(head)
    assert "".join(ev.text for ev in events) == full[len(head) :]


# ---------------------------------------------------------------------------------------------------
# the session's prefix cache


@pytest.fixture(scope="module")
def session(models) -> NanochatBackend:
    return NanochatBackend.open(models["E7"].ckpt, LoadOptions(device="cpu"))


def _reply(session: NanochatBackend, prompt, stats=None, reuse=True) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=10)
    return backend_helpers.reply_ids(session, prompt, params, stats=stats, reuse_cache=reuse)


def test_second_turn_prefills_only_the_new_tokens(session, models):
    fx = models["E7"]
    first = list(session.render([Message.of_text("user", "Hello there!")], 10).ids)
    reply = _reply(session, first)
    text = fx.tok.decode([t for t in reply if fx.tok.special_name(t) is None])
    convo = [Message.of_text("user", "Hello there!"), Message.of_text("assistant", text)]
    second = list(session.render([*convo, Message.of_text("user", "And then?")], 10).ids)
    assert second[: len(first)] == first

    cached, fresh = GenerationStats(), GenerationStats()
    reused_ids = _reply(session, second, cached)
    fresh_ids = _reply(session, second, fresh, reuse=False)
    assert reused_ids == fresh_ids
    assert fresh.prefilled_tokens == len(second)
    assert 0 < cached.prefilled_tokens <= len(second) - len(first)
    assert cached.prompt_tokens == fresh.prompt_tokens == len(second)
    # and both are what the reference model decodes
    expected = reference_greedy(fx.sd, fx.mc, "E7", second, 10)
    ended = next((i + 1 for i, t in enumerate(expected) if t in fx.tok.stop_ids), len(expected))
    assert fresh_ids == expected[:ended]


def test_regenerate_and_edit_reuse_the_shared_prefix(session):
    prompt = list(session.render([Message.of_text("user", "Tell me a story.")], 10).ids)
    baseline = _reply(session, prompt, reuse=False)
    again = GenerationStats()
    assert _reply(session, prompt, again) == baseline
    assert again.prefilled_tokens == 1  # everything cached; the last prompt token gives the logits
    edited = list(session.render([Message.of_text("user", "Tell me a joke.")], 10).ids)
    shared = next(i for i, (a, b) in enumerate(zip(prompt, edited, strict=False)) if a != b)
    stats = GenerationStats()
    edited_ids = _reply(session, edited, stats)
    assert stats.prefilled_tokens == len(edited) - shared
    assert edited_ids == _reply(session, edited, reuse=False)


def test_kv_cache_argument_continues_a_prefix(models):
    # generate_columns with a cache that already holds the start of the prompt prefills only the rest.
    fx = models["E4"]
    prompt = fx.prompt()
    params = SamplingParams(temperature=0.0, max_tokens=8)
    cache = KVCache(fx.model.config, 1, 4, fx.model.device, torch.float32)
    with torch.inference_mode():
        fx.model(torch.tensor([prompt[:5]]), cache)
    with_prefix, _ = run_columns(fx, prompt, params, cache=cache)
    assert with_prefix == run_columns(fx, prompt, params)[0]


def _cache_holding(fx: Fixture, ids: list[int]) -> KVCache:
    cache = KVCache(fx.model.config, 1, 4, fx.model.device, torch.float32)
    with torch.inference_mode():
        fx.model(torch.tensor([ids]), cache)
    return cache


def test_kv_cache_holding_the_whole_prompt(models):
    # The whole prompt is a prefix of itself; its last logits are not cached, so they must be recomputed.
    fx = models["E7"]
    prompt = fx.prompt()
    params = SamplingParams(temperature=0.0, max_tokens=6)
    cached, _ = run_columns(fx, prompt, params, cache=_cache_holding(fx, prompt))
    assert cached == run_columns(fx, prompt, params)[0]


def test_kv_cache_holding_another_conversation(models):
    # A cache that is not a prefix of the prompt must not silently condition the reply on other text:
    # either it is refused (ValueError) or only what it shares with the prompt is used.
    fx = models["E7"]
    prompt = fx.prompt()
    params = SamplingParams(temperature=0.0, max_tokens=6)
    other = _cache_holding(fx, [prompt[0], *fx.nano.encode("Something else entirely")])
    try:
        tokens, _ = run_columns(fx, prompt, params, cache=other)
    except ValueError:
        return
    assert tokens == run_columns(fx, prompt, params)[0]


@pytest.mark.parametrize("penalty", [1.3, 50.0])
def test_repetition_penalty_covers_prompt_and_reply(models, penalty):
    # Documented rule (sampling.py): every token already in the context (prompt and reply so far) has
    # its positive logit divided by the penalty and its negative logit multiplied by it.
    fx = models["E2"]
    prompt = fx.prompt()
    params = SamplingParams(temperature=0.0, repetition_penalty=penalty, max_tokens=10)
    tokens, _ = run_columns(fx, prompt, params)
    seq = list(prompt)
    expected = []
    for _ in range(10):
        logits = fx.reference_last(seq).clone()
        seen = torch.tensor(sorted(set(seq)))
        picked = logits[seen]
        logits[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
        expected.append(int(logits.argmax()))
        seq.append(expected[-1])
        if expected[-1] in fx.tok.stop_ids:
            break
    assert [col[0] for col in tokens] == expected
    if penalty == 50.0:  # so strong that nothing repeats
        assert not set(expected) & set(prompt) and len(set(expected)) == len(expected)


def test_abandoned_reply_leaves_a_usable_prefix_cache(models):
    # A consumer that stops reading mid-reply (the UI's stop button) must not poison the next turn.
    fx = models["E7"]
    session = NanochatBackend.open(fx.ckpt, LoadOptions(device="cpu"))
    first = list(session.render([Message.of_text("user", "Count to ten.")], 12).ids)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    stream = backend_helpers.stream(session, first, params)
    partial = [next(stream).id for _ in range(4)]
    stream.close()
    text = fx.tok.decode([t for t in partial if fx.tok.special_name(t) is None])
    convo = [Message.of_text("user", "Count to ten."), Message.of_text("assistant", text)]
    second = list(session.render([*convo, Message.of_text("user", "Go on.")], 12).ids)
    stats = GenerationStats()
    reused = _reply(session, second, stats)
    assert stats.prefilled_tokens < len(second)
    assert reused == _reply(session, second, reuse=False)
