"""Numbers and paths that files (and the command line) name, read by one rule each.

* A number is read by ``engine/files/numbers.py``: what overflows a float or a count, NaN and
  infinity are refused by name ("val_bpb is a 400-digit number, too large for a float"), never an
  OverflowError. The grammars that carry numbers (stage logs, metas, training TOMLs) are checked
  by property: generated values, huge integers, inf and nan among them, give either a clean read
  or one line.
* A path is checked by ``bounded.named_path`` before the disk is touched: a NUL byte, a name or a
  path longer than the system allows, or a value that is not text is one line naming the path.
* A CORE language-modelling example whose continuation merges into its context's last token is
  refused for that example; more than 100 sample prompts is one line; a hostile row in the
  eval-results store is set aside with a log line and the step is asked again.

Valid controls are files the real tools wrote (the golden corpus): they read as before.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import REPO
from support.eval_bundle import make_bundle, write_jsonl
from support.golden import EXPERIMENT_CASES, GOLDEN, manifest

from desktop.cli.main import main
from desktop.engine.backend import LoadOptions
from desktop.engine.chat_template import template_source
from desktop.engine.errors import CheckpointError
from desktop.engine.files.bounded import PathRefused, named_path
from desktop.engine.files.numbers import (
    NotANumber,
    NumberRefused,
    finite_float,
    integer,
    parse_count,
    parse_float,
)
from desktop.engine.kempnerforge.config import parse_config, read_toml
from desktop.engine.runs import core_bundle as core
from desktop.engine.runs.budget import RunBudget
from desktop.engine.runs.checked_answers import bundled_problems
from desktop.engine.runs.experiment_logs import read_series
from desktop.engine.runs.multiple_choice import read_questions
from desktop.engine.runs.tensorboard_scalars import kf_curves
from desktop.engine.runs.timeline import timeline_of
from desktop.store.eval_results import EvalResults, kept_answers, kept_choices

EXPERIMENT = EXPERIMENT_CASES[0] / "experiments" / manifest(EXPERIMENT_CASES[0])["experiment"]
TAG = EXPERIMENT / manifest(EXPERIMENT_CASES[0])["tag"]
KF = GOLDEN / "kempnerforge" / "dense-gqa-qknorm"
DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
HUGE = "9" * 400
LONG_NAME = "a" * 300  # past NAME_MAX (255 bytes)


def cli(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """Exit code, stdout and stderr's lines of ``nanoscope ARGV``, never a traceback or a
    catch-all line."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "unexpected" not in err, err
    return code, out, err.splitlines()


def one_error(capsys, *argv: str) -> str:
    """The one error line of a refused command (exit 2)."""
    code, _, lines = cli(capsys, *argv)
    errors = [line for line in lines if line.startswith("nanoscope: error: ")]
    assert code == 2 and len(errors) == 1, lines
    return errors[0]


# ---------------------------------------------------------------------------------------------------
# the number rule


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (10**400, "is a 401-digit number, too large for a float"),
        (10**400 - 1, "is a 400-digit number, too large for a float"),
        (math.inf, "is inf"),
        (-math.inf, "is -inf"),
        (math.nan, "is nan"),
    ],
)
def test_a_parsed_number_that_is_no_finite_float_is_refused_by_name(value, reason):
    with pytest.raises(NumberRefused) as refused:
        finite_float(value)
    assert str(refused.value) == reason


