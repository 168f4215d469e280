"""A KempnerForge run's TensorBoard scalars as curves: found where KempnerForge's config puts them,
merged across a resumed run's files, and bounded, with one line for each thing left out."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
from support import tfevents as tf
from support.golden import GOLDEN, manifest

from desktop.engine.runs import tensorboard_scalars as tbs
from desktop.engine.runs.tensorboard_scalars import kf_curves

CASE = next((GOLDEN / "kempnerforge").glob("*/golden.json")).parent
LOGGED = manifest(CASE)["tensorboard"]
EVENTS = next((CASE / LOGGED["dir"]).iterdir())


def as_logged(curves) -> dict[str, list[list[float]]]:
    return {c.name: [[x, y] for x, y in zip(c.xs, c.ys, strict=True)] for c in curves}


def make_run(root: Path, toml: str | None = None, run: str = "run", toml_in: str = "") -> Path:
    """A run folder with one complete step (no weights: only its layout is read here), and a
    training TOML in ``root/toml_in`` when given."""
    step = root / run / "step_1"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"")
    if toml is not None:
        (root / toml_in / "train.toml").write_text("[model]\ndim = 8\n" + toml)
    return root / run


def test_the_golden_run_has_one_curve_per_logged_tag():
    curves, problems = kf_curves(CASE / "run")
    assert problems == []
    assert as_logged(curves) == LOGGED["scalars"]
    assert {c.source for c in curves} == {str(EVENTS)}


def test_a_run_without_event_files_has_no_curves(tmp_path):
    assert kf_curves(make_run(tmp_path)) == ([], [])


def test_the_folder_the_toml_names_relative_to_where_training_was_launched(tmp_path):
    # launched from tmp_path with checkpoint.dir = "out/run"; the TOML is kept beside the run
    toml = (
        '[checkpoint]\ndir = "out/run"\n[metrics]\nenable_tensorboard = true\ntensorboard_dir = "logs/tb"\n'
    )
    run = make_run(tmp_path, toml, run="out/run", toml_in="out")
    (tmp_path / "logs" / "tb").mkdir(parents=True)
    shutil.copy(EVENTS, tmp_path / "logs" / "tb")
    (tmp_path / "out" / "tb_logs").mkdir()  # KempnerForge's default: not where this run wrote
    shutil.copy(EVENTS, tmp_path / "out" / "tb_logs" / "events.out.tfevents.9.other.0")
    curves, problems = kf_curves(run)
    assert problems == [] and as_logged(curves) == LOGGED["scalars"]
    assert {c.source for c in curves} == {str(tmp_path / "logs" / "tb" / EVENTS.name)}


def test_an_absolute_folder_in_the_toml(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(EVENTS, elsewhere)
    run = make_run(tmp_path / "launch", f'[metrics]\ntensorboard_dir = "{elsewhere}"\n')
    assert as_logged(kf_curves(run)[0]) == LOGGED["scalars"]


def test_without_a_toml_the_default_folder_beside_or_inside_the_run(tmp_path):
    for where in ("beside", "inside"):
        run = make_run(tmp_path / where)
        folder = run.parent / "tb_logs" if where == "beside" else run / "tb_logs"
        folder.mkdir()
        shutil.copy(EVENTS, folder)
        assert as_logged(kf_curves(run)[0]) == LOGGED["scalars"], where


def test_a_resumed_run_logs_again_from_its_checkpoint_and_the_newer_file_wins(tmp_path):
    run = make_run(tmp_path)
    (tmp_path / "tb_logs").mkdir()
    shutil.copy(EVENTS, tmp_path / "tb_logs")
    started = int(EVENTS.name.split(".")[3])
    resumed = [(step, "train/loss", step / 1000) for step in range(130, 301, 10)]  # from step 120
    later = tmp_path / "tb_logs" / f"events.out.tfevents.{started + 3600}.host.2.0"
    later.write_bytes(tf.event_file(resumed))
    curves, problems = kf_curves(run)
    assert problems == []
    loss = next(c for c in curves if c.name == "train/loss")
    before = [p for p in LOGGED["scalars"]["train/loss"] if p[0] < 130]
    stored = [[s, struct.unpack("<f", struct.pack("<f", v))[0]] for s, _, v in resumed]  # float32
    assert as_logged([loss])["train/loss"] == before + stored
    assert loss.source == str(tmp_path / "tb_logs")
    grad = next(c for c in curves if c.name == "train/grad_norm")
    assert grad.source == str(tmp_path / "tb_logs" / EVENTS.name)


def test_a_pipe_among_the_files_is_one_line_and_the_rest_is_read(tmp_path):
    run = make_run(tmp_path)
    (tmp_path / "tb_logs").mkdir()
    shutil.copy(EVENTS, tmp_path / "tb_logs")
    os.mkfifo(tmp_path / "tb_logs" / "events.out.tfevents.1.pipe.0")
    curves, problems = kf_curves(run)
    assert as_logged(curves) == LOGGED["scalars"]
    assert (
        len(problems) == 1
        and "events.out.tfevents.1.pipe.0: not a regular file (a named pipe)" in problems[0]
    )


def test_too_many_files_reads_the_newest(tmp_path):
    run = make_run(tmp_path)
    folder = tmp_path / "tb_logs"
    folder.mkdir()
    for i in range(tbs.MAX_FILES + 6):
        (folder / f"events.out.tfevents.{1000 + i}.h.1.0").write_bytes(tf.event_file([(i, "loss", float(i))]))
    curves, problems = kf_curves(run)
    assert problems == [f"{folder}: {tbs.MAX_FILES + 6} event files; the newest {tbs.MAX_FILES} are read"]
    assert curves[0].xs == tuple(float(i) for i in range(6, tbs.MAX_FILES + 6))


def test_the_run_budget_leaves_later_files_unread_with_a_line(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    folder = tmp_path / "tb_logs"
    folder.mkdir()
    for i in range(3):
        (folder / f"events.out.tfevents.{1000 + i}.h.1.0").write_bytes(
            tf.event_file([(s, "loss", 1.0) for s in range(i * 100, i * 100 + 100)])
        )
    size = (folder / "events.out.tfevents.1000.h.1.0").stat().st_size
    monkeypatch.setattr(tbs, "MAX_RUN_BYTES", size)
    curves, problems = kf_curves(run)
    assert curves[0].xs == tuple(float(s) for s in range(100))
    assert len(problems) == 2 and all("not read" in p for p in problems)


def test_long_curves_are_sampled_and_many_tags_capped_with_a_line(tmp_path):
    curves, problems = kf_curves(CASE / "run", max_points=10, max_tags=3)
    assert [c.name for c in curves] == ["train/loss", "train/grad_norm", "train/lr"]
    assert all(len(c.xs) == 10 and c.xs[0] == 1.0 and c.xs[-1] == 240.0 for c in curves)
    logged = len(LOGGED["scalars"]["train/loss"])
    assert problems[0].startswith(f"{EVENTS.parent}: more than 3 tags; ")
    assert problems[1:] == [f"{EVENTS}: {c.name}: {logged} values, drawn as 10 evenly spaced" for c in curves]


@pytest.mark.parametrize("name", ["events.out.tfevents.x", "events.out.tfevents." + "9" * 200])
def test_odd_file_names_sort_and_read(tmp_path, name):
    run = make_run(tmp_path)
    (tmp_path / "tb_logs").mkdir()
    (tmp_path / "tb_logs" / name).write_bytes(tf.event_file([(1, "loss", 0.5)]))
    assert as_logged(kf_curves(run)[0]) == {"loss": [[1.0, 0.5]]}
