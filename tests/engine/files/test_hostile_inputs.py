"""Hostile and broken inputs end in one readable line, never a traceback, a crash or runaway memory.

The corpus is generated (``hostile_corpus.py``) from files the real tools wrote: a spoilt model file
starts as a copy of nanochat's own golden E7 checkpoint, and so do the valid controls.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import math
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support import hostile_corpus as hostile
from support.checkpoint_factory import model_file, write_checkpoint
from support.golden import CASES, copy_base

from desktop.engine.backend import GenerationStats, LoadOptions
from desktop.engine.decode.generation import stream_reply
from desktop.engine.decode.sampling import sample_next
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.params import SamplingParams

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


def _told(rows: list[list[bool]]):
    """An ``on_greedy`` that keeps which rows of each call fell back."""
    return lambda fell: rows.append(fell.tolist())


@pytest.mark.parametrize(
    ("params", "fallbacks"),
    [
        (SamplingParams(temperature=1e-30), []),  # a one-hot distribution, still sampled
        (SamplingParams(temperature=1e-40), [[True, True]]),  # the logits overflow: softmax gives NaN
        (SamplingParams(temperature=1e-40, top_k=10), [[True, True]]),
        (SamplingParams(top_p=1e-300), [[True, True]]),  # top-p rounds to 0 and keeps no token
        (SamplingParams(temperature=1e-40, top_p=0.5, min_p=0.1), [[True, True]]),
    ],
    ids=["1e-30", "1e-40", "1e-40-top-k", "tiny-top-p", "1e-40-filters"],
)
def test_degenerate_distributions_take_the_most_likely_token(params, fallbacks):
    logits = _logits() * 50
    rows: list[list[bool]] = []
    chosen = sample_next(logits, torch.Generator().manual_seed(1), params, on_greedy=_told(rows))
    assert chosen[:, 0].tolist() == logits.argmax(dim=-1).tolist()
    assert rows == fallbacks


def test_a_tiny_repetition_penalty_never_samples_a_nan():
    logits = _logits()
    history = torch.tensor([[3, 4, 5], [6, 7, 8]])
    rows: list[list[bool]] = []
    params = SamplingParams(repetition_penalty=1e-30)
    chosen = sample_next(logits, torch.Generator().manual_seed(1), params, history, on_greedy=_told(rows))
    assert chosen.shape == (2, 1) and bool(((chosen >= 0) & (chosen < 50)).all())


def test_nan_logits_fall_back_to_the_best_finite_token():
    logits = _logits()
    logits[0, 7] = math.nan
    rows: list[list[bool]] = []
    chosen = sample_next(logits, torch.Generator().manual_seed(1), SamplingParams(), on_greedy=_told(rows))
    assert int(chosen[0, 0]) == int(torch.nan_to_num(logits[0], nan=-math.inf).argmax())
    assert rows == [[True, False]]  # the second row was a real distribution and was sampled


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
    rows: list[list[bool]] = []
    chosen = sample_next(logits, torch.Generator().manual_seed(5), params, on_greedy=_told(rows))
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
    from desktop.cli.main import main

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


# ---------------------------------------------------------------------------------------------------
# every line printed goes through one cleaner: any text in, one line of printable characters out

# What hostile names hold: line breaks of every kind, ESC sequences (7-bit and the C1 CSI), bidi
# overrides, NUL, DEL, and os.fsdecode's stand-ins for bytes that are not UTF-8.
HOSTILE_PIECES = [
    *("\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\t"),
    *("\x1b[2J", "\x1b]0;title\x07", "\x9b31m", "\u202e", "\u200f", "\x00", "\x7f", "\udce9"),
]
hostile_text = st.lists(
    st.one_of(st.sampled_from(HOSTILE_PIECES), st.text(st.characters(blacklist_categories=()))), max_size=12
).map("".join)


def _clean(line: str) -> bool:
    """One line, printable throughout: no C0 or C1 control, no ESC, no line or paragraph break."""
    return line.isprintable() and len(line.splitlines()) <= 1 and "\x1b" not in line


def _in_order(part: str, whole: str) -> bool:
    rest = iter(whole)
    return all(ch in rest for ch in part)


@settings(max_examples=400, deadline=None)
@given(hostile_text, st.booleans(), st.one_of(st.none(), st.integers(1, 60)))
def test_any_text_becomes_exactly_one_clean_line(text, fold, limit):
    from desktop.engine.text_lines import one_line

    line = one_line(text, fold=fold, limit=limit)
    assert _clean(line)
    assert limit is None or len(line) <= limit
    assert one_line(line) == line  # clean text passes unchanged, so cleaning twice changes nothing
    if limit is None:
        # Printable text is kept, in order; only what is not printable is shown otherwise.
        kept = "".join(ch for ch in (" ".join(text.split()) if fold else text) if ch.isprintable())
        assert _in_order(kept, line)
        if text.isprintable():
            assert line == (" ".join(text.split()) if fold else text)


# Python's printable: letters, marks, numbers, punctuation, symbols and the space (other spaces,
# such as U+00A0, are shown as a plain space: test_other_spaces_show_as_a_plain_space).
@given(st.text(st.characters(whitelist_categories=("L", "M", "N", "P", "S"), whitelist_characters=" ")))
def test_printable_text_is_left_exactly_as_it_is(text):
    from desktop.engine.text_lines import one_line

    assert one_line(text) == text


@pytest.mark.parametrize("space", ["\u00a0", "\u202f", "\u2009", "\u3000"])
def test_other_spaces_show_as_a_plain_space(space):
    """A folder named as macOS names screenshots ("… at 10.00.00\u202fPM") reads as it looks."""
    from desktop.engine.text_lines import one_line

    assert one_line(f"Screenshot at 10.00.00{space}PM") == "Screenshot at 10.00.00 PM"


@given(
    st.text(st.characters(whitelist_categories=("L", "N", "P", "Zs"), blacklist_characters="\\*")),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=12, max_size=40),
    st.lists(st.sampled_from(HOSTILE_PIECES), max_size=6).map("".join),
)
def test_a_secret_is_masked_wherever_it_stands(before, key, after):
    from desktop.engine.text_lines import one_line

    line = one_line(f"{before}{key}{after}{key}", fold=True, limit=240, secret=key)
    assert key not in line and _clean(line)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\nb", "a\\x0ab"),
        ("\x1b[2Jx", "\\x1b[2Jx"),
        ("evil\u202egnp.exe", "evil\\u202egnp.exe"),
        ("caf\udce9", "caf\\xe9"),
        ("\U000e0041", "\\U000e0041"),
    ],
)
def test_what_is_not_printable_is_shown_as_an_escape(text, shown):
    from desktop.engine.text_lines import one_line

    assert one_line(text) == shown


def test_an_exception_is_one_line_with_or_without_a_message():
    from desktop.engine.text_lines import error_text

    assert error_text(ValueError("first\n\tsecond \x1b[2J")) == "first second \\x1b[2J"
    assert error_text(KeyError()) == "KeyError"
    assert error_text(OSError("x" * 500), 50) == "x" * 49 + "…"
    assert error_text(RuntimeError("a\nb"), named=True) == "RuntimeError: a b"


NASTY = "x\x1b[2J\n\u202eevil"  # a newline, a clear-screen and a bidi override in one name


def _assert_clean_output(out: str, err: str) -> None:
    assert "\x1b" not in out + err and "\u202e" not in out + err
    for line in (out + err).splitlines():
        assert _clean(line)


def test_a_warning_built_from_hostile_names_prints_as_one_clean_line(capsys, tmp_path):
    """``timeline`` of a golden run copied into a hostile folder, whose meta gained a hostile key
    holding text: the one warning is one line, and the table's header (the metric names) is too."""
    run = copy_base("E7", tmp_path / NASTY)
    meta = next(run.glob("meta_*.json"))
    data = json.loads(meta.read_text(encoding="utf-8"))
    data[f"note{NASTY}"] = "text, not a number"
    data[f"metric{NASTY}"] = 0.5
    meta.write_text(json.dumps(data), encoding="utf-8")
    rc, out, err = _cli(capsys, "timeline", str(run))
    assert rc == 0
    _assert_clean_output(out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nanoscope: warning: ")
    assert "x\\x1b[2J\\x0a\\u202eevil" in lines[0] and "is not a number; left out" in lines[0]
    assert "metric" in out.splitlines()[1]  # the header row, the hostile name escaped in it


def test_an_eval_file_with_a_hostile_name_warns_in_one_clean_line(capsys, tmp_path):
    run = copy_base("E7", tmp_path / "base")
    data = tmp_path / f"q{NASTY}.jsonl"
    question = {"question": "2 + 2?", "choices": ["3", "4"], "answer": 1}
    data.write_text(json.dumps(question) + "\nnot json\n", encoding="utf-8")
    rc, out, err = _cli(capsys, "eval", str(run), "--task", "mc", "--data", str(data), "--device", "cpu")
    assert rc == 0
    _assert_clean_output(out, err)
    warnings = [line for line in err.splitlines() if line.startswith("nanoscope: warning: ")]
    assert len(warnings) == 1 and ":2: " in warnings[0] and "q" + NASTY not in warnings[0]
    assert "multiple choice: qx\\x1b[2J\\x0a\\u202eevil.jsonl" in out


def test_an_error_and_a_logged_warning_from_hostile_text_are_one_clean_line_each(capsys, tmp_path):
    rc, out, err = _cli(capsys, "timeline", str(tmp_path / NASTY))  # not there: the error names it
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("nanoscope: error: ")
    _assert_clean_output(out, err)
    import logging

    from desktop.config.logfile import cli_logging, log_file

    with cli_logging():
        logging.getLogger("desktop.test").warning("a name: %s", NASTY, exc_info=ValueError(NASTY))
    err = capsys.readouterr().err
    assert err.splitlines() == ["nanoscope: warning: a name: x\\x1b[2J\\x0a\\u202eevil"]
    # The log file too: the record is one line, and a traceback's lines are cleaned each.
    logged = log_file().read_text(encoding="utf-8")
    assert "\x1b" not in logged and "\u202e" not in logged
    records = [line for line in logged.splitlines() if "a name: " in line]
    assert len(records) == 1 and records[0].endswith("desktop.test: a name: x\\x1b[2J\\x0a\\u202eevil")


# ---------------------------------------------------------------------------------------------------
# the corpus, run in a separate process: a crash (SIGSEGV, SIGBUS, SIGABRT) or a hang fails the case
# that caused it instead of killing the test run


@dataclass
class Case:
    argv: list[str]  # for `nanoscope`, or ["scenario", <name>, args...] for a scripted one
    rc: int = 2
    error: str | None = None  # the whole of stderr, without "nanoscope: error: " (failing cases)
    output: str | None = None  # a substring stdout must hold (successful cases)
    markers: tuple[Path, ...] = ()  # files that appear only if pickled code ran


# name -> builder(its own folder) -> Case. Building writes files; naming does not, so collection is cheap.
SPECS: dict[str, Callable[[Path], Case]] = {}
GENERATE = ("--prompt", "hello", "--max-tokens", "3", "--device", "cpu")
# Resources every case must stay under, on any machine.
PEAK_RSS_BOUND_KB = 300 * 1024
SECONDS_BOUND = 30.0
FREE_RAM = 4 << 30  # what the driver tells the loader is free, so memory budgets are the same everywhere
DENSE = "and weights must be dense float32, bfloat16 or float16 tensors"
CORRUPT = "file is truncated or corrupt"
CODE = "refused to load: the file contains pickled code or objects that are not tensors"


def _model(
    name: str, edit: Callable[[Path], object], message: Callable[[Path], str], era: str = "E7"
) -> None:
    """A checkpoint whose model file ``edit`` spoils; ``message(model file)`` is the refusal."""

    def build(root: Path) -> Case:
        ckpt = copy_base(era, root)
        edit(ckpt)
        return Case(["generate", str(ckpt), *GENERATE], 2, message(model_file(ckpt)))

    SPECS[name] = build


for _kind, (_what, _global) in {
    "meta-device": ("a meta-device tensor, which holds no values", "_utils._rebuild_meta_tensor_no_storage"),
    "subclass": ("a tensor subclass", "_tensor._rebuild_from_type_v2"),
    "sparse": ("a sparse tensor", "_utils._rebuild_sparse_tensor"),
    "sparse csr": ("a sparse tensor", "_utils._rebuild_sparse_tensor"),
    "nested": ("a nested tensor", "_utils._rebuild_nested_tensor"),
    "quantized": ("a quantized tensor", "_utils._rebuild_qtensor"),
}.items():
    _model(
        f"model-{_kind.replace(' ', '-')}",
        lambda c, k=_kind: hostile.replace_entry(c, "lm_head.weight", hostile.SPECIAL_TENSORS[k]),
        lambda p, w=_what, g=_global: f"{p}: refused to load: it holds {w}, {DENSE} (torch.{g})",
    )
for _dtype in ("float8_e4m3fn", "complex64", "int64"):
    _model(
        f"model-{_dtype}",
        lambda c, d=_dtype: hostile.replace_entry(c, "lm_head.weight", hostile.WRONG_DTYPES[d]),
        lambda p, d=_dtype: (
            f"{p}: weights must be float32, bfloat16 or float16; this one is not: 'lm_head.weight' ({d})"
        ),
    )
for _name, (_body, _message) in {
    "model-wrapper-subclass": (
        hostile.wrapper_subclass_parameter(),
        f"refused to load: it holds a tensor subclass, {DENSE} (torch._utils._rebuild_wrapper_subclass)",
    ),
    "model-missing-memo": (
        hostile.missing_memo(),
        f"{CORRUPT} (the pickle reads memo slot 5, which was never written)",
    ),
    "model-empty-stack": (hostile.empty_stack(), f"{CORRUPT} (TUPLE1 at byte 2 finds too few items)"),
    "model-int-args": (
        hostile.reduce_with_int_args(),
        f"{CORRUPT} (REDUCE arguments are a plain value, not a tuple)",
    ),
    "model-deep-tuple": (
        hostile.deep_tuples(),
        "refused to load: the pickle nests containers deeper than 32 levels",
    ),
    "model-deep-frozenset": (
        hostile.deep_frozensets(),
        "refused to load: the pickle opens more than 32 nested MARKs",
    ),
    "model-bytearray-bomb": (hostile.bytearray_bomb(), f"{CODE} (builtins.bytearray)"),
    "model-bytearray-declared": (
        hostile.declared_bytearray(),
        f"{CORRUPT} (the pickle is cut off (expected 6500000000 bytes in a bytearray8, but only 4 remain))",
    ),
    "model-string-bomb": (
        hostile.declared_string(),
        f"{CORRUPT} (the pickle is cut off "
        "(expected 4600000000 bytes in a unicodestring8, but only 4 remain))",
    ),
}.items():
    _model(_name, lambda c, b=_body: hostile.replace_model(c, b), lambda p, m=_message: f"{p}: {m}")
_model(
    "model-cut-mid-opcode",
    lambda c: hostile.replace_model(c, hostile.cut_mid_opcode(), stop=False),
    lambda p: f"{p}: {CORRUPT} (the pickle is cut off (in BININT at byte 2))",
)


def _code_in_model(root: Path) -> Case:
    marker = root / "pwned"
    ckpt = copy_base("E7", root)
    hostile.replace_model(ckpt, hostile.code_payload(marker))
    return Case(
        ["generate", str(ckpt), *GENERATE], 2, f"{model_file(ckpt)}: {CODE} (os.system)", markers=(marker,)
    )


SPECS["model-code-payload"] = _code_in_model
MODEL_CASES = tuple(SPECS)
GOLDEN_ERAS = {case.name for case in CASES}


def _tokenizer(name: str, era: str, kind: str, write: Callable[[Path], object], message: str) -> None:
    def build(root: Path) -> Case:
        ckpt = write_checkpoint(root, era, tokenizer=kind)
        path = root / "tokenizer" / f"tokenizer.{kind}"
        write(path)
        return Case(["generate", str(ckpt), *GENERATE], 2, f"{path}: {message}", markers=(root / "pwned",))

    SPECS[name] = build


def _json_edit(edit: Callable[[dict], object]) -> Callable[[Path], object]:
    return lambda p: hostile.edit_tokenizer_json(p, edit)


def _padding(n: int) -> Callable[[dict], object]:
    pad = {
        "direction": "Right",
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "<PAD>",
        "pad_to_multiple_of": None,
    }
    return lambda d: d.update(padding={"strategy": {"Fixed": n}, **pad})


def _split(pattern: str) -> Callable[[dict], object]:
    def edit(d: dict) -> None:
        d["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}

    return edit


_REFUSED_JSON = "refused tokenizer.json:"
_tokenizer(
    "tokenizer-pkl-deep-tuple",
    "E7",
    "pkl",
    lambda p: hostile.write_pickle(p, hostile.deep_tuples()),
    "refused to unpickle: the pickle nests containers deeper than 32 levels",
)
_tokenizer(
    "tokenizer-pkl-deep-frozenset",
    "E7",
    "pkl",
    lambda p: hostile.write_pickle(p, hostile.deep_frozensets()),
    "refused to unpickle: the pickle opens more than 32 nested MARKs",
)
_tokenizer(
    "tokenizer-pkl-code-payload",
    "E7",
    "pkl",
    lambda p: hostile.write_pickle(p, hostile.code_payload(p.parent.parent / "pwned")),
    "refused to unpickle os.system (only tiktoken.core.Encoding is allowed)",
)
_tokenizer(
    "tokenizer-pkl-empty-match",
    "E7",
    "pkl",
    lambda p: hostile.encoding_state_pickle(p, r"a*|\w+"),
    "the split pattern can match the empty string, which crashes tiktoken",
)
_tokenizer(
    "tokenizer-json-padding-1e10",
    "fork",
    "json",
    _json_edit(_padding(10**10)),
    f"{_REFUSED_JSON} the padding length is 10000000000, outside 0..1048576",
)
_tokenizer(
    "tokenizer-json-padding-3e8",
    "fork",
    "json",
    _json_edit(_padding(3 * 10**8)),
    f"{_REFUSED_JSON} the padding length is 300000000, outside 0..1048576",
)
_tokenizer(
    "tokenizer-json-truncation-1e12",
    "fork",
    "json",
    _json_edit(
        lambda d: d.update(truncation={"max_length": 10**12, "stride": 0, "strategy": "LongestFirst"})
    ),
    f"{_REFUSED_JSON} the truncation length is 1000000000000, outside 0..1048576",
)
_tokenizer(
    "tokenizer-json-expanding-normalizer",
    "fork",
    "json",
    _json_edit(
        lambda d: d.update(
            normalizer={"type": "Replace", "pattern": {"String": "a"}, "content": "x" * 10_000}
        )
    ),
    f"{_REFUSED_JSON} the normalizer can make a text over 256 times longer",
)
_tokenizer(
    "tokenizer-json-catastrophic-split",
    "fork",
    "json",
    _json_edit(_split(r"(\w+)+;")),
    f"{_REFUSED_JSON} the pre_tokenizer.pretokenizers[0] (Split): the split pattern repeats a group that "
    "itself repeats, which can take exponential time",
)
_tokenizer(
    "tokenizer-json-nested-100k",
    "fork",
    "json",
    lambda p: p.write_text(hostile.deep_json(), encoding="utf-8"),
    "not a valid tokenizer.json (nested deeper than 64 levels)",
)


def _meta(
    name: str, era: str, overrides: dict | None, problem: Callable[[Path, Path], str], text: str | None = None
) -> None:
    def build(root: Path) -> Case:
        ckpt = write_checkpoint(root, era, meta_overrides=overrides)
        meta = ckpt / "meta_000010.json"
        if text is not None:
            meta.write_text(text, encoding="utf-8")
        return Case(["generate", str(ckpt), *GENERATE], 2, problem(model_file(ckpt), meta))

    SPECS[name] = build


for _era, _field, _value, _problem in (
    ("fork", "window_long", "abc", " must be an integer, got 'abc'"),
    ("fork", "rope_theta", "x", " must be a finite number, got 'x'"),
    ("fork", "rope_theta", [1], " must be a finite number, got [1]"),
    ("fork_engram", "engram_layers", "x", " must be comma-separated integers, got 'x'"),
    ("fork_mhc", "mhc_epsilon", "x", " must be a finite number, got 'x'"),
    ("fork_engram", "engram_ngram_orders", "2,3,1000000000", "=1000000000 is implausibly large (limit 64)"),
    ("fork_mhc", "mhc_sinkhorn_iters", 10**9, "=1000000000 is implausibly large (limit 100)"),
):
    _meta(
        f"meta-{_field}-{type(_value).__name__}",
        _era,
        {"model_config": {_field: _value}},
        lambda model, _m, f=_field, p=_problem: f"{model}: model_config.{f}{p}",
    )
_meta(
    "meta-nested-100k",
    "E7",
    None,
    lambda _p, m: f"{m}: not valid JSON (nested deeper than 64 levels)",
    text=hostile.deep_json(),
)
_meta(
    "meta-5000-digit-number",
    "E7",
    None,
    lambda _p, m: f"{m}: not valid JSON (a number has more than 4300 digits)",
    text='{"model_config": {"sequence_len": ' + "7" * 5000 + "}}",
)


def _tables_past_free_memory(root: Path) -> Case:
    """sequence_len passes its own bound, but its rotary tables would not fit in the FREE_RAM."""
    ckpt = write_checkpoint(root, "E7", meta_overrides={"model_config": {"sequence_len": 1 << 20}})
    return Case(["generate", str(ckpt), *GENERATE], 2, f"{model_file(ckpt)}: loading needs about ")


SPECS["meta-tables-past-free-memory"] = _tables_past_free_memory


def _sampling(
    name: str, flags: list[str], message: str | None, era: str = "E7", prompt: str = "hello"
) -> None:
    def build(root: Path) -> Case:
        ckpt = copy_base(era, root) if era in GOLDEN_ERAS else write_checkpoint(root, era)
        argv = ["generate", str(ckpt), "--prompt", prompt, "--max-tokens", "3", "--device", "cpu", *flags]
        if message is None:
            return Case([*argv, "--json"], 0, None, '"done": true')
        return Case(argv, 2, message)

    SPECS[name] = build


_sampling("sampling-temperature-nan", ["--temperature", "nan"], "temperature must be a number, got nan")
_sampling(
    "sampling-temperature-inf", ["--temperature", "inf"], "temperature must be a finite number, got inf"
)
_sampling(
    "sampling-repetition-penalty-nan",
    ["--repetition-penalty", "nan"],
    "repetition_penalty must be a number, got nan",
)
_sampling(
    "sampling-repetition-penalty-inf",
    ["--repetition-penalty", "inf"],
    "repetition_penalty must be a finite number, got inf",
)
_sampling(
    "sampling-seed-2**63", ["--seed", str(2**63)], f"seed must be in [0, 9223372036854775807], got {2**63}"
)
_sampling(
    "sampling-softcap-nan", ["--softcap", "nan"], "the softcap override must be a positive number, got nan"
)
_sampling("sampling-temperature-1e-30", ["--temperature", "1e-30"], None)
_sampling("sampling-temperature-1e-30-top-k", ["--temperature", "1e-30", "--top-k", "5"], None)
_sampling("sampling-temperature-1e-40", ["--temperature", "1e-40"], None)
_sampling("sampling-top-p-1e-300", ["--top-p", "1e-300"], None)
_sampling("sampling-repetition-penalty-1e-30", ["--repetition-penalty", "1e-30"], None)
_sampling("sampling-lone-surrogate-to-the-fork-tokenizer", [], None, era="fork", prompt="int a\ud800;")


def _list_every_hostile_model(root: Path) -> Case:
    """All the model files above in one base dir: `list` names each problem on its own line."""
    for name in MODEL_CASES:
        source = next((root.parent / name / "base_checkpoints").iterdir())
        target = root / "base_checkpoints" / name
        target.mkdir(parents=True)
        for f in source.iterdir():
            (target / f.name).write_bytes(f.read_bytes())
    return Case(["list", "--base-dir", str(root)], 0, None, f"  ({root / 'base_checkpoints'}")


SPECS["list-every-hostile-model"] = _list_every_hostile_model
SPECS["bench-threads-100000"] = lambda root: Case(
    ["bench", str(root / "nothing"), "--threads", "100000"],
    2,
    "--threads must be between 1 and 1024, got 100000",
)
SPECS["files-changed-under-a-loaded-model"] = lambda root: Case(
    ["scenario", "change_files", str(copy_base("E7", root))],
    0,
    None,
    "same tokens after truncate, rewrite, delete",
)


DRIVER = r'''
import contextlib, io, json, os, sys, threading, time, traceback
from pathlib import Path

from desktop.engine.kernels import memory

FREE = int(sys.argv[3])
memory.available_ram = lambda: FREE  # the same free memory on every machine

from desktop.cli.main import main


def change_files(ckpt):
    """Load, then truncate the model file in place, rewrite it with garbage, delete it (and the meta
    and the tokenizer): the loaded model must keep answering the same."""
    from desktop.engine.backend import LoadOptions
    from desktop.engine.params import SamplingParams
    from desktop.engine.registry import open_backend

    ckpt = Path(ckpt)
    backend = open_backend(ckpt, LoadOptions(device="cpu"))
    params = SamplingParams(temperature=0.0, max_tokens=6)

    def reply():
        prompt = backend.render("hello there", None)
        return [ev.id for ev in backend.stream(prompt, params, threading.Event()) if not ev.continues]

    first = reply()
    model = next(ckpt.glob("model_*.pt"))
    with open(model, "r+b") as f:  # in place, as torch.save over the same path does
        f.truncate(0)
    after_truncate = reply()
    with open(model, "r+b") as f:
        f.write(os.urandom(4096))
    after_rewrite = reply()
    for path in (model, *ckpt.glob("meta_*.json"), *(ckpt.parent.parent / "tokenizer").iterdir()):
        path.unlink()
    after_delete = reply()
    backend.close()
    if first == after_truncate == after_rewrite == after_delete:
        print("same tokens after truncate, rewrite, delete")
        return 0
    print("tokens changed", first, after_truncate, after_rewrite, after_delete)
    return 1


SCENARIOS = {"change_files": change_files}


def peak_kb():
    """The high-water mark of resident memory: VmHWM on Linux, ru_maxrss elsewhere (bytes on macOS)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except OSError:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss // 1024 if sys.platform == "darwin" else rss


def reset_peak():
    """Linux 4.0+: VmHWM back to the current RSS, so each case's peak is its own. Elsewhere the mark
    only rises, and a case is measured by how far it raises it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


with open(sys.argv[1]) as f:
    cases = json.load(f)
with open(sys.argv[2], "w") as results:
    for case in cases:
        os.write(2, ("\n@@case " + case["name"] + "\n").encode())
        out, err = io.StringIO(), io.StringIO()
        reset_peak()
        before = peak_kb()
        started = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                argv = case["argv"]
                rc = SCENARIOS[argv[1]](*argv[2:]) if argv[0] == "scenario" else main(argv)
        except BaseException:
            err.write(traceback.format_exc())
            rc = -1
        record = {"name": case["name"], "rc": rc, "out": out.getvalue(), "err": err.getvalue(),
                  "peak_kb": peak_kb() - before, "seconds": time.perf_counter() - started}
        results.write(json.dumps(record) + "\n")
        results.flush()
'''


@dataclass
class CorpusRun:
    cases: dict[str, Case]
    results: dict[str, dict]
    raw_stderr: dict[str, str]  # what the process wrote to fd 2 itself during each case (Rust panics...)
    died: str  # "" or how the driver ended early, and during which case


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> CorpusRun:
    root = tmp_path_factory.mktemp("corpus")
    cases = {name: build(root / name) for name, build in SPECS.items()}
    plan, out = root / "cases.json", root / "results.jsonl"
    plan.write_text(json.dumps([{"name": n, "argv": c.argv} for n, c in cases.items()]), encoding="utf-8")
    env = dict(os.environ, NANOSCOPE_HOME=str(root / "home"), NANOCHAT_BASE_DIR=str(root / "no-base"))
    command = [sys.executable, "-c", DRIVER, str(plan), str(out), str(FREE_RAM)]
    try:
        proc = subprocess.run(
            command, capture_output=True, env=env, timeout=len(cases) * SECONDS_BOUND + 120, check=False
        )
        stderr, died = proc.stderr, f"the driver ended with {proc.returncode}" if proc.returncode else ""
    except subprocess.TimeoutExpired as exc:
        stderr, died = exc.stderr or b"", "the driver timed out"
    text = stderr.decode(errors="replace")
    raw = {}
    for chunk in text.split("\n@@case ")[1:]:
        name, _, rest = chunk.partition("\n")
        raw[name] = rest
    if died:
        died += f" during case {next(reversed(raw), '?')!r}"
    results = {}
    if out.exists():
        for line in out.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            results[record["name"]] = record
    return CorpusRun(cases, results, raw, died)


@pytest.mark.parametrize("name", list(SPECS))
def test_hostile_case(corpus: CorpusRun, name: str) -> None:
    case = corpus.cases[name]
    result = corpus.results.get(name)
    assert result is not None, f"not run: {corpus.died or 'the driver stopped early'}"
    raw = corpus.raw_stderr.get(name, "")
    for sign in ("Traceback", "panicked", "stack backtrace", "Fatal Python error"):
        assert sign not in result["err"] + raw, result["err"] + raw
    assert result["rc"] == case.rc, result["err"]
    if case.error is not None and name == "meta-tables-past-free-memory":
        assert result["err"].startswith(f"nanoscope: error: {case.error}") and result["err"].count("\n") == 1
    elif case.error is not None:
        assert result["err"] == f"nanoscope: error: {case.error}\n"
    if case.output is not None:
        assert case.output in result["out"], result["out"]
    assert result["peak_kb"] < PEAK_RSS_BOUND_KB, f"peak RSS grew by {result['peak_kb'] // 1024} MB"
    assert result["seconds"] < SECONDS_BOUND
    for marker in case.markers:
        assert not marker.exists(), f"{marker} appeared: pickled code ran"


def test_the_listing_names_every_hostile_model_on_its_own_line(corpus: CorpusRun) -> None:
    out = corpus.results["list-every-hostile-model"]["out"]
    lines = out.splitlines()
    assert len(lines) == len(MODEL_CASES)
    for name in MODEL_CASES:
        (line,) = [line for line in lines if line.startswith(f"base  {name} ")]
        expected = corpus.cases[name].error
        assert expected is not None
        # The same refusal as loading gives, for the copy of the file in the listing's folder.
        original = expected.split(": ", 1)[1]
        assert original in line, line


# ---------------------------------------------------------------------------------------------------
# the restricted unpickler: the second guard after the scan, refusing every global it was not given


def test_the_restricted_unpickler_refuses_every_global_even_with_no_scan_before_it(tmp_path):
    from desktop.engine.files.restricted_unpickler import GlobalRefused, loads_plain

    legacy = [0x1950A86A20F9469CFC6C, {"little_endian": True, "type_sizes": {"int": 4}}, ["0", "1"]]
    assert loads_plain(pickle.dumps(legacy, protocol=2)) == legacy  # what torch's legacy stream holds
    plain = ["model.weight", 1, (2.5, b"x"), {"k": None}, {3}]
    assert loads_plain(pickle.dumps(plain, protocol=5)) == plain
    marker = tmp_path / "ran"
    payloads = [
        pickle.dumps(os.getcwd),  # a bare global
        b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.",  # a call (REDUCE)
        pickle.dumps(collections.OrderedDict(a=1)),  # even a harmless class
    ]
    for payload in payloads:
        with pytest.raises(GlobalRefused):
            loads_plain(payload)
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# the pre-scan against generated pickles: structure-aware (what pickle writes) and mutated

_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.frozensets(st.integers(-50, 50), max_size=5)  # hashable members only: a leaf, not a nest
)


def _containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    )