@pytest.mark.parametrize("value", ["1.5", None, True, [1], {"a": 1}])
def test_what_is_not_a_number_is_said_apart(value):
    with pytest.raises(NotANumber):
        finite_float(value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (HUGE, "is a 400-digit number, too large for a float"),
        ("1e999", "is 1e999, too large for a float"),
        ("inf", "is inf"),
        ("-Infinity", "is -inf"),
        ("NaN", "is nan"),
    ],
)
def test_a_number_written_as_text_is_refused_by_name(text, reason):
    with pytest.raises(NumberRefused) as refused:
        parse_float(text)
    assert str(refused.value) == reason


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("9" * 5000, "is a 5000-digit number, not an integer from 0 to 9,007,199,254,740,991"),
        (str(2**53), "is a 16-digit number, not an integer from 0 to 9,007,199,254,740,991"),
        ("-5", "is -5, not an integer from 0 to 9,007,199,254,740,991"),
        ("1.5", "is 1.5, not a count"),
    ],
)
def test_a_count_is_bounded_before_int_reads_its_digits(text, reason):
    with pytest.raises(NumberRefused) as refused:
        parse_count(text)
    assert str(refused.value) == reason


def test_the_bounds_hold_at_their_edges():
    assert parse_count(str(2**53 - 1)) == 2**53 - 1
    assert parse_count("007") == 7
    assert finite_float(2**1023) == float(2**1023)
    assert integer(-1, lo=-1) == -1


def _golden_series() -> dict[str, dict[int, float]]:
    series, problems = read_series(TAG / "base_train.log", "base", RunBudget(TAG))
    assert problems == [] and series
    return {s.name: dict(zip(s.steps, s.values, strict=True)) for s in series}


GOLDEN_SERIES = _golden_series()  # val_bpb and the rest, as base_train wrote them
GOLDEN_POINTS = {(p.stage, p.step): p.metrics for p in timeline_of(TAG).points}


# stage logs: nanochat's record grammar, ``<tag> key=value ...``, carrying generated numbers

