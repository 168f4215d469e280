"""Hostile and broken inputs end in one readable line, never a traceback, a crash or runaway memory.

The corpus is generated (``hostile_corpus.py``); nothing binary is committed.
"""

from __future__ import annotations

import math

import hostile_corpus as hostile
import pytest
import torch
from checkpoint_factory import model_file, write_checkpoint

from desktop.engine.backend import GenerationStats, LoadOptions
from desktop.engine.generation import stream_reply
from desktop.engine.nanochat_backend import NanochatBackend
from desktop.engine.params import SamplingParams
from desktop.engine.sampling import sample_next

# ---------------------------------------------------------------------------------------------------
# sampling values: validated once in SamplingParams; the sampler never draws from a NaN


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"temperature": math.nan}, "temperature must be a number, got nan"),
        ({"temperature": math.inf}, "temperature must be a finite number, got inf"),
        ({"repetition_penalty": math.nan}, "repetition_penalty must be a number, got nan"),
        ({"repetition_penalty": math.inf}, "repetition_penalty must be a finite number, got inf"),
        ({"top_p": math.nan}, "top_p must be a number, got nan"),
        ({"seed": 2**63}, "seed must be in [0, 9223372036854775807], got 9223372036854775808"),
        ({"seed": 10**400}, "seed must be in [0, 9223372036854775807], got a 401-digit number"),
        ({"temperature": 10**400}, "temperature must be a finite number, got inf"),
        ({"top_k": -1}, "top_k must be in [0, 2147483647], got -1"),
        ({"max_tokens": 0}, "max_tokens must be in [1, 1048576], got 0"),
    ],
)
def test_sampling_values_that_are_refused(values, message):
    with pytest.raises(ValueError) as err:
        SamplingParams(**values)
    assert str(err.value) == message


def _logits(rows: int = 2, vocab: int = 50) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("params", "fallbacks"),
    [
        (SamplingParams(temperature=1e-30), []),  # a one-hot distribution, still sampled
        (SamplingParams(temperature=1e-40), [2]),  # the logits overflow: softmax gives NaN
        (SamplingParams(temperature=1e-40, top_k=10), [2]),
        (SamplingParams(top_p=1e-300), [2]),  # top-p rounds to 0 and keeps no token
        (SamplingParams(temperature=1e-40, top_p=0.5, min_p=0.1), [2]),
    ],
    ids=["1e-30", "1e-40", "1e-40-top-k", "tiny-top-p", "1e-40-filters"],
)
def test_degenerate_distributions_take_the_most_likely_token(params, fallbacks):
    logits = _logits() * 50
    rows: list[int] = []
    chosen = sample_next(logits, torch.Generator().manual_seed(1), params, on_greedy=rows.append)
    assert chosen[:, 0].tolist() == logits.argmax(dim=-1).tolist()
    assert rows == fallbacks


def test_a_tiny_repetition_penalty_never_samples_a_nan():
    logits = _logits()
    history = torch.tensor([[3, 4, 5], [6, 7, 8]])
    rows: list[int] = []
    params = SamplingParams(repetition_penalty=1e-30)
    chosen = sample_next(logits, torch.Generator().manual_seed(1), params, history, on_greedy=rows.append)
    assert chosen.shape == (2, 1) and bool(((chosen >= 0) & (chosen < 50)).all())


def test_nan_logits_fall_back_to_the_best_finite_token():
    logits = _logits()
    logits[0, 7] = math.nan
    rows: list[int] = []
    chosen = sample_next(logits, torch.Generator().manual_seed(1), SamplingParams(), on_greedy=rows.append)
    assert int(chosen[0, 0]) == int(torch.nan_to_num(logits[0], nan=-math.inf).argmax())
    assert rows == [1]  # the second row was a real distribution and was sampled


def test_a_healthy_distribution_draws_exactly_what_multinomial_draws():
    logits = _logits()
    params = SamplingParams(temperature=0.7, top_k=20)
    reference_vals, reference_idx = torch.topk(logits, 20, dim=-1)
    reference = reference_idx.gather(
        1,
        torch.multinomial(
            torch.softmax(reference_vals / 0.7, dim=-1), 1, generator=torch.Generator().manual_seed(5)
        ),
    )
    rows: list[int] = []
    chosen = sample_next(logits, torch.Generator().manual_seed(5), params, on_greedy=rows.append)
    assert torch.equal(chosen, reference) and rows == []


