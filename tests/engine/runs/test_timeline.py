"""A run's timeline is read from its metas alone: the demo's four steps with their numbers, the
golden nanochat run's base and SFT stages chained on one axis, the golden KempnerForge run's
tokens; numbers that are not numbers are left out with one line naming the file."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from support import REPO
from support.golden import GOLDEN

from desktop.cli import main as cli
from desktop.engine.errors import NanoscopeError
from desktop.engine.runs.timeline import BPB_FIX, Curve, timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"


def metas(folder: Path) -> dict[int, dict]:
    return {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in sorted(folder.glob("meta_*.json"))}


def test_the_demo_run_shows_every_step_with_its_numbers():
    timeline = timeline_of(DEMO)
    written = metas(DEMO)
    assert [p.step for p in timeline.points] == sorted(written)
    for point in timeline.points:
        assert point.metrics == {k: written[point.step][k] for k in ("val_bpb", "val_loss")}
        assert point.file_bytes == (DEMO / f"model_{point.step:06d}.pt").stat().st_size
        assert point.path == DEMO and point.stage == "sft"
    assert timeline.metric_names() == ["val_bpb", "val_loss"] and not timeline.problems


def test_stages_of_one_tag_chain_on_one_axis():
    base = GOLDEN / "nanochat" / "E7" / "base_checkpoints" / "d2"
    for start in (base, GOLDEN / "nanochat" / "E7" / "chatsft_checkpoints" / "d2"):
        timeline = timeline_of(start)  # from either stage, the same run
        assert [(p.stage, p.step) for p in timeline.points] == [("base", 10), ("sft", 20)]
        assert timeline.stages == ((0, "base"), (10, "sft"))
        assert [p.x for p in timeline.points] == [10, 30]


def test_a_kempnerforge_run_shows_its_steps_and_tokens():
    run = next((GOLDEN / "kempnerforge").glob("*/run"))
    timeline = timeline_of(run / "step_120")  # a step folder names its run
    stated = {
        int(d.name.split("_")[1]): json.loads((d / "metadata.json").read_text()) for d in run.glob("step_*")
    }
    assert [(p.step, p.tokens) for p in timeline.points] == [
        (step, stated[step]["tokens_seen"]) for step in sorted(stated)
    ]


def test_numbers_that_are_not_numbers_are_left_out_in_one_line_each(tmp_path):
    run = tmp_path / "chatsft_checkpoints" / "demo"
    shutil.copytree(DEMO, run)
    meta = json.loads((run / "meta_001000.json").read_text())
    meta.update(val_bpb="0.5", val_loss=None, mmlu_acc=[1])
    (run / "meta_001000.json").write_text(json.dumps(meta))
    (run / "meta_001700.json").write_text('{"step": 1700, "val_bpb": NaN}')
    timeline = timeline_of(run)
    assert [p.step for p in timeline.points] == [300, 1000, 2400]  # the unreadable meta's step is left out
    assert timeline.points[1].metrics == {}
    assert len(timeline.problems) == 3
    assert all(line.count("\n") == 0 and str(run) in line for line in timeline.problems)
    assert any("meta_001700.json" in line and "NaN" in line for line in timeline.problems)


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    with pytest.raises(NanoscopeError, match="not a training run"):
        timeline_of(tmp_path)


def test_nanoscope_timeline_prints_the_run(capsys):
    assert cli.main(["timeline", str(DEMO), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [p["step"] for p in shown["points"]] == sorted(metas(DEMO))
    assert cli.main(["timeline", str(DEMO)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "demo: 4 saved steps" and "val_bpb" in table[1] and len(table) == 6


def test_a_run_saved_across_the_bpb_fix_says_so(tmp_path):
    run = tmp_path / "chatsft_checkpoints" / "demo"
    shutil.copytree(DEMO, run)
    before, after = BPB_FIX - 86400, BPB_FIX + 86400
    metas_written = sorted(run.glob("meta_*.json"))
    for meta in metas_written:
        os.utime(meta, (after, after))
    assert timeline_of(run).notes == ()  # every step after the fix: nothing to say
    os.utime(metas_written[0], (before, before))
    notes = timeline_of(run).notes
    assert len(notes) == 1 and "2026-07-03" in notes[0] and "\n" not in notes[0]


def test_a_logged_curve_joins_the_steps_values_and_carries_their_markers():
    demo = timeline_of(DEMO)
    first, last = demo.points[0], demo.points[-1]
    logged = Curve("train_loss", "sft", (0.0, float(first.x), float(last.x) - 1), (9.0, 5.0, 1.0), "log")
    timeline = replace(demo, curves=(logged,))
    assert timeline.metric_names() == ["val_bpb", "val_loss", "train_loss"]
    assert timeline.line("train_loss") == list(zip(logged.xs, logged.ys, strict=True))
    # a step without its own value sits where the log last stood at or before it
    assert timeline.value_at(first, "train_loss") == 5.0
    assert timeline.value_at(last, "train_loss") == 1.0
    assert timeline.value_at(first, "val_bpb") == first.metrics["val_bpb"]
    # a step's own value wins over a logged one on the same x
    both = replace(demo, curves=(Curve("val_bpb", "sft", (float(first.x),), (123.0,), "log"),))
    assert dict(both.line("val_bpb"))[float(first.x)] == first.metrics["val_bpb"]
    assert json.loads(json.dumps(timeline.to_dict()))["curves"][0]["name"] == "train_loss"


def test_a_kempnerforge_run_draws_what_its_tensorboard_logger_wrote():
    run = next((GOLDEN / "kempnerforge").glob("*/run"))
    logged = json.loads((run.parent / "golden.json").read_text())["tensorboard"]["scalars"]
    timeline = timeline_of(run)
    assert set(logged) <= set(timeline.metric_names()) and not timeline.problems
    for tag, pairs in logged.items():
        assert timeline.line(tag) == [(float(step), value) for step, value in pairs]
    # each saved step's marker sits on the loss its logger wrote last at or before it
    loss = dict(logged["train/loss"])
    for point in timeline.points:
        assert timeline.value_at(point, "train/loss") == loss[max(s for s in loss if s <= point.step)]