_GOOD_STEP = st.integers(0, 2**53 - 1).map(lambda n: (str(n), n))
_BAD_STEP = st.one_of(
    st.integers(17, 5000).map(lambda n: "9" * n),
    st.integers(-(10**6), -1).map(str),
    st.sampled_from(["nan", "inf", "1.5", "1e3", "x"]),
).map(lambda text: (text, None))
_GOOD_VALUE = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**300), 10**300).map(str),
).map(lambda text: (text, float(text)))
_BAD_VALUE = st.one_of(
    st.integers(310, 5000).map(lambda n: "9" * n),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "-1e400", "NaN", "word", "a\x00b", "\x1b[2J"]),
).map(lambda text: (text, None))
_RECORDS = st.lists(
    st.tuples(
        st.one_of(_GOOD_STEP, _BAD_STEP),
        st.sampled_from(["x_loss", "x_bpb", "x_acc"]),
        st.one_of(_GOOD_VALUE, _BAD_VALUE),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(records=_RECORDS)
def test_stage_log_records_are_read_or_refused_in_one_line_each(tmp_path_factory, records):
    """The golden base_train.log with generated ``eval`` records appended: every record whose step
    is a count and whose value a finite float is a point (the last one logged at a step wins),
    every other one is one problem line, and the golden series are read exactly as before."""
    log = tmp_path_factory.mktemp("log") / "base_train.log"
    golden = (TAG / "base_train.log").read_text(encoding="utf-8")
    lines = [f"eval step={step} {key}={value}" for (step, _), key, (value, _) in records]
    log.write_text(golden + "".join(line + "\n" for line in lines), encoding="utf-8")

    series, problems = read_series(log, "base", RunBudget(log.parent))

    want: dict[str, dict[int, float]] = {}
    for (_, step), key, (_, value) in records:
        if step is not None and value is not None:
            want.setdefault(key, {})[step] = value
    got = {s.name: dict(zip(s.steps, s.values, strict=True)) for s in series}
    assert {k: v for k, v in got.items() if k.startswith("x_")} == want
    assert {k: v for k, v in got.items() if not k.startswith("x_")} == GOLDEN_SERIES
    refused = sum(step is None or value is None for (_, step), _, (_, value) in records)
    assert len(problems) == min(refused, 5) + (refused > 5)  # the first five, then a count
    assert all(line.isprintable() and len(line) < 400 for line in problems)


def test_a_huge_step_or_value_in_a_stage_log_is_one_warning_and_the_run_is_drawn(capsys, tmp_path):
    experiment = tmp_path / "experiments" / EXPERIMENT.name
    shutil.copytree(EXPERIMENT, experiment)
    tag = experiment / TAG.name
    log = tag / "base_train.log"
    log.write_text(log.read_text() + f"eval step={HUGE} val_bpb=1.0\neval step=70 val_bpb={HUGE}\n")
    code, out, lines = cli(capsys, "timeline", str(tag))
    assert code == 0 and "3 saved steps" in out
    assert lines == [
        f"nanoscope: warning: {log}:72: eval record whose step is a 400-digit number, "
        "not an integer from 0 to 9,007,199,254,740,991; skipped",
        f"nanoscope: warning: {log}:73: val_bpb is a 400-digit number, too large for a float; left out",
    ]


# metas: JSON objects whose every top-level number may be a metric

# (JSON text, what the timeline makes of it): a metric, a line naming the key, nothing (a list or an
# object is not meant as a metric) or the whole meta refused (more digits than Python reads)
_META_VALUES = st.one_of(
    st.integers(-(10**300), 10**300).map(lambda n: (str(n), float(n))),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda x: (json.dumps(x), x)),
    st.integers(309, 4300).map(lambda n: ("9" * n, f"is a {n}-digit number, too large for a float")),
    st.integers(4301, 6000).map(lambda n: ("9" * n, "4300 digits")),
    st.text(max_size=20).map(lambda t: (json.dumps(t), "is not a number")),
    st.sampled_from([("null", "is not a number"), ("true", None), ("[1, 2]", None), ('{"a": 1}', None)]),
)


@pytest.fixture(scope="module")
def experiment_copy(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("exp") / "experiments" / EXPERIMENT.name
    shutil.copytree(EXPERIMENT, target)
    return target / TAG.name


@settings(max_examples=60, deadline=None)
@given(value=_META_VALUES)
def test_a_meta_value_is_a_metric_or_one_line(experiment_copy, value):
    """A golden meta with one more top-level value: the value is a metric, or one line naming
    it, and everything else of the run reads as the golden run reads."""
    text, outcome = value
    meta = experiment_copy / "base" / "meta_000030.json"
    golden = (TAG / "base" / "meta_000030.json").read_text()
    meta.write_text(golden.replace('{\n  "step": 30,', f'{{\n  "x_metric": {text},\n  "step": 30,', 1))

    timeline = timeline_of(experiment_copy)

    points = {(p.stage, p.step): p.metrics for p in timeline.points}
    mine = [line for line in timeline.problems if str(meta) in line]
    if outcome == "4300 digits":  # json.loads cannot read it: the step is left out, said once
        assert ("base", 30) not in points and len(mine) == 1 and outcome in mine[0]
        return
    metrics = points.pop(("base", 30))
    assert points == {k: v for k, v in GOLDEN_POINTS.items() if k != ("base", 30)}
    assert {k: v for k, v in metrics.items() if k != "x_metric"} == GOLDEN_POINTS[("base", 30)]
    if isinstance(outcome, float):
        assert metrics["x_metric"] == outcome and mine == []
    elif isinstance(outcome, str):
        assert "x_metric" not in metrics and mine == [f"{meta}: x_metric {outcome}; left out"]
    else:
        assert "x_metric" not in metrics and mine == []


def test_a_400_digit_metric_in_a_meta_is_one_warning(capsys, tmp_path):
    experiment = tmp_path / "experiments" / EXPERIMENT.name
    shutil.copytree(EXPERIMENT, experiment)
    meta = experiment / TAG.name / "base" / "meta_000030.json"
    meta.write_text(meta.read_text().replace('"val_bpb": 1.7844830552344804', f'"val_bpb": {HUGE}'))
    code, out, lines = cli(capsys, "timeline", str(experiment / TAG.name))
    assert code == 0 and "3 saved steps" in out
    assert lines == [
        f"nanoscope: warning: {meta}: val_bpb is a 400-digit number, too large for a float; left out"
    ]


# training TOMLs: KempnerForge's [model] numbers and the paths its tables name

_TOML_VALUES = st.one_of(
    st.integers(-(10**500), 10**500).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["inf", "-inf", "nan", "+inf", "1e300", "true", "[1, 2]", '"x"']),
    st.text(max_size=10).map(json.dumps),
)


_TOML_FIELDS = ["dim", "ffn_dim_multiplier", "norm_eps", "rope_theta", "n_heads", "vocab_size"]


@settings(max_examples=150, deadline=None)
@given(field=st.sampled_from(_TOML_FIELDS), value=_TOML_VALUES)
def test_a_toml_number_is_a_config_or_one_line(tmp_path_factory, field, value):
    golden = (KF / "train.toml").read_text()
    text = "\n".join(line for line in golden.splitlines() if not line.startswith(f"{field} ="))
    if field == "ffn_dim_multiplier":
        text = text.replace("ffn_hidden_dim = 96\n", "")  # the multiplier counts only without it
    path = tmp_path_factory.mktemp("toml") / "train.toml"
    path.write_text(text.replace("[model]\n", f"[model]\n{field} = {value}\n"))
    try:
        config = parse_config(read_toml(path), path)
    except CheckpointError as exc:
        message = str(exc)
        assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 400
        return
    number = getattr(config.model, field, None)
    assert number is None or math.isfinite(number)
    assert 0 < config.model.ffn_hidden_dim <= 1 << 31


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("ffn_dim_multiplier = inf", "model.ffn_dim_multiplier is inf"),
        ("ffn_dim_multiplier = nan", "model.ffn_dim_multiplier is nan"),
        (
            f"ffn_dim_multiplier = {HUGE}",
            "model.ffn_dim_multiplier is a 400-digit number, too large for a float",
        ),
        (
            "ffn_dim_multiplier = 1e300",
            "model.ffn_dim_multiplier = 1e+300 makes an FFN size of a 303-digit number",
        ),
        ("ffn_dim_multiplier = -1.0", "model.ffn_dim_multiplier = -1 makes an FFN size of 0"),
        (
            f"dim = {HUGE}",
            "model.dim is a 400-digit number, not an integer from -2,147,483,648 to 2,147,483,648",
        ),
    ],
)
def test_a_kempnerforge_toml_with_an_overflowing_number_is_one_line(tmp_path, line, message):
    golden = (KF / "train.toml").read_text().replace("ffn_hidden_dim = 96\n", "")
    key = line.split(" =")[0]
    text = "\n".join(x for x in golden.splitlines() if not x.startswith(f"{key} ="))
    path = tmp_path / "train.toml"
    path.write_text(text.replace("[model]\n", f"[model]\n{line}\n"))
    with pytest.raises(CheckpointError) as refused:
        parse_config(read_toml(path), path)
    assert str(refused.value) == f"{path}: {message}"


