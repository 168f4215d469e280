"""The one loop every evaluation runs over a run's steps (Qt-free).

For each step it opens the checkpoint once, asks it every item of every chosen task, and closes
it before the next step opens, so one checkpoint is in memory at a time and the loaded model is
reused across tasks. A :class:`Keeper` (the app's results store; the engine does not know it)
may hand back a step's answers to a task from before: that task is not asked again, and a step
whose every task was kept is not even opened. Progress comes after each item with a time
estimate (seconds per item asked so far × items left to ask); Stop takes effect after the item
in hand.

Typical use (the CLI and the Run tab)::

    tasks = [EvalTask("mc", questions, mc_asker()), EvalTask("bpb", [text], bpb_asker(cancel))]
    for r in tasks_sweep(points, tasks, cancel=cancel, progress=show, keeper=store_keeper):
        table.add(r.task, r.result, from_store=r.kept)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from desktop.engine.backend import Backend, LoadOptions
from desktop.engine.registry import open_backend
from desktop.engine.runs.timeline import Point

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(frozen=True)
class EvalTask:
    """One task of a sweep: ``name`` (how results are told apart and kept), its items, and
    ``ask(backend, point, item)``, which answers one item under a loaded model (None: it was
    stopped half way, and the sweep ends)."""

    name: str
    items: Sequence[Any]
    ask: Callable[[Backend, Point, Any], Any | None]


@dataclass(frozen=True)
class TaskResult:
    task: str  # the EvalTask's name
    result: Any  # what its ask returned (or the kept copy of it)
    kept: bool  # read back from the Keeper, not computed now


@dataclass(frozen=True)
class SweepProgress:
    done: int  # items asked so far
    total: int  # items to ask in the sweep (those read back from a Keeper cost nothing)
    seconds_left: float | None  # None until an item has been asked
    stage: str  # the step in hand
    step: int


class Keeper(Protocol):
    """Where a sweep's answers are kept between runs (the app's store implements it)."""

    def kept(self, point: Point, task: str) -> list[Any] | None:
        """The step's answers to ``task`` from before, or None."""
        ...

    def keep(self, point: Point, task: str, results: list[Any]) -> None:
        """Every answer of the step to ``task``, after the task ran to its end."""
        ...


def tasks_sweep(
    points: Sequence[Point],
    tasks: Sequence[EvalTask],
    *,
    options: LoadOptions | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[SweepProgress], None] | None = None,
    keeper: Keeper | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[TaskResult]:
    """Every task's answers, step after step (in ``points`` order, tasks in ``tasks`` order)."""
    cancel = cancel or threading.Event()
    total = len(points) * sum(len(t.items) for t in tasks)
    done = 0
    started = clock()

    def report(point: Point) -> None:
        if progress is None:
            return
        left = (clock() - started) / done * (total - done) if done else None
        progress(SweepProgress(done, total, left, point.stage, point.step))

    for point in points:
        if cancel.is_set():
            return
        missing: list[EvalTask] = []
        for task in tasks:
            kept = keeper.kept(point, task.name) if keeper is not None else None
            if kept is None:
                missing.append(task)
                continue
            yield from (TaskResult(task.name, r, True) for r in kept)
            total -= len(task.items)
            report(point)
        if not missing:
            continue
        backend = open_backend(Path(point.path), replace(options or LoadOptions(), step=point.step))
        try:
            for task in missing:
                fresh = []
                for item in task.items:
                    if cancel.is_set():
                        return
                    result = task.ask(backend, point, item)
                    if result is None:
                        return
                    fresh.append(result)
                    yield TaskResult(task.name, result, False)
                    done += 1
                    report(point)
                if keeper is not None:
                    keeper.keep(point, task.name, fresh)
        finally:
            backend.close()


def step_sweep(
    points: Sequence[Point],
    items: Sequence[Item],
    ask: Callable[[Backend, Point, Item], Result | None],
    *,
    options: LoadOptions | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[Result]:
    """One task's answers (``ask(backend, point, item)`` for each step and item), with
    ``progress(done, total)``: :func:`tasks_sweep` for a single task and no store."""

    def count(p: SweepProgress) -> None:
        if progress is not None:
            progress(p.done, p.total)

    task = EvalTask("", items, ask)
    for r in tasks_sweep(points, [task], options=options, cancel=cancel, progress=count):
        yield r.result
