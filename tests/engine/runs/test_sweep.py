"""One sweep over a run's steps for several tasks: each step is opened once for every task and
closed before the next, a step whose answers were all kept is not opened, progress estimates
the time left from the items asked so far, Stop ends it after the item in hand; what flipped
reads the same both ways."""

from __future__ import annotations

import threading
from typing import Any

from support import REPO

from desktop.engine.runs import sweep
from desktop.engine.runs.checked_answers import answers_task, bundled_problems
from desktop.engine.runs.evals import samples_task
from desktop.engine.runs.grading import flipped_examples, what_flipped
from desktop.engine.runs.timeline import Point, timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
PROBLEMS = bundled_problems(3)


class DictKeeper:
    """A Keeper that keeps answers in a dict, as the store does in SQLite."""

    def __init__(self) -> None:
        self.answers: dict[tuple[int, str], list[Any]] = {}

    def kept(self, point: Point, task: str) -> list[Any] | None:
        return self.answers.get((point.step, task))

    def keep(self, point: Point, task: str, results: list[Any]) -> None:
        self.answers[(point.step, task)] = results


def counting_opens(monkeypatch) -> list[tuple[int, bool]]:
    """(step, still open) of every backend the sweep opens."""
    opened: list[list] = []
    real = sweep.open_backend

    def open_and_count(path, options, progress=None):
        assert all(not record[1] for record in opened), "two checkpoints open at once"
        backend = real(path, options, progress)
        record = [options.step, True]
        opened.append(record)
        close = backend.close

        def closing() -> None:
            record[1] = False
            close()

        backend.close = closing
        return backend

    monkeypatch.setattr(sweep, "open_backend", open_and_count)
    return opened  # type: ignore[return-value]


def test_each_step_is_opened_once_for_every_task_and_kept_steps_not_at_all(monkeypatch):
    points = timeline_of(DEMO).points[:2]
    tasks = [samples_task(["The capital of France is"]), answers_task(PROBLEMS)]
    opened = counting_opens(monkeypatch)
    keeper = DictKeeper()
    first = list(sweep.tasks_sweep(points, tasks, keeper=keeper))
    assert [tuple(o) for o in opened] == [(p.step, False) for p in points]
    assert [(r.task, r.result.step) for r in first] == [
        (t.name, p.step) for p in points for t in tasks for _ in t.items
    ]
    assert not any(r.kept for r in first)
    assert sorted(keeper.answers) == sorted((p.step, t.name) for p in points for t in tasks)
    again = list(sweep.tasks_sweep(points, tasks, keeper=keeper))
    assert len(opened) == len(points)  # nothing opened the second time
    assert all(r.kept for r in again) and [r.result for r in again] == [r.result for r in first]


def test_a_step_with_one_task_kept_is_asked_only_the_other(monkeypatch):
    points = timeline_of(DEMO).points[:1]
    tasks = [samples_task(["Hello"]), answers_task(PROBLEMS)]
    keeper = DictKeeper()
    list(sweep.tasks_sweep(points, tasks[:1], keeper=keeper))
    opened = counting_opens(monkeypatch)
    results = list(sweep.tasks_sweep(points, tasks, keeper=keeper))
    assert len(opened) == 1
    assert [(r.task, r.kept) for r in results] == [("samples", True)] + [("answers", False)] * len(PROBLEMS)


def test_progress_estimates_from_the_items_asked_and_leaves_out_kept_ones():
    points = timeline_of(DEMO).points[:2]
    task = answers_task(PROBLEMS)
    keeper = DictKeeper()
    list(sweep.tasks_sweep(points[:1], [task], keeper=keeper))  # the first step is kept
    ticks = iter(range(100))
    seen: list[sweep.SweepProgress] = []
    list(sweep.tasks_sweep(points, [task], keeper=keeper, progress=seen.append, clock=lambda: next(ticks)))
    asked = [p for p in seen if p.done]
    assert [p.total for p in asked] == [len(PROBLEMS)] * len(PROBLEMS)
    assert [p.done for p in asked] == list(range(1, len(PROBLEMS) + 1))
    for p in asked:  # a fake clock: each call one second later
        assert p.seconds_left is not None and p.seconds_left >= 0
    assert asked[-1].seconds_left == 0 and (asked[-1].stage, asked[-1].step) == (
        points[1].stage,
        points[1].step,
    )


def test_stop_ends_the_sweep_after_the_item_in_hand_and_keeps_nothing_half_done():
    points = timeline_of(DEMO).points[:2]
    cancel = threading.Event()
    keeper = DictKeeper()
    results = []
    for r in sweep.tasks_sweep(points, [answers_task(PROBLEMS, cancel)], cancel=cancel, keeper=keeper):
        results.append(r)
        cancel.set()
    assert len(results) == 1 and keeper.answers == {}


def test_flips_read_the_same_both_ways_with_each_example_s_prompt():
    points = timeline_of(DEMO).points
    problems = bundled_problems(8)
    answers = [r.result for r in sweep.tasks_sweep([points[0], points[-1]], [answers_task(problems)])]
    first, last = (points[0].stage, points[0].step), (points[-1].stage, points[-1].step)
    prompts = {p.line: p.question for p in problems}
    forward = flipped_examples(answers, first, last, prompts)
    backward = flipped_examples(answers, last, first, prompts)
    assert {(f.line, f.lost) for f in forward} == {(f.line, not f.lost) for f in backward}
    flips = what_flipped(answers, first, last)
    assert [f.line for f in forward] == [*flips.lost, *flips.gained]
    right = {(a.step, a.line): a.correct for a in answers}
    for f in forward:
        assert f.prompt == prompts[f.line] and (f.earlier, f.later) == (first, last)
        assert right[(first[1], f.line)] == f.lost and right[(last[1], f.line)] != f.lost