def test_the_golden_toml_reads_as_its_run_was_trained():
    config = parse_config(read_toml(KF / "train.toml"), KF / "train.toml").model
    want = manifest(KF)["config"]
    assert (config.dim, config.ffn_hidden_dim, config.norm_eps, config.rope_theta) == (
        want["dim"],
        want["ffn_hidden_dim"],
        want["norm_eps"],
        want["rope_theta"],
    )


# ---------------------------------------------------------------------------------------------------
# the path rule

_NAMES = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30)
_PATHS = st.one_of(
    _NAMES.map(lambda s: f"tb/{s}"),
    st.integers(256, 600).map(lambda n: "x" * n),
    st.integers(1400, 2100).map(lambda n: "/".join(["abc"] * n)),  # a path past PATH_MAX
    _NAMES.map(lambda s: f"{s}\x00{s}"),
)


@settings(max_examples=100, deadline=None)
@given(text=st.one_of(_PATHS, st.text(max_size=10)))
def test_a_path_is_usable_or_refused_before_the_disk_is_touched(text):
    try:
        path = named_path(text)
    except PathRefused as exc:
        assert "\n" not in exc.reason and len(str(exc)) < 300
        return
    assert path.exists() in (True, False)  # neither ValueError nor OSError from the system


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("a\x00b", "a path with a NUL byte"),
        (f"/tmp/{LONG_NAME}", "a name of 300 bytes in the path (the system allows 255)"),
        ("/".join(["abcd"] * 1000), "a path of 4,999 bytes (the system allows 4,095)"),
        ("a\ud800", "not a path (characters no file name has)"),
        (5, "not a path (int)"),
        (["a"], "not a path (list)"),
    ],
)
def test_a_path_no_file_can_have_is_refused_by_name(value, reason):
    with pytest.raises(PathRefused) as refused:
        named_path(value)
    assert refused.value.reason == reason


