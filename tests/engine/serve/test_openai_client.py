"""``nanoscope serve`` through the ``openai`` package, a client no one here wrote: completions and
chat, streamed and not, with log-probabilities, on golden checkpoints of every local family
(written by nanochat's, the fork's, transformers' and KempnerForge's own code). The ids it serves,
greedy and seeded, are the ids ``nanoscope generate`` gives for the same request."""

from __future__ import annotations

import json
import math

import openai
import pytest
from support.golden import GOLDEN
from support.serving import serving

from desktop.cli.main import main
from desktop.engine.backend import LoadOptions

NANOCHAT = GOLDEN / "nanochat" / "E7"
FORK = GOLDEN / "fork" / "plain"
CASES = {
    # name: (checkpoint, the nanochat base dir for its tokenizer, has a chat format)
    "nanochat-E7-sft": (NANOCHAT / "chatsft_checkpoints" / "d2", NANOCHAT, True),
    "fork-sft": (FORK / "chatsft_checkpoints" / "d2", FORK, True),
    "transformers-llama": (GOLDEN / "transformers" / "llama-bf16", None, True),
    "kempnerforge": (GOLDEN / "kempnerforge" / "dense-gqa-qknorm" / "run", None, False),
}
PROMPT = "The cat sat"
QUESTION = "What is 12 times 7?"
MAX_NEW = 12
SAMPLED = {"temperature": 0.8, "top_k": 20, "seed": 7}


