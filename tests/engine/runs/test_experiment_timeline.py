"""The timeline of an experiment of nanochat's experiment_refactor branch (PR #800): the golden
experiment (tests/golden/nanochat-experiment, written by the branch's own code) and hostile logs
made from it."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from support.golden import EXPERIMENT_CASES, manifest

from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import FileRefused
from desktop.engine.files.log_lines import LogLines
from desktop.engine.runs import experiment_logs
from desktop.engine.runs.timeline import timeline_of

CASE = EXPERIMENT_CASES[0]
M = manifest(CASE)
EXPERIMENT = CASE / "experiments" / M["experiment"]
TAG = EXPERIMENT / M["tag"]
RECORD = re.compile(r"^eval step=(\d+)(?: eflops=\S+)? val_bpb=(\S+)$")


def logged_bpb(log: Path) -> dict[int, float]:
    """The log's eval records, read here with a pattern of their own."""
    found = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        if match := RECORD.match(line):
            found[int(match.group(1))] = float(match.group(2))
    return found


def curve(timeline, name: str, stage: str):
    return next(c for c in timeline.curves if c.name == name and c.stage == stage)


@pytest.fixture
def copy(tmp_path) -> Path:
    """The golden experiment copied, so a test may spoil its logs; returns its tag folder."""
    target = tmp_path / "experiments" / M["experiment"]
    shutil.copytree(EXPERIMENT, target)
    return target / M["tag"]


def test_the_stages_chain_and_every_saved_step_is_a_point():
    timeline = timeline_of(TAG)
    base_last = M["base_steps"][-1]
    assert timeline.stages == ((0, "base"), (base_last, "sft"))
    assert [(p.stage, p.step, p.x) for p in timeline.points] == [
        *(("base", s, s) for s in M["base_steps"]),
        ("sft", M["step"], base_last + M["step"]),
    ]
    assert timeline.problems == ()
    assert timeline_of(TAG / "sft") == timeline  # a stage folder opens its whole tag


def test_the_curves_are_the_values_the_logs_state():
    timeline = timeline_of(TAG)
    base_last = M["base_steps"][-1]
    for stage, log, offset in (("base", "base_train.log", 0), ("sft", "sft.log", base_last)):
        want = logged_bpb(TAG / log)
        assert len(want) > 3
        got = curve(timeline, "val_bpb", stage)
        assert got.xs == tuple(float(offset + s) for s in want)
        assert got.ys == tuple(want.values())
        assert got.source == str(TAG / log)


def test_a_saved_steps_marker_sits_on_its_curve():
    timeline = timeline_of(TAG)
    logged = logged_bpb(TAG / "base_train.log")
    for point in timeline.series("val_bpb"):
        value = timeline.value_at(point, "val_bpb")
        on_curve = curve(timeline, "val_bpb", point.stage).at(point.x)
        # the meta keeps the full float, the log rounds it to 6 places
        assert value == pytest.approx(on_curve, abs=1e-6)
        if point.stage == "base":
            assert on_curve == logged[point.step]


def test_the_experiments_meta_is_shown():
    meta = json.loads((EXPERIMENT / "meta.json").read_text())
    timeline = timeline_of(TAG)
    about = dict(timeline.about)
    assert about["experiment"] == meta["name"]
    assert about["commit"] == meta["git_commit"] == M["commit"]
    assert about["tree"] == ("clean" if not meta["git_dirty"] else "uncommitted changes")
    assert about["dataset"] == meta["dataset"]
    assert any(M["commit"][:7] in note and meta["name"] in note for note in timeline.notes)
    assert timeline.to_dict()["about"]["commit"] == M["commit"]


def test_a_dirty_tree_names_its_diff(copy):
    meta = json.loads((copy.parent / "meta.json").read_text())
    (copy.parent / "meta.json").write_text(json.dumps({**meta, "git_dirty": True}))
    (copy.parent / "code_diff.patch").write_text("diff --git a/x b/x\n")
    assert dict(timeline_of(copy).about)["tree"] == "uncommitted changes (diff in code_diff.patch)"


def test_a_hostile_meta_json_is_one_line_and_the_rest_is_drawn(copy):
    (copy.parent / "meta.json").write_text(json.dumps({"name": ["x"], "git_dirty": "yes", "dataset": "d"}))
    timeline = timeline_of(copy)
    assert dict(timeline.about) == {"dataset": "d"}
    assert len([p for p in timeline.problems if "meta.json" in p]) == 2
    assert timeline.curves
    (copy.parent / "meta.json").write_text("[1, 2")
    timeline = timeline_of(copy)
    assert timeline.about == () and any("meta.json" in p for p in timeline.problems)