@settings(max_examples=40, deadline=None)
@given(text=_PATHS)
def test_a_tensorboard_dir_is_read_or_one_line(tmp_path_factory, text):
    """A TOML naming a folder where nothing was logged reads no curve and says nothing; one
    naming a folder no path can be says so in one line."""
    run = _kf_copy(tmp_path_factory.mktemp("kf"), f"tensorboard_dir = {_toml_string(text)}")
    toml = run.parent / "train.toml"
    curves, problems = kf_curves(run)
    assert curves == []
    if "\x00" in text:
        assert problems == [
            f"{toml}: metrics.tensorboard_dir: a path with a NUL byte; no TensorBoard scalars read"
        ]
    elif len(text) > 255:
        assert len(problems) == 1 and problems[0].startswith(f"{toml}: metrics.tensorboard_dir: a ")
        assert "(the system allows" in problems[0]
    else:
        assert problems == []


def test_the_golden_tensorboard_dir_named_in_the_toml_reads_as_before(tmp_path):
    run = _kf_copy(tmp_path, 'tensorboard_dir = "tb_logs"')
    (named, problems), (golden, none) = kf_curves(run), kf_curves(KF / "run")
    assert [(c.name, c.xs, c.ys) for c in named] == [(c.name, c.xs, c.ys) for c in golden] != []
    assert problems == none == []


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: everything but printable ASCII escaped."""
    plain = (c if c.isascii() and c.isprintable() and c not in '"\\' else f"\\U{ord(c):08x}" for c in text)
    return '"' + "".join(plain) + '"'


def _kf_copy(base: Path, metrics_line: str) -> Path:
    """The golden KempnerForge run copied with a line added to its TOML's [metrics] table."""
    target = base / "kf"
    shutil.copytree(KF, target, dirs_exist_ok=True)
    toml = target / "train.toml"
    toml.write_text((KF / "train.toml").read_text().replace("[metrics]\n", f"[metrics]\n{metrics_line}\n"))
    return target / "run"


@pytest.mark.parametrize("name", ["tok\x00enizer", LONG_NAME])
def test_a_tokenizer_path_no_folder_can_have_is_one_line(tmp_path, name):
    path = tmp_path / "train.toml"
    path.write_text((KF / "train.toml").read_text().replace('"tokenizer"', _toml_string(name)))
    with pytest.raises(CheckpointError) as refused:
        parse_config(read_toml(path), path)
    assert str(refused.value).startswith(f"{path}: data.tokenizer_path: ")


def test_a_dataset_uri_with_a_nul_skips_its_task_in_one_line(tmp_path):
    bundle = make_bundle(tmp_path)
    (bundle / "core.yaml").write_text(
        (bundle / "core.yaml")
        .read_text()
        .replace("dataset_uri: schema.jsonl", 'dataset_uri: "sch\\0ema.jsonl"')
    )
    tasks, problems = core.read_tasks(bundle)
    assert [t.label for t in tasks] == ["mc_task", "mc_fewshot", "lm_task"]
    assert len(problems) == 1 and problems[0].startswith(f"{bundle / 'core.yaml'}: task 3: ")
    assert problems[0].endswith("ema.jsonl: a path with a NUL byte; skipped")