_VALUES = st.recursive(_LEAVES, _containers, max_leaves=40)


def _scan(data: bytes):
    from desktop.engine.files import pickle_policy, pickle_scan

    return pickle_scan.scan_bytes(data, pickle_policy.Policy(callables=frozenset()))


@settings(max_examples=300, deadline=None)
@given(value=_VALUES, protocol=st.integers(0, 5))
def test_what_pickle_writes_is_never_called_corrupt(value, protocol):
    """Anything pickle.dumps writes (nested well within the limits) is accepted, or refused only
    for a global it needs (protocols 0-3 spell bytes and sets with calls)."""
    from desktop.engine.files.pickle_scan import PickleRefused

    try:
        _scan(pickle.dumps(value, protocol=protocol))
    except PickleRefused as exc:
        assert exc.kind == "global", exc.reason
        assert exc.name in {
            "_codecs.encode",
            "builtins.set",
            "builtins.frozenset",
            "__builtin__.set",
            "__builtin__.frozenset",
            "copy_reg._reconstructor",
            "builtins.bytes",
            "__builtin__.bytes",
        }, exc.name


@settings(max_examples=500, deadline=None)
@given(
    value=_VALUES,
    protocol=st.integers(2, 5),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10_000),
)
# Found by this test: a GLOBAL whose name line holds "\q", which pickletools' reader unescapes with
# a DeprecationWarning (an error here) instead of failing.
@example(value=[{"\\": b""}], protocol=2, edits=[(0, 99)], cut=29)
def test_mutated_pickles_are_refused_or_well_formed(value, protocol, edits, cut):
    """Flipped bytes and cut-off pickles end in PickleRefused, never another exception; what the scan
    accepts, the C unpickler can walk without finding the stack or the memo broken."""
    from desktop.engine.files.pickle_scan import PickleRefused

    data = bytearray(pickle.dumps(value, protocol=protocol))
    for at, byte in edits:
        data[at % len(data)] = byte
    data = bytes(data[: max(1, cut % (len(data) + 1))])
    try:
        _scan(data)
    except PickleRefused:
        return

    class NoNames(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError("no globals")

    # What the values are (unhashable keys, a bad float...) is not the scan's question; a broken
    # stack or memo (IndexError, KeyError, EOFError) would be.
    with contextlib.suppress(pickle.UnpicklingError, TypeError, ValueError, OverflowError, AttributeError):
        NoNames(io.BytesIO(data)).load()


# ---------------------------------------------------------------------------------------------------
# atheris: coverage-guided fuzzing of the pre-scan and the meta parser, for a bounded time

FUZZ = r"""
import sys

import atheris

with atheris.instrument_imports():
    from desktop.engine.files import pickle_policy, pickle_scan, safe_json
    from desktop.engine.nanochat import classify
    from desktop.engine.errors import CheckpointError

RECORDS = {"0": 64, "1": 1 << 20}  # storage keys the torch policy may name, and their sizes


def one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    which = fdp.ConsumeIntInRange(0, 2)
    rest = fdp.ConsumeBytes(fdp.remaining_bytes())
    if which == 0:
        try:
            pickle_scan.scan_bytes(rest, pickle_policy.TORCH_POLICY, RECORDS)
        except pickle_scan.PickleRefused:
            pass
    elif which == 1:
        try:
            pickle_scan.scan_bytes(rest, pickle_policy.TOKENIZER_POLICY)
        except pickle_scan.PickleRefused:
            pass
    else:
        text = rest.decode("utf-8", "replace")
        try:
            meta = safe_json.loads_bounded(text)
            classify.read_model_config({"model_config": meta} if isinstance(meta, dict) else {}, "fuzz")
        except (safe_json.JsonRefused, CheckpointError):
            pass


atheris.Setup(sys.argv, one_input)
atheris.Fuzz()
"""


@pytest.mark.slow
def test_fuzz_the_pre_scan_and_the_meta_parser(tmp_path):
    """Any exception other than the refusals, a hang or a memory blow-up is a finding (the input is
    kept in tmp_path as crash-*)."""
    pytest.importorskip("atheris")
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for i, data in enumerate(
        [
            pickle.dumps({"a": (1, 2.0, "x", b"y", [None, True])}),
            hostile.PROTO + hostile.one_tensor_dict(hostile.float_tensor()) + hostile.STOP,
            b"\x02"
            + json.dumps(
                {
                    "sequence_len": 64,
                    "vocab_size": 300,
                    "n_layer": 2,
                    "n_head": 2,
                    "n_embd": 64,
                    "engram_layers": "0,1",
                }
            ).encode(),
        ]
    ):
        (seeds / f"seed{i}").write_bytes(data)
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            FUZZ,
            "-max_total_time=60",
            "-rss_limit_mb=2048",
            "-timeout=10",
            f"-artifact_prefix={tmp_path}/",
            str(seeds),
        ],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
