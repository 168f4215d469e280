"""Eval results are kept by the step and its weights' content: asking a step again reads its
answers back (the same ones); another step with the same weights, a copy elsewhere or a changed
file is asked again; a damaged store never stops a sweep."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import pytest
from support import REPO

from desktop.cli import main as cli
from desktop.config import paths
from desktop.engine.backend import LoadOptions
from desktop.engine.runs.checked_answers import bundled_problems
from desktop.engine.runs.timeline import timeline_of
from desktop.store import eval_results
from desktop.store.eval_results import EvalResults, kept_answers

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
PROBLEMS = bundled_problems(4)


def run(store: EvalResults | None, folder: Path = DEMO, step_index: int = -1) -> list[tuple[object, bool]]:
    point = timeline_of(folder).points[step_index]
    return list(kept_answers(store, [point], PROBLEMS, LoadOptions(device="cpu"), threading.Event()))


def test_a_step_asked_again_is_read_back_with_the_same_answers(tmp_path):
    store = EvalResults(tmp_path / "results.sqlite3")
    first = run(store)
    assert [kept for _, kept in first] == [False] * len(PROBLEMS)
    again = run(store)
    assert [kept for _, kept in again] == [True] * len(PROBLEMS)
    assert [r for r, _ in again] == [r for r, _ in first]
    assert [r for r, _ in run(None)] == [r for r, _ in first]  # and it is what the model says


def copy_demo(tmp_path: Path) -> Path:
    """The demo run and its tokenizer copied under ``tmp_path`` (a nanochat base dir)."""
    copy = tmp_path / "chatsft_checkpoints" / "copy"
    shutil.copytree(DEMO, copy)
    shutil.copytree(DEMO.parent.parent / "tokenizer", tmp_path / "tokenizer")
    return copy


def test_a_copy_or_a_changed_file_is_asked_again(tmp_path):
    store = EvalResults(tmp_path / "results.sqlite3")
    run(store)
    copy = copy_demo(tmp_path)
    assert not any(kept for _, kept in run(store, copy))  # another folder: another step
    assert all(kept for _, kept in run(store, copy))
    last = timeline_of(copy).points[-1]
    weights = copy / f"model_{last.step:06d}.pt"
    shutil.copyfile(DEMO / f"model_{timeline_of(DEMO).points[0].step:06d}.pt", weights)  # other weights
    assert not any(kept for _, kept in run(store, copy))


def test_two_steps_with_the_same_weights_each_keep_their_own_answers(tmp_path):
    copy = copy_demo(tmp_path)
    first, second = timeline_of(copy).points[:2]
    shutil.copyfile(copy / f"model_{first.step:06d}.pt", copy / f"model_{second.step:06d}.pt")
    store = EvalResults(tmp_path / "results.sqlite3")

    def sweep() -> list[tuple[object, bool]]:
        options, cancel = LoadOptions(device="cpu"), threading.Event()
        return list(kept_answers(store, [first, second], PROBLEMS, options, cancel))

    asked = sweep()
    labels = [(r.stage, r.step) for r, _ in asked]
    n = len(PROBLEMS)
    assert labels == [(first.stage, first.step)] * n + [(second.stage, second.step)] * n  # each its own
    assert not any(kept for _, kept in asked)
    again = sweep()
    assert [r for r, _ in again] == [r for r, _ in asked] and all(kept for _, kept in again)


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b""])
def test_a_damaged_store_costs_a_log_line_not_the_sweep(tmp_path, caplog, content):
    path = tmp_path / "results.sqlite3"
    path.write_bytes(content)
    with caplog.at_level(logging.INFO, logger="desktop.store.eval_results"):
        results = run(EvalResults(path))
    assert len(results) == len(PROBLEMS) and not any(kept for _, kept in results)


def test_nanoscope_eval_says_which_steps_were_kept(capsys):
    step = timeline_of(DEMO).points[-1].step
    argv = ["eval", str(DEMO), "--task", "answers", "--steps", str(step), "--json"]
    assert cli.main(argv) == 0
    first = capsys.readouterr()
    assert cli.main(argv) == 0
    second = capsys.readouterr()
    assert eval_results.shared_results().path == paths.eval_results_path()  # this test's own home
    assert "kept results" not in first.err and "kept results" in second.err
    assert second.out == first.out


def test_core_answers_are_kept_with_every_loss_and_read_back_alike(tmp_path):
    from support.eval_bundle import make_bundle

    from desktop.engine.runs import core_bundle
    from desktop.engine.runs.sweep import tasks_sweep
    from desktop.store.eval_results import StoreKeeper, core_key

    task = core_bundle.read_tasks(make_bundle(tmp_path))[0][0]
    examples, _ = core_bundle.read_examples(task, lite=2)
    points = timeline_of(DEMO).points[-1:]
    store = EvalResults(tmp_path / "results.sqlite3")

    def sweep() -> tuple[list, StoreKeeper]:
        keeper = StoreKeeper(store, {f"core:{task.label}": core_key(task, examples, 2)})
        one = core_bundle.core_task(task, examples)
        return [(r.result, r.kept) for r in tasks_sweep(points, [one], keeper=keeper)], keeper

    first, _ = sweep()
    again, keeper = sweep()
    assert [kept for _, kept in first] == [False, False] and [kept for _, kept in again] == [True, True]
    assert [r for r, _ in again] == [r for r, _ in first]
    assert keeper.read_back == {(points[0].stage, points[0].step, f"core:{task.label}")}
    other = core_key(task, examples[:1], 1)  # another sample is another key
    assert other.data != core_key(task, examples, 2).data