@pytest.mark.parametrize(
    "argv",
    [
        ["timeline", f"/tmp/{LONG_NAME}"],
        ["timeline", "/tmp/a\x00b"],
        ["eval", f"/tmp/{LONG_NAME}", "--task", "samples"],
        ["eval", str(DEMO), "--task", "bpb", "--data", f"/tmp/{LONG_NAME}"],
        ["eval", str(DEMO), "--task", "mc", "--data", "/tmp/a\x00b.jsonl"],
        ["eval", str(DEMO), "--task", "core", "--data", f"/tmp/{LONG_NAME}"],
        ["eval", str(DEMO), "--task", "core", "--data", "/tmp/a\x00b"],
        ["generate", str(DEMO), "--prompt", "hi", "--draft", f"/tmp/{LONG_NAME}"],
        ["generate", str(DEMO), "--prompt", "hi", "--draft", "int8:/tmp/a\x00b"],
        ["generate", str(DEMO), "--prompt", "hi", "--tokenizer", f"/tmp/{LONG_NAME}"],
        ["generate", str(DEMO), "--prompt", "hi", "--config", "/tmp/a\x00b.toml"],
        ["list", "--base-dir", "/tmp/a\x00b"],
        ["--home", f"/tmp/{LONG_NAME}", "list"],
    ],
    ids=[
        "timeline-long",
        "timeline-nul",
        "eval-run-long",
        "bpb-data-long",
        "mc-data-nul",
        "core-data-long",
        "core-data-nul",
        "draft-long",
        "draft-nul",
        "tokenizer-long",
        "config-nul",
        "base-dir-nul",
        "home-long",
    ],
)
def test_a_path_on_the_command_line_no_file_can_have_is_one_line(capsys, argv):
    line = one_error(capsys, *argv)
    assert line.endswith(("(the system allows 255)", "a path with a NUL byte")), line
    assert len(line) < 300


def test_a_draft_step_of_5000_digits_is_one_line(capsys):
    line = one_error(capsys, "generate", str(DEMO), "--prompt", "hi", "--draft", f"{DEMO}@{'9' * 5000}")
    assert line.endswith(
        "the step after @ is a 5000-digit number, not an integer from 0 to 9,007,199,254,740,991"
    )
    assert len(line) < 400


# ---------------------------------------------------------------------------------------------------
# CORE, sample prompts, the eval-results store, chat templates


def test_more_than_100_sample_prompts_is_one_line(capsys):
    prompts = [arg for _ in range(101) for arg in ("--prompt", "x")]
    assert one_error(capsys, "eval", str(DEMO), "--task", "samples", *prompts) == (
        "nanoscope: error: --prompt: between 1 and 100 prompts, got 101"
    )


def test_a_core_example_whose_continuation_merges_is_refused_and_the_rest_scored(capsys, tmp_path):
    """With the demo's tokenizer "hel" + "lo" is one token, "hello": the context's tokens are not
    a prefix of the whole. nanochat's core_eval asserts and stops; here that example alone is
    refused by name and counted as wrong, and the others are scored."""
    yaml = "icl_tasks:\n- label: lm\n  dataset_uri: lm.jsonl\n  num_fewshot: [0]\n"
    yaml += '  icl_task_type: language_modeling\n  continuation_delimiter: ""\n'
    bundle = make_bundle(tmp_path, yaml)
    data = write_jsonl(
        bundle / "eval_data" / "lm.jsonl",
        [{"context": "hel", "continuation": "lo"}, {"context": "Hello", "continuation": " world"}],
    )
    step = str(timeline_of(DEMO).points[-1].step)
    code, out, lines = cli(
        capsys, "eval", str(DEMO), "--task", "core", "--data", str(bundle), "--steps", step, "--json"
    )
    assert code == 0
    answers = [json.loads(line) for line in out.splitlines() if '"task": "core:lm"' in line]
    merged = next(a for a in answers if a["line"] == 1)
    assert merged["correct"] is False and merged["refused"] == core.MERGED
    assert next(a for a in answers if a["line"] == 2)["refused"] == ""
    assert [line for line in lines if "merges" in line] == [f"nanoscope: warning: {data}:1: {core.MERGED}"]