def test_a_tiny_temperature_reply_is_the_greedy_reply_and_says_so(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer="pkl")
    backend = NanochatBackend.open(ckpt, LoadOptions(device="cpu"))
    prompt = list(backend.render("The quick brown", None).ids or ())
    model, tok = backend.model, backend.tok

    def reply(params: SamplingParams, stats: GenerationStats) -> list[int]:
        return [ev.id for ev in stream_reply(model, tok, prompt, params, stats=stats) if not ev.continues]

    tiny, greedy = GenerationStats(), GenerationStats()
    assert reply(SamplingParams(temperature=1e-40, max_tokens=8), tiny) == reply(
        SamplingParams(temperature=0.0, max_tokens=8), greedy
    )
    assert tiny.greedy_fallbacks == tiny.new_tokens > 0 and greedy.greedy_fallbacks == 0
    assert tiny.to_dict()["greedy_fallbacks"] == tiny.new_tokens


# ---------------------------------------------------------------------------------------------------
# the command line: one line per problem, exit code 2, the rest still listed


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from desktop.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def test_list_reports_each_bad_entry_on_its_own_line_and_lists_the_rest(capsys, tmp_path):
    base = tmp_path / "base"
    good = write_checkpoint(base, "E7", tokenizer=None, tag="d1")
    bomb = write_checkpoint(base, "E7", tokenizer=None, tag="d2")
    hostile.replace_model(bomb, hostile.bytearray_bomb())
    deep = write_checkpoint(base, "E7", tokenizer=None, tag="d3")
    hostile.replace_model(deep, hostile.deep_tuples())
    rc, out, err = _cli(capsys, "list", "--base-dir", str(base))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("base  d1           steps [10]  E7, ") and lines[0].endswith(f"({good})")
    assert f"{model_file(bomb)}: refused to load: the file contains pickled code" in lines[1]
    assert (
        f"{model_file(deep)}: refused to load: the pickle nests containers deeper than 32 levels" in lines[2]
    )


def test_names_with_bidi_controls_or_bytes_that_are_not_utf8_are_shown_escaped(capsys, tmp_path):
    import os

    base = tmp_path / "base"
    write_checkpoint(base, "E7", tokenizer=None, tag="evil\u202egnp.exe")
    raw = os.fsencode(base / "base_checkpoints") + b"/caf\xe9"
    write_checkpoint(base, "E7", tokenizer=None, tag=os.fsdecode(b"caf\xe9"))
    assert os.path.isdir(raw)
    rc, out, _ = _cli(capsys, "list", "--base-dir", str(base))
    assert rc == 0
    assert "\u202e" not in out and "\udce9" not in out
    lines = out.splitlines()
    # The name that is not UTF-8 is read like any other (it used to be "truncated or corrupt").
    assert any(line.startswith("base  caf\\xe9 ") and "E7, " in line for line in lines)
    assert any("evil\\u202egnp.exe" in line and "E7, " in line for line in lines)


def test_home_that_is_a_file_is_one_line(capsys, tmp_path):
    home = tmp_path / "home"
    home.write_text("x", encoding="utf-8")
    rc, _, err = _cli(capsys, "--home", str(home), "list", "--base-dir", str(tmp_path))
    assert (rc, err) == (2, f"nanoscope: error: --home {home} is a file, not a folder\n")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--threads", "-1"], "--threads must be between 1 and 1024, got -1"),
        (["--threads", "100000"], "--threads must be between 1 and 1024, got 100000"),
        (["--new-tokens", "0"], "--new-tokens must be between 1 and 1048576, got 0"),
        (["--prompt-tokens", str(10**12)], f"--prompt-tokens must be between 1 and 1048576, got {10**12}"),
        (["--repeats", "100000"], "--repeats must be between 1 and 1000, got 100000"),
        (["--temperature", "nan"], "temperature must be a number, got nan"),
        (["--temperature", "inf"], "temperature must be a finite number, got inf"),
    ],
)
def test_bench_flags_are_checked_before_anything_loads(capsys, tmp_path, flags, message):
    rc, _, err = _cli(capsys, "bench", str(tmp_path / "nothing-here"), *flags)
    assert (rc, err) == (2, f"nanoscope: error: {message}\n")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "nan"], "temperature must be a number, got nan"),
        (["--repetition-penalty", "inf"], "repetition_penalty must be a finite number, got inf"),
        (["--seed", str(2**63)], f"seed must be in [0, 9223372036854775807], got {2**63}"),
        (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
    ],
)
def test_generate_sampling_flags_are_checked_before_anything_loads(capsys, tmp_path, flags, message):
    rc, _, err = _cli(capsys, "generate", str(tmp_path / "nothing-here"), "--prompt", "x", *flags)
    assert (rc, err) == (2, f"nanoscope: error: {message}\n")
