"""The one loop every evaluation runs over a run's steps (Qt-free): open a step, ask it each item,
close it, then the next, so one checkpoint is in memory at a time; progress after each item, and
Stop after the item in hand."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from desktop.engine.backend import Backend, LoadOptions
from desktop.engine.registry import open_backend
from desktop.engine.runs.timeline import Point

Item = TypeVar("Item")
Result = TypeVar("Result")


def step_sweep(
    points: Sequence[Point],
    items: Sequence[Item],
    ask: Callable[[Backend, Point, Item], Result | None],
    *,
    options: LoadOptions | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[Result]:
    """``ask(backend, point, item)`` for each step and item, step after step; an answer of None
    (the item was stopped half way) ends the sweep without a result for it."""
    cancel = cancel or threading.Event()
    total, done = len(points) * len(items), 0
    for point in points:
        if cancel.is_set():
            return
        backend = open_backend(Path(point.path), replace(options or LoadOptions(), step=point.step))
        try:
            for item in items:
                result = ask(backend, point, item)
                if result is None:
                    return
                yield result
                done += 1
                if progress is not None:
                    progress(done, total)
                if cancel.is_set():
                    return
        finally:
            backend.close()