@pytest.fixture
def store(tmp_path) -> EvalResults:
    return EvalResults(tmp_path / "results.sqlite3")


def _ask_choices(store: EvalResults, tmp_path: Path):
    questions_file = write_jsonl(
        tmp_path / "mc.jsonl",
        [{"question": "What is 2 + 3?", "choices": ["4", "5", "6"], "answer": 1}],
    )
    questions, _ = read_questions(questions_file)
    point = timeline_of(DEMO).points[-1]
    return list(kept_choices(store, [point], questions, LoadOptions(device="cpu"), threading.Event()))


def _spoil(store: EvalResults, change) -> None:
    with sqlite3.connect(store.path) as db:
        for rowid, answers in db.execute("SELECT rowid, answers FROM results").fetchall():
            db.execute("UPDATE results SET answers = ? WHERE rowid = ?", (change(answers), rowid))


@pytest.mark.parametrize(
    "change",
    [
        lambda text: json.dumps([{**a, "chosen": 99} for a in json.loads(text)]),  # IndexError when shown
        lambda text: json.dumps([{**a, "step": "x"} for a in json.loads(text)]),
        lambda text: json.dumps([{**a, "logprobs": "abc"} for a in json.loads(text)]),
        lambda text: json.dumps([{**a, "logprobs": [10**400]} for a in json.loads(text)]),
        lambda text: json.dumps([{**a, "extra": 1} for a in json.loads(text)]),
        lambda text: json.dumps([{"stage": "sft"}]),
        lambda text: 12345,  # not text at all
        lambda text: b"[]",
    ],
    ids=["index", "step-text", "logprobs-text", "logprob-huge", "extra-field", "missing", "integer", "blob"],
)
def test_a_hostile_row_of_the_store_is_set_aside_and_the_step_asked_again(store, tmp_path, caplog, change):
    first = _ask_choices(store, tmp_path)
    assert [kept for _, kept in first] == [False]
    _spoil(store, change)
    with caplog.at_level(logging.WARNING, logger="desktop.store.eval_results"):
        again = _ask_choices(store, tmp_path)
    assert again == first  # asked again: the same answers, not kept ones
    said = [r.getMessage() for r in caplog.records if r.name == "desktop.store.eval_results"]
    assert len(said) == 1 and said[0].endswith("; asked again")
    assert _ask_choices(store, tmp_path) == [(first[0][0], True)]  # and kept anew


def test_a_hostile_weights_hash_is_computed_again(store, tmp_path):
    point = timeline_of(DEMO).points[-1]
    problems = bundled_problems(1)
    options = LoadOptions(device="cpu")
    first = list(kept_answers(store, [point], problems, options, threading.Event()))
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE file_hashes SET sha256 = ?", ("not a hash",))
    again = list(kept_answers(store, [point], problems, options, threading.Event()))
    assert [kept for _, kept in again] == [True] and again[0][0] == first[0][0]


@pytest.mark.parametrize(
    "templates",
    [
        [{"name": ["default"], "template": "x"}],
        [{"name": {"a": 1}, "template": "x"}, {"name": "default", "template": "{{ 1 }}"}],
    ],
)
def test_named_chat_templates_whose_names_are_not_text_are_passed_over(tmp_path, templates):
    found = template_source({"chat_template": templates}, tmp_path)
    named = [t for t in templates if t["name"] == "default"]
    assert found == ((named[0]["template"], tmp_path / "tokenizer_config.json") if named else None)
