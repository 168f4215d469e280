"""A run read again and again while it trains (RunReader): the golden runs' own logs and event
files grown in a copy, a piece at a time, and every read the same as a fresh read of the run then,
while each read reads only what the files gained."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from support.golden import EXPERIMENT_CASES, GOLDEN, manifest

from desktop.engine.runs import budget as run_budget
from desktop.engine.runs.budget import RunBudget
from desktop.engine.runs.experiment_logs import read_series
from desktop.engine.runs.timeline import RunReader, Timeline, timeline_of

CASE = EXPERIMENT_CASES[0]
M = manifest(CASE)
EXPERIMENT = CASE / "experiments" / M["experiment"]
TAG = EXPERIMENT / M["tag"]
KF = next((GOLDEN / "kempnerforge").glob("*/golden.json")).parent
EVENTS = next((KF / "tb_logs").iterdir())


@pytest.fixture
def tag(tmp_path) -> Path:
    """The golden experiment copied, its stage logs emptied: the run is about to log."""
    target = tmp_path / "experiments" / M["experiment"]
    shutil.copytree(EXPERIMENT, target)
    for log in ("base_train.log", "sft.log"):
        (target / M["tag"] / log).write_bytes(b"")
    return target / M["tag"]


@pytest.fixture
def kf_run(tmp_path) -> Path:
    """The golden KempnerForge run copied, its event file emptied."""
    shutil.copytree(KF, tmp_path / "kf")
    (tmp_path / "kf" / "tb_logs" / EVENTS.name).write_bytes(b"")
    return tmp_path / "kf" / "run"


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def pieces(data: bytes, size: int) -> list[bytes]:
    """``data`` in pieces of ``size`` bytes: most end inside a line or a frame."""
    return [data[i : i + size] for i in range(0, len(data), size)]


def frames(data: bytes) -> list[bytes]:
    """The TFRecord frames of a well-formed event file."""
    out, pos = [], 0
    while pos < len(data):
        end = pos + 16 + struct.unpack_from("<Q", data, pos)[0]
        out.append(data[pos:end])
        pos = end
    return out


def drawn(timeline: Timeline) -> list[tuple]:
    """What a plot draws of a timeline, wherever its files are."""
    return [(c.name, c.stage, c.xs, c.ys) for c in timeline.curves] + [
        (p.stage, p.step, p.x, p.metrics) for p in timeline.points
    ]


def test_stage_logs_grown_a_piece_at_a_time_read_as_a_fresh_read_at_every_read(tag):
    reader = RunReader(tag)
    for log in ("base_train.log", "sft.log"):
        for piece in pieces((TAG / log).read_bytes(), 97):
            append(tag / log, piece)
            assert reader.read() == timeline_of(tag)
    timeline = reader.read()
    assert drawn(timeline) == drawn(timeline_of(TAG)) and timeline.problems == ()
    # each byte was read once, and the lines cut by a piece's end again when they were completed
    size = sum((TAG / log).stat().st_size for log in ("base_train.log", "sft.log"))
    assert size < reader.bytes_read < 2 * size


def test_a_line_still_being_written_is_held_back_not_said(tag):
    for log in ("base_train.log", "sft.log"):
        shutil.copy(TAG / log, tag / log)
    reader = RunReader(tag)
    before = reader.read()
    append(tag / "base_train.log", b"eval step=61 eflops=0.0 val_bp")
    held = reader.read()
    assert held == before == timeline_of(tag) and held.problems == ()
    append(tag / "base_train.log", b"b=0.75\n")
    grown = reader.read()
    assert grown == timeline_of(tag) and grown.problems == ()
    bpb = next(c for c in grown.curves if c.name == "val_bpb" and c.stage == "base")
    assert (bpb.xs[-1], bpb.ys[-1]) == (61.0, 0.75)


def test_one_record_appended_to_a_long_log_is_all_the_next_read_reads(tag):
    golden = (TAG / "base_train.log").read_bytes().splitlines(keepends=True)
    log = tag / "base_train.log"
    log.write_bytes(b"".join(golden[i % len(golden)] for i in range(50_000)))
    reader = RunReader(tag)
    reader.read()
    assert reader.bytes_read == log.stat().st_size
    record = b"eval step=61 eflops=0.0 val_bpb=0.75\n"
    append(log, record)
    before = reader.bytes_read
    timeline = reader.read()
    assert reader.bytes_read - before == len(record)
    assert timeline == timeline_of(tag)
    before = reader.bytes_read
    assert reader.read() == timeline and reader.bytes_read == before  # nothing new: nothing read


def test_a_log_cut_short_or_replaced_is_read_again_from_the_start(tag):
    golden = (TAG / "base_train.log").read_bytes()
    log = tag / "base_train.log"
    log.write_bytes(golden)
    reader = RunReader(tag)
    reader.read()
    log.write_bytes(golden[: len(golden) // 3])  # the same file, cut short: a stage run again
    assert reader.read() == timeline_of(tag)
    other = tag / "base_train.log.new"
    half = golden.splitlines(keepends=True)[:40]
    other.write_bytes(b"".join(half) + b"eval step=5 val_bpb=9.5\n")
    os.replace(other, log)  # another file, longer than what was read
    timeline = reader.read()
    assert timeline == timeline_of(tag)
    bpb = next(c for c in timeline.curves if c.name == "val_bpb" and c.stage == "base")
    assert bpb.at(5) == 9.5


def test_a_problem_is_said_once_however_often_the_run_is_read(tag):
    append(tag / "base_train.log", (TAG / "base_train.log").read_bytes())
    reader = RunReader(tag)
    reader.read()
    append(tag / "base_train.log", b"eval step=abc val_bpb=0.5\n")
    for record in (b"", b"eval step=62 val_bpb=0.5\n", b"eval step=63 val_bpb=0.25\n"):
        append(tag / "base_train.log", record)
        timeline = reader.read()
        assert timeline == timeline_of(tag)
        assert len([p for p in timeline.problems if "step" in p and "abc" in p]) == 1


def test_a_meta_is_parsed_once_until_it_is_rewritten(tag):
    reader = RunReader(tag)
    reader.read()
    parsed = reader.metas.parsed
    assert parsed == len(M["base_steps"]) + 1 + 1  # every step's meta and the experiment's meta.json
    assert reader.read() == timeline_of(tag) and reader.metas.parsed == parsed
    meta = tag / "base" / f"meta_{M['base_steps'][-1]:06d}.json"
    data = json.loads(meta.read_text())
    data["val_bpb"] = 0.5
    meta.write_text(json.dumps(data))
    timeline = reader.read()
    assert reader.metas.parsed == parsed + 1 and timeline == timeline_of(tag)
    assert timeline.points[len(M["base_steps"]) - 1].metrics["val_bpb"] == 0.5


def test_the_run_budget_bounds_every_read_as_it_bounds_one(tag, monkeypatch):
    monkeypatch.setattr(run_budget, "MAX_VALUES", 60)
    reader = RunReader(tag)
    for piece in pieces((TAG / "base_train.log").read_bytes(), 211):
        append(tag / "base_train.log", piece)
        assert reader.read() == timeline_of(tag)
    append(tag / "sft.log", (TAG / "sft.log").read_bytes())
    assert reader.read() == timeline_of(tag)
    # the run's values ran out, and an earlier stage's log gains a line after a later one's was read
    append(tag / "base_train.log", b"eval step=61 val_bpb=0.75\n")
    timeline = reader.read()
    assert timeline == timeline_of(tag)
    assert len([p for p in timeline.problems if "values read" in p]) == 1


def test_an_earlier_log_growing_after_a_later_one_spent_the_budget_is_read_again(tag, monkeypatch):
    base, sft = tag / "base_train.log", tag / "sft.log"
    shutil.copy(TAG / "base_train.log", base)
    spent = RunBudget(tag)
    read_series(base, "base", spent)
    monkeypatch.setattr(run_budget, "MAX_VALUES", spent.values + 6)  # sft.log's third record is past it
    reader = RunReader(tag)
    reader.read()
    append(sft, (TAG / "sft.log").read_bytes())
    assert any("values read" in p for p in reader.read().problems)
    # read in order, base's new record comes before sft's: what sft's records spent is given back
    append(base, b"eval step=61 val_bpb=0.75\n")
    before = reader.bytes_read
    timeline = reader.read()
    assert timeline == timeline_of(tag)
    assert reader.bytes_read - before >= base.stat().st_size  # both read again from the start, once
    before = reader.bytes_read
    append(sft, b"eval step=175 val_bpb=0.5\n")  # the last log grows: read on
    assert reader.read() == timeline_of(tag) and reader.bytes_read - before < 100


def test_an_event_file_grown_a_piece_at_a_time_reads_as_a_fresh_read(kf_run):
    reader = RunReader(kf_run)
    events = kf_run.parent / "tb_logs" / EVENTS.name
    for piece in pieces(EVENTS.read_bytes(), 101):
        append(events, piece)
        timeline = reader.read()
        assert timeline == timeline_of(kf_run)
        assert not any("cut off" in p for p in timeline.problems)  # a frame half written is not said
    assert drawn(reader.read()) == drawn(timeline_of(KF / "run"))
    assert reader.bytes_read < 2 * EVENTS.stat().st_size


def test_one_frame_appended_is_all_the_next_read_reads(kf_run):
    events = kf_run.parent / "tb_logs" / EVENTS.name
    shutil.copy(EVENTS, events)
    reader = RunReader(kf_run)
    reader.read()
    assert reader.bytes_read == events.stat().st_size
    last = frames(EVENTS.read_bytes())[-1]  # the newest step logged again: it replaces itself
    append(events, last)
    before = reader.bytes_read
    assert reader.read() == timeline_of(kf_run)
    assert reader.bytes_read - before == len(last)


def test_a_resumed_runs_new_event_file_is_read_and_an_older_one_growing_is_read_again(kf_run):
    data = frames(EVENTS.read_bytes())
    events = kf_run.parent / "tb_logs" / EVENTS.name
    events.write_bytes(b"".join(data[: len(data) // 2]))
    reader = RunReader(kf_run)
    reader.read()
    resumed = kf_run.parent / "tb_logs" / "events.out.tfevents.1900000000.vm.1.0"
    resumed.write_bytes(data[0])
    assert reader.read() == timeline_of(kf_run)
    append(resumed, b"".join(data[len(data) // 2 :]))
    assert reader.read() == timeline_of(kf_run)
    append(events, b"".join(data[len(data) // 2 :]))  # the older file, after the newer was read
    timeline = reader.read()
    assert timeline == timeline_of(kf_run) and timeline.problems == ()