def generate_ids(capsys, monkeypatch, case: str, source: list[str], sampling: dict | None) -> list[int]:
    """The ids ``nanoscope generate --json`` prints for this checkpoint and prompt."""
    directory, base, _chat = CASES[case]
    if base is not None:
        monkeypatch.setenv("NANOCHAT_BASE_DIR", str(base))
    knobs = ["--temperature", "0"]
    if sampling:
        knobs = ["--temperature", str(sampling["temperature"]), "--top-k", str(sampling["top_k"])]
        knobs += ["--seed", str(sampling["seed"])]
    code = main(
        [
            "generate",
            str(directory),
            *source,
            "--max-tokens",
            str(MAX_NEW),
            *knobs,
            "--json",
            "--device",
            "cpu",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.splitlines()[-1])["ids"]


def options(case: str) -> LoadOptions:
    _directory, base, _chat = CASES[case]
    return LoadOptions(device="cpu", base_dir=base)


def extra(sampling: dict | None) -> tuple[dict, dict]:
    """The request's own fields and its ``extra_body`` for greedy or ``sampling``."""
    if not sampling:
        return {"temperature": 0}, {"return_token_ids": True}
    return (
        {"temperature": sampling["temperature"], "seed": sampling["seed"]},
        {"top_k": sampling["top_k"], "return_token_ids": True},
    )


@pytest.mark.parametrize("sampling", [None, SAMPLED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("case", CASES)
def test_completion_ids_equal_generate_and_streaming_says_the_same(capsys, monkeypatch, case, sampling):
    want = generate_ids(capsys, monkeypatch, case, ["--prompt", PROMPT], sampling)
    fields, body = extra(sampling)
    with serving(CASES[case][0], options(case)) as s:
        client = s.openai()
        whole = client.completions.create(
            model=s.model, prompt=PROMPT, max_tokens=MAX_NEW, logprobs=3, extra_body=body, **fields
        )
        choice = whole.choices[0]
        assert choice.model_extra["token_ids"] == want
        assert whole.usage.completion_tokens == len(want)
        # Log-probabilities: one per token, each a real log-probability, the chosen token among
        # the top list a completion gives (as vLLM's do), at most 3 + 1 entries.
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(want)
        for value, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
            assert value <= 0 and math.isfinite(value)
            assert 1 <= len(top) <= 4 and max(top.values()) >= value - 1e-6
        stream = client.completions.create(
            model=s.model, prompt=PROMPT, max_tokens=MAX_NEW, stream=True, extra_body=body, **fields
        )
        ids, text, finish = [], "", None
        for chunk in stream:
            c = chunk.choices[0]
            ids += c.model_extra.get("token_ids", [])
            text += c.text
            finish = c.finish_reason or finish
        assert ids == want
        assert text == choice.text
        assert finish == choice.finish_reason
        assert s.healthy()


@pytest.mark.parametrize("sampling", [None, SAMPLED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("case", [c for c, (_d, _b, chat) in CASES.items() if chat])
def test_chat_ids_equal_generate_and_streaming_says_the_same(capsys, monkeypatch, case, sampling):
    want = generate_ids(capsys, monkeypatch, case, ["--chat", QUESTION], sampling)
    fields, body = extra(sampling)
    messages = [{"role": "user", "content": QUESTION}]
    with serving(CASES[case][0], options(case)) as s:
        client = s.openai()
        whole = client.chat.completions.create(
            model=s.model,
            messages=messages,
            max_tokens=MAX_NEW,
            logprobs=True,
            top_logprobs=2,
            extra_body=body,
            **fields,
        )
        choice = whole.choices[0]
        assert choice.model_extra["token_ids"] == want
        entries = choice.logprobs.content
        assert len(entries) == len(want)
        assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
        assert "".join(e.token for e in entries if e.token).startswith(choice.message.content[:1])
        stream = client.chat.completions.create(
            model=s.model,
            messages=messages,
            max_tokens=MAX_NEW,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=body,
            **fields,
        )
        ids, text, usage = [], "", None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                ids += c.model_extra.get("token_ids", [])
                text += c.delta.content or ""
        assert ids == want
        assert text == choice.message.content
        assert usage is not None and usage.completion_tokens == len(want)


def test_the_calculators_forced_tokens_are_marked_and_its_call_reads_in_the_reply():
    """nanochat's golden SFT model calls the calculator greedily on this question (golden.json's
    engine_greedy_forced): the served reply shows the call in the model's own format, and the
    tokens the tool forced are the ones nanochat's Engine forced."""
    manifest = json.loads((NANOCHAT / "golden.json").read_text())
    case = next(c for c in manifest["cases"] if any(c["engine_greedy_forced"]))
    with serving(CASES["nanochat-E7-sft"][0], options("nanochat-E7-sft")) as s:
        r = s.openai().completions.create(
            model=s.model,
            prompt=case["prompt_ids"],
            max_tokens=len(case["engine_greedy"]),
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        choice = r.choices[0]
        assert choice.model_extra["token_ids"] == case["engine_greedy"]
        assert [int(f) for f in choice.model_extra["forced"]] == case["engine_greedy_forced"]
        assert "<|python_start|>" in choice.text and "<|output_start|>" in choice.text


def test_echo_gives_the_prompts_own_log_probabilities_and_max_tokens_zero_only_those(tmp_path):
    from desktop.engine.backend import Prompt
    from desktop.engine.registry import open_backend

    directory = NANOCHAT / "base_checkpoints" / "d2"
    opts = LoadOptions(device="cpu", base_dir=NANOCHAT)
    local = open_backend(directory, opts)
    try:
        ids = list(local.render(PROMPT, None).ids)
        direct = local.score(Prompt((), tuple(ids[:1]), 1, 128), ids[1:])["token_logprobs"]
        text = local.tokenizer().decode(ids)
    finally:
        local.close()
    with serving(directory, opts) as s:
        r = s.openai().completions.create(
            model=s.model, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0
        )
        lp = r.choices[0].logprobs
        assert r.choices[0].text == text
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.token_logprobs[1:] == pytest.approx(direct, abs=1e-6)
        assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)


def test_stop_strings_end_the_reply_where_they_begin_and_n_choices_each_get_their_own_seed():
    directory = NANOCHAT / "base_checkpoints" / "d2"
    with serving(directory, LoadOptions(device="cpu", base_dir=NANOCHAT)) as s:
        client = s.openai()
        free = client.completions.create(model=s.model, prompt=PROMPT, max_tokens=20, temperature=0)
        text = free.choices[0].text
        stop = text[3:5]
        cut = client.completions.create(
            model=s.model, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop]
        )
        assert cut.choices[0].text == text[: text.index(stop)]
        assert cut.choices[0].finish_reason == "stop"
        many = client.completions.create(
            model=s.model, prompt=PROMPT, max_tokens=8, n=3, seed=11, temperature=1.0
        )
        first = client.completions.create(
            model=s.model, prompt=PROMPT, max_tokens=8, seed=11, temperature=1.0
        )
        assert [c.index for c in many.choices] == [0, 1, 2]
        assert many.choices[0].text == first.choices[0].text  # choice 0 is the seed's own reply
        assert len({c.text for c in many.choices}) > 1


def test_a_streamed_reply_ends_with_every_byte_it_produced(tmp_path):
    """A reply cut inside a multi-byte character ends with that character's bytes as the tokenizer
    decodes them (U+FFFD), not short of them: the stream's text equals the non-streamed text, and
    both equal the tokenizer's decode of the ids."""
    from desktop.engine.registry import open_backend

    directory = NANOCHAT / "base_checkpoints" / "d2"
    opts = LoadOptions(device="cpu", base_dir=NANOCHAT)
    local = open_backend(directory, opts)
    tok = local.tokenizer()
    local.close()
    with serving(directory, opts) as s:
        client = s.openai()
        for n in range(1, 9):
            body = {"return_token_ids": True}
            whole = client.completions.create(
                model=s.model, prompt="日本", max_tokens=n, temperature=1.0, seed=n, extra_body=body
            )
            ids = whole.choices[0].model_extra["token_ids"]
            streamed = "".join(
                c.choices[0].text
                for c in client.completions.create(
                    model=s.model, prompt="日本", max_tokens=n, temperature=1.0, seed=n, stream=True
                )
            )
            stop_ids = tok.stop_ids
            expected = tok.decode([i for i in ids if i not in stop_ids])
            assert whole.choices[0].text == streamed == expected


def test_continue_final_message_goes_on_from_the_given_text():
    """A last assistant message with continue_final_message: the reply continues it (the given
    text is not repeated), as the local backend continues a prefilled reply."""
    import threading

    from desktop.engine.backend import ReplyStart, StreamOptions
    from desktop.engine.messages import Message
    from desktop.engine.params import SamplingParams
    from desktop.engine.registry import open_backend

    directory, opts = CASES["nanochat-E7-sft"][0], options("nanochat-E7-sft")
    given = "Let me add."
    local = open_backend(directory, opts)
    try:
        prompt = local.render([Message.of_text("user", QUESTION)], None, chat=True)
        events = local.stream(
            prompt,
            SamplingParams(temperature=0.0, max_tokens=MAX_NEW),
            threading.Event(),
            StreamOptions(start=ReplyStart(given_text=given)),
        )
        want = [ev.id for ev in events if not ev.given and not ev.continues]
    finally:
        local.close()
    with serving(directory, opts) as s:
        r = s.openai().chat.completions.create(
            model=s.model,
            messages=[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": given}],
            max_tokens=MAX_NEW,
            temperature=0,
            extra_body={
                "continue_final_message": True,
                "add_generation_prompt": False,
                "return_token_ids": True,
            },
        )
        assert r.choices[0].model_extra["token_ids"] == want
        assert not r.choices[0].message.content.startswith(given)
        with pytest.raises(openai.BadRequestError, match="continue_final_message"):
            s.openai().chat.completions.create(
                model=s.model,
                messages=[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": given}],
                max_tokens=4,
            )


def test_a_model_without_a_chat_format_says_so_without_naming_where_it_lies():
    with serving(CASES["kempnerforge"][0], options("kempnerforge")) as s:
        with pytest.raises(openai.BadRequestError) as refused:
            s.openai().chat.completions.create(
                model=s.model, messages=[{"role": "user", "content": QUESTION}], max_tokens=4
            )
        message = refused.value.body["message"]
        assert "chat" in message and str(GOLDEN) not in message and "\n" not in message
        assert s.healthy()
