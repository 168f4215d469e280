"""Jobs in the real window: a lookup the user has already moved on from shows nothing stale."""

from __future__ import annotations

import pytest
from support.golden import GOLDEN
from support.window import start_with_base

from desktop.engine.runs.timeline import timeline_of
from desktop.qt.jobs.runner import Job

pytestmark = pytest.mark.gui
WAIT = 60000


def flush(qtbot) -> None:
    """Everything jobs have posted so far is delivered (the runner delivers in order)."""
    seen: list[str] = []
    Job("flush").start(lambda _run: "flushed", done=seen.append)
    qtbot.waitUntil(lambda: seen == ["flushed"], timeout=WAIT)


def test_a_run_chosen_and_at_once_replaced_never_shows_its_timeline(
    qtbot,
    windows,
    loop,
    monkeypatch,
):
    win = start_with_base(qtbot, windows, monkeypatch, GOLDEN / "nanochat" / "E7")
    view = win.run_page.run_view
    win.tabs.setCurrentWidget(view)
    qtbot.waitUntil(lambda: view.runs.count() >= 2 and view.timeline is not None, timeout=WAIT)
    flush(qtbot)
    kept = view.runs.currentData()
    other = next(view.runs.itemData(i) for i in range(view.runs.count()) if view.runs.itemData(i) != kept)
    shown: list = []
    win.background.timeline_ready.connect(shown.append)
    # The user picks another run, then goes straight back: only the last choice is drawn.
    view.choose_run(other)
    with qtbot.waitSignal(win.background.timeline_ready, timeout=WAIT):
        view.choose_run(kept)
    flush(qtbot)
    want = [(p.stage, p.step, p.path) for p in timeline_of(kept).points]
    assert [[(p.stage, p.step, p.path) for p in t.points] for t in shown] == [want]
    assert [(p.stage, p.step, p.path) for p in view.timeline.points] == want
