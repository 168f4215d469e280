"""A run's report card states what the run's files state: every saved step with its numbers,
the config the first step was trained with and what changed, what each step said, and which
model card fields a person must still fill in; strings from files cannot break its tables."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

from support import REPO
from support.golden import GOLDEN

from desktop.engine.runs.evals import Sample
from desktop.engine.runs.report import (
    RunReport,
    cell,
    report_markdown,
    run_config,
    step_hashes,
    weights_files,
)
from desktop.engine.runs.timeline import timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The body rows of the table under ``heading``, split into cells."""
    lines = markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [line for line in lines if line.startswith("| ")][1:]
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]


def test_the_demo_card_lists_every_step_with_its_numbers_and_config():
    timeline = timeline_of(DEMO)
    meta = json.loads((DEMO / f"meta_{timeline.points[0].step:06d}.json").read_text())
    config = run_config(timeline)
    assert config["model_config.n_layer"] == meta["model_config"]["n_layer"]
    assert config["user_config.lr"] == meta["user_config"]["lr"]
    hashes = {(p.stage, p.step): f"{p.step:064x}" for p in timeline.points}
    card = report_markdown(
        RunReport(timeline, plots=[("val_bpb", "val_bpb.png")], hashes=hashes, config=config)
    )
    rows = table_rows(card, "Saved steps")
    assert [r[0] for r in rows] == [f"sft {p.step:,}" for p in timeline.points]
    for row, point in zip(rows, timeline.points, strict=True):
        assert float(row[2]) == float(f"{point.metrics['val_bpb']:.6g}")
        assert row[-1] == f"`{hashes[(point.stage, point.step)]}`"
    assert "![val_bpb](val_bpb.png)" in card
    assert dict(map(tuple, table_rows(card, "Config")))["model_config.n_layer"] == str(
        meta["model_config"]["n_layer"]
    )
    assert "- [ ] **license**" in card and "- [x] **training hyperparameters**" in card


def test_a_kempnerforge_card_reads_its_training_toml():
    run = next((GOLDEN / "kempnerforge").glob("*/run"))
    config = run_config(timeline_of(run))
    assert config["checkpoint.interval"] == 120 and "model.dim" in config


def test_samples_are_a_prompts_by_steps_table():
    timeline = timeline_of(DEMO)
    samples = [
        Sample(p.stage, p.step, q, (), f" {q[:3]}@{p.step}")
        for p in timeline.points[:2]
        for q in ("a b", "c d")
    ]
    rows = table_rows(report_markdown(RunReport(timeline, samples=samples)), "What each step says")
    assert rows == [[q, *(f"{q[:3]}@{p.step}" for p in timeline.points[:2])] for q in ("a b", "c d")]


def test_strings_from_files_cannot_break_the_tables(tmp_path):
    run = tmp_path / "chatsft_checkpoints" / "demo"
    shutil.copytree(DEMO, run)
    first = sorted(run.glob("meta_*.json"))[0]
    meta = json.loads(first.read_text())
    meta["user_config"]["trainer"] = "a | b\n| c <script>x</script> " + "y" * 5000
    first.write_text(json.dumps(meta))
    timeline = timeline_of(run)
    card = report_markdown(RunReport(timeline, config=run_config(timeline)))
    trainer = dict(map(tuple, table_rows(card, "Config")))["user_config.trainer"]
    assert "<script>" not in card and "\\|" in trainer and len(trainer) < 400
    assert all(
        line.count(" | ") in (0, 1) for line in card.split("## Config\n", 1)[1].split("\n## ")[0].splitlines()
    )


def test_a_cell_is_one_bounded_line():
    assert cell("x\n| y") == "x \\| y" and len(cell("z" * 10_000)) == 200
    assert cell(Path("<b>")) == "&lt;b&gt;"


def test_each_step_is_named_by_the_sha256_of_its_weights_files():
    for run in (DEMO, next((GOLDEN / "kempnerforge").glob("*/run"))):
        timeline = timeline_of(run)
        hashes = step_hashes(timeline)
        for point in timeline.points:
            files = weights_files(point)
            assert files and all(f.is_relative_to(run) for f in files)
            assert (
                hashes[(point.stage, point.step)]
                == hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
            )


def test_hashing_stops_when_asked_and_skips_what_it_cannot_read(tmp_path):
    run = tmp_path / "chatsft_checkpoints" / "demo"
    shutil.copytree(DEMO, run)
    timeline = timeline_of(run)
    stopped = threading.Event()
    stopped.set()
    assert step_hashes(timeline, stopped) == {}
    first = timeline.points[0]
    weights = weights_files(first)[0]
    weights.unlink()
    os.mkfifo(weights)  # a pipe where the weights were: never opened for reading
    assert set(step_hashes(timeline)) == {(p.stage, p.step) for p in timeline.points[1:]}
