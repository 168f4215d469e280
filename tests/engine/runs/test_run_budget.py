"""A run is read under one budget, shared by its stages and files: values, series, saved steps and
meta bytes are counted for the whole run, and what is past them is left out with one line each.
A step whose meta is missing or unreadable is left out with one line naming it; the rest is
listed. Valid controls are the golden runs (written by nanochat's own code) and metas copied from
them; hostile runs are built from those, with the limits lowered where a real-size input would
take the suite's time."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import REPO
from support.golden import EXPERIMENT_CASES, GOLDEN, manifest

from desktop.cli import main as cli
from desktop.engine.runs import budget as run_budget
from desktop.engine.runs import experiment_logs
from desktop.engine.runs.budget import RunBudget
from desktop.engine.runs.experiment_logs import METRIC_RECORDS, NOT_SERIES, STEP_RECORDS, read_series
from desktop.engine.runs.timeline import LOOP_STATE, NOT_METRICS, timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
GOLDEN_META = GOLDEN / "nanochat" / "E7" / "base_checkpoints" / "d2" / "meta_000010.json"
CASE = EXPERIMENT_CASES[0]
M = manifest(CASE)


def demo_copy(tmp_path: Path) -> Path:
    """The demo run and its tokenizer under ``tmp_path`` (a nanochat base dir)."""
    run = tmp_path / "chatsft_checkpoints" / "demo"
    shutil.copytree(DEMO, run)
    shutil.copytree(DEMO.parent.parent / "tokenizer", tmp_path / "tokenizer")
    return run


def stage(root: Path, phase: str, steps: range, meta: dict | None = None) -> Path:
    """A stage folder of ``steps``: empty model files (the timeline never opens them), each with
    the golden meta (or ``meta``) beside it."""
    folder = root / phase / "d2"
    folder.mkdir(parents=True)
    text = GOLDEN_META.read_text() if meta is None else json.dumps(meta)
    for step in steps:
        (folder / f"model_{step:06d}.pt").touch()
        (folder / f"meta_{step:06d}.json").write_text(text)
    return folder


def experiment_copy(tmp_path: Path) -> Path:
    target = tmp_path / "experiments" / M["experiment"]
    shutil.copytree(CASE / "experiments" / M["experiment"], target)
    return target / M["tag"]


# ----- a broken step: left out, named, the rest listed ------------------------------------------


def test_steps_without_a_readable_meta_are_named_and_the_rest_listed(tmp_path, capsys):
    run = demo_copy(tmp_path)
    good = [p.step for p in timeline_of(run).points]
    shutil.copyfile(run / f"model_{good[1]:06d}.pt", run / "model_009000.pt")  # no meta beside it
    (run / f"meta_{good[2]:06d}.json").unlink()
    os.mkfifo(run / f"meta_{good[2]:06d}.json")
    (run / f"meta_{good[3]:06d}.json").unlink()
    (run / f"meta_{good[3]:06d}.json").symlink_to(run / f"meta_{good[3]:06d}.json")  # a loop
    timeline = timeline_of(run)
    assert [p.step for p in timeline.points] == good[:2]
    assert len(timeline.problems) == 3 and all("\n" not in line for line in timeline.problems)
    assert any("no meta_009000.json" in line for line in timeline.problems)
    assert any(f"meta_{good[2]:06d}.json: not a regular file (a named pipe)" in p for p in timeline.problems)
    assert any(f"meta_{good[3]:06d}.json: cannot read" in line for line in timeline.problems)
    assert cli.main(["timeline", str(run)]) == 0
    assert capsys.readouterr().err.count("nanoscope: warning: ") == 3
    # eval asks the steps that are there (one prompt, so the model runs for a moment)
    argv = ["eval", str(run), "--task", "samples", "--prompt", "1 + 1 =", "--steps", str(good[0]), "--json"]
    assert cli.main(argv) == 0
    assert [json.loads(line)["step"] for line in capsys.readouterr().out.splitlines()] == [good[0]]


# ----- steps, series, values and metas per run ----------------------------------------------------


def test_saved_steps_are_counted_for_the_run_not_for_each_stage(tmp_path, monkeypatch):
    monkeypatch.setattr(run_budget, "MAX_STEPS", 6)
    stage(tmp_path, "base_checkpoints", range(10, 50, 10))
    stage(tmp_path, "chatsft_checkpoints", range(10, 50, 10))
    timeline = timeline_of(tmp_path / "base_checkpoints" / "d2")
    assert [(p.stage, p.step) for p in timeline.points] == [
        *(("base", s) for s in (10, 20, 30, 40)),
        ("sft", 10),
        ("sft", 20),
    ]
    assert timeline.problems == (
        f"{tmp_path / 'base_checkpoints' / 'd2'}: more than 6 saved steps; the later ones are left out "
        "(the limit for one run)",
    )


def test_a_meta_where_every_key_is_a_metric_keeps_the_runs_series(tmp_path, monkeypatch):
    monkeypatch.setattr(run_budget, "MAX_SERIES", 40)
    meta = json.loads(GOLDEN_META.read_text())
    meta.update({f"k{i}": i / 7 for i in range(5_000)})
    folder = stage(tmp_path, "base_checkpoints", range(10, 40, 10), meta)
    timeline = timeline_of(folder)
    assert [p.step for p in timeline.points] == [10, 20, 30]
    names = timeline.metric_names()
    assert len(names) == 40 and names[0] == "val_bpb"  # the meta's own first, then as many as fit
    assert all(p.metrics == timeline.points[0].metrics for p in timeline.points)
    assert [line for line in timeline.problems if "series" in line] == [
        f"{folder}: more than 40 series; the others are left out (the limit for one run)"
    ]


def test_metas_past_the_runs_bytes_list_their_steps_without_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(run_budget, "MAX_META_BYTES", 2 * GOLDEN_META.stat().st_size)
    folder = stage(tmp_path, "base_checkpoints", range(10, 50, 10))
    timeline = timeline_of(folder)
    assert [p.step for p in timeline.points] == [10, 20, 30, 40]  # every step listed
    assert [bool(p.metrics) for p in timeline.points] == [True, True, False, False]
    assert [p.changes for p in timeline.points[2:]] == [{}, {}]  # not read: nothing said to change
    assert len(timeline.problems) == 1 and "metas of more than" in timeline.problems[0]


def test_a_meta_of_a_million_settings_spends_the_values_once(tmp_path, monkeypatch):
    monkeypatch.setattr(run_budget, "MAX_VALUES", 1_000)
    meta = json.loads(GOLDEN_META.read_text())
    meta["user_config"] = {f"k{i}": i for i in range(20_000)}
    folder = stage(tmp_path, "base_checkpoints", range(10, 30, 10), meta)
    timeline = timeline_of(folder)
    assert [p.step for p in timeline.points] == [10, 20]
    assert [p.changes for p in timeline.points] == [{}, {}]
    assert any("more than 1,000 values read" in line for line in timeline.problems)


def test_a_stage_log_of_unbounded_series_stops_at_the_runs_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(run_budget, "MAX_SERIES", 30)
    monkeypatch.setattr(run_budget, "MAX_VALUES", 5_000)
    tag = experiment_copy(tmp_path)
    log = tag / "base_train.log"
    with open(log, "a", encoding="utf-8") as f:
        for step in range(100, 400):
            f.write(f"eval step={step} " + " ".join(f"s{step}_{j}=0.5" for j in range(200)) + "\n")
    budget = RunBudget(tag)
    series, _ = read_series(log, "base", budget)
    assert budget.values <= 5_000 and len(budget.series) <= 30  # what was parsed, not only kept
    assert len(series) <= 30 and sum(len(s.steps) for s in series) <= 5_000
    timeline = timeline_of(tag)
    assert len({(c.name, c.stage) for c in timeline.curves}) + len(timeline.metric_names()) <= 2 * 30
    budget_lines = [line for line in timeline.problems if "(the limit for one run)" in line]
    assert budget_lines == [
        f"{tag}: more than 30 series; the others are left out (the limit for one run)",
        f"{tag}: more than 5,000 values read; the rest is left out (the limit for one run)",
    ]


def test_two_logs_of_quoted_records_share_the_runs_values(tmp_path, monkeypatch):
    monkeypatch.setattr(run_budget, "MAX_VALUES", 3_000)
    tag = experiment_copy(tmp_path)
    line = "eval step=1 " + "gpu='A B' " * 500 + "\n"
    for name in ("base_train.log", "sft.log"):
        (tag / name).write_text(line * 1_000)
    budget = RunBudget(tag)
    for name, where in (("base_train.log", "base"), ("sft.log", "sft")):
        read_series(tag / name, where, budget)
    assert budget.values == 3_000  # five records of 501 values fit; the sixth ends both logs
    assert budget.lines() == [
        f"{tag}: more than 3,000 values read; the rest is left out (the limit for one run)"
    ]


def test_the_golden_runs_read_whole_within_the_budgets():
    for target in (CASE / "experiments" / M["experiment"] / M["tag"], GOLDEN_META.parent):
        assert not any("(the limit for one run)" in line for line in timeline_of(target).problems)


# ----- the grammars, against what a writer writes -------------------------------------------------

KEYS = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda k: k not in NOT_SERIES)
NUMBERS = st.one_of(st.integers(-(10**12), 10**12), st.floats(allow_nan=False, allow_infinity=False))
WORDS = st.text(st.sampled_from("ab '\"\\="), max_size=8).map(lambda s: "x" + s)  # never a number


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(STEP_RECORDS)),
            st.integers(0, 10_000),
            st.dictionaries(KEYS, st.one_of(NUMBERS, WORDS), max_size=6),
        ),
        max_size=30,
    )
)
def test_stage_log_records_read_back_as_written(tmp_path_factory, records):
    """Records written as nanochat's logfmt writes them (numbers as Python prints them, text
    shell-quoted) come back as series of exactly their numbers; each text where a metric
    belongs is one problem line (a few, then a count)."""
    log = tmp_path_factory.mktemp("log") / "base_train.log"
    lines, want, bad = ["prose before the records"], {}, 0
    for tag, step, fields in records:
        lines.append(
            f"{tag} step={step} " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in fields.items())
        )
        for key, value in fields.items():
            if isinstance(value, str):
                bad += tag in METRIC_RECORDS
            else:
                want.setdefault(key, {})[step] = float(value)
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    series, problems = read_series(log, "base", RunBudget(log.parent))
    got = {s.name: dict(zip(s.steps, s.values, strict=True)) for s in series}
    assert got == {k: dict(sorted(v.items())) for k, v in want.items()}
    shown = min(bad, experiment_logs.MAX_PROBLEMS_PER_FILE)
    assert len(problems) == shown + (bad > shown)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        st.text(max_size=12),
        st.one_of(
            NUMBERS, st.text(max_size=5), st.none(), st.booleans(), st.lists(st.integers(), max_size=2)
        ),
        max_size=40,
    ),
    st.dictionaries(st.sampled_from(LOOP_STATE), NUMBERS, max_size=3),
)
def test_a_metas_numbers_are_its_metrics_and_the_rest_a_few_lines(tmp_path_factory, extra, loop):
    """Any meta nanochat could write, and more: its finite top-level numbers (and loop_state's)
    are the step's metrics, nothing else is; what is in their place costs a few lines, then a
    count. The golden meta is the start."""
    meta = {**json.loads(GOLDEN_META.read_text()), **extra, "loop_state": loop}
    folder = stage(tmp_path_factory.mktemp("run"), "base_checkpoints", range(10, 11), meta)
    timeline = timeline_of(folder)
    found = {k: v for k, v in meta.items() if k not in NOT_METRICS} | loop
    want = {
        k: float(v)
        for k, v in found.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    assert timeline.points[0].metrics == want
    said = sum(isinstance(v, str) or v is None for v in found.values())
    assert len(timeline.problems) == min(said, 5) + (said > 5)