def test_core_and_chatcore_records_become_curves(copy):
    with open(copy / "sft.log", "a", encoding="utf-8") as log:
        log.write("chatcore step=150 chatcore=0.125 chatcore_cat=0.25 ARC-Easy=0.5 GSM8K=0.0\n")
    with open(copy / "base_train.log", "a", encoding="utf-8") as log:
        log.write("core step=60 core=0.0625\n")
    (copy / "chat_eval.log").write_text(
        'prose\nsummary model_tag=d2 source=sft step=150 MMLU=0.3 chatcore=0.2 gpu="A B"\n'
    )
    timeline = timeline_of(copy)
    base_last = M["base_steps"][-1]
    assert curve(timeline, "core", "base").xs == (float(base_last),)
    assert curve(timeline, "ARC-Easy", "sft").ys == (0.5,)
    chat = [c for c in timeline.curves if c.name == "chatcore"]
    assert sorted(c.ys for c in chat) == [(0.125,), (0.2,)]
    assert {c.xs for c in chat} == {(float(base_last + M["step"]),)}
    assert timeline.problems == ()


def test_broken_lines_are_one_problem_line_each_naming_file_and_line(copy):
    log = copy / "base_train.log"
    lines = log.read_text(encoding="utf-8").splitlines()
    hostile = [
        "eval step=61 val_bpb=nan",
        "eval step=62 val_bpb=fast",
        "eval step=63 val_bpb='0.5",
        "eval step=abc val_bpb=0.5",
        "eval step=64 val_bpb",
        "eval step=65 val_bpb=inf eflops=0.0",
        "\x00\xff garbage \x1b[31m",
        "eval step=66 val_bpb=0.5",
    ]
    log.write_text("\n".join([*lines, *hostile]) + "\n", encoding="utf-8")
    problems = [p for p in timeline_of(copy).problems if p.startswith(str(log))]
    assert len(problems) == 6  # 5 shown in full, then one count
    for offset, problem in enumerate(problems[:5], start=1):
        assert problem.startswith(f"{log}:{len(lines) + offset}: ")
    assert problems[-1] == f"{log}: 1 more problem lines skipped"
    got = curve(timeline_of(copy), "val_bpb", "base")
    assert got.xs[-1] == 66.0 and got.ys[-1] == 0.5  # the good line after the bad ones is read
    assert all(math.isfinite(y) for y in got.ys)


def test_a_million_line_log_is_read(copy):
    log = copy / "base_train.log"
    with open(log, "w", encoding="utf-8") as f:
        for block in range(1000):
            f.write(f"step {block:05d}/01000 | loss: 2.0 | dt: 10ms\n" * 999)
            f.write(f"eval step={block} eflops=0.0 val_bpb={1 + block / 1000}\n")
    got = curve(timeline_of(copy), "val_bpb", "base")
    assert len(got.xs) == 1000 and got.ys[-1] == 1.999


def test_a_100_mb_log_is_read_up_to_the_cap_and_says_so(copy):
    log = copy / "base_train.log"
    with open(log, "w", encoding="utf-8") as f:
        f.write("eval step=0 val_bpb=3.0\neval step=10 val_bpb=2.0\n")
        f.truncate(100 << 20)  # sparse: the rest reads as zeros, one endless line
    timeline = timeline_of(copy)
    assert curve(timeline, "val_bpb", "base").ys == (3.0, 2.0)
    lines = [p for p in timeline.problems if p.startswith(str(log))]
    assert any("read the first 64 MB of 100 MB" in p for p in lines)
    assert any("over 64 KB skipped" in p for p in lines)


def test_a_series_longer_than_the_cap_is_cut_with_one_line(copy, monkeypatch):
    monkeypatch.setattr(experiment_logs, "MAX_POINTS", 10)
    log = copy / "base_train.log"
    log.write_text("".join(f"eval step={s} val_bpb=1.0\n" for s in range(25)))
    timeline = timeline_of(copy)
    assert curve(timeline, "val_bpb", "base").xs == tuple(float(s) for s in range(10))
    assert len([p for p in timeline.problems if "more than 10 points" in p]) == 1


def test_a_log_that_is_not_a_file_is_one_line(copy):
    (copy / "sft.log").unlink()
    (copy / "sft.log").mkdir()  # a folder where the log belongs
    timeline = timeline_of(copy)
    assert any(p.startswith(str(copy / "sft.log")) for p in timeline.problems)
    assert curve(timeline, "val_bpb", "base")


def test_log_lines_drop_a_line_cut_by_the_cap(tmp_path):
    path = tmp_path / "x.log"
    path.write_bytes(b"eval step=1 val_bpb=0.25\neval step=2 val_bpb=0.125\n")
    lines = LogLines(path, max_bytes=40)
    assert list(lines) == [(1, "eval step=1 val_bpb=0.25")]
    assert lines.cut and "read the first" in lines.cut_line()
    whole = LogLines(path)
    assert len(list(whole)) == 2 and not whole.cut and whole.cut_line() == ""
    with pytest.raises(FileRefused, match="not a regular file"):
        list(LogLines(Path("/dev/zero")))


def test_a_folder_without_checkpoints_or_experiment_is_not_a_run(tmp_path):
    (tmp_path / "d2" / "base").mkdir(parents=True)
    with pytest.raises(NanoscopeError, match="not a training run"):
        timeline_of(tmp_path / "d2")
