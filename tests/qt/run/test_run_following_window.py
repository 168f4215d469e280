"""Evaluations that follow a run as it trains, through the real window: "Evaluate new steps as
they land" on the Run tab evaluates each step a real training run saves while the window is open
(nanochat's own base_train, tests/upstream/, run as a subprocess by support/live_training.py),
one row per new step in the Evaluations table, what flipped between the newest step and the one
before; it waits while the user chats (a reply holding background work), unless "even while I
chat" is checked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog
from support.checkpoint_factory import write_checkpoint
from support.live_training import (
    kf_checkpoints,
    nanochat_checkpoints,
    start_kf_training,
    start_nanochat_training,
)
from support.window import start_with_base

from desktop.engine.foreground import hold_background
from desktop.engine.runs.bits_per_byte import bpb_sweep
from desktop.engine.runs.checked_answers import answer_sweep, bundled_problems
from desktop.engine.runs.grading import accuracy, what_flipped
from desktop.qt.app.main_window import MainWindow
from desktop.qt.run.view import RunView
from desktop.session.run import Evaluation, Flips

pytestmark = pytest.mark.gui
WAIT = 60000
TASK = "arithmetic and spelling"


def show_run(qtbot, win: MainWindow, folder: Path) -> RunView:
    view = win.run_page.run_view
    win.tabs.setCurrentWidget(win.run_page)
    view.choose_run(folder)
    qtbot.waitUntil(lambda: view.timeline is not None and bool(view.timeline.points), timeout=WAIT)
    return view


def rows(view: RunView) -> list[str]:
    table = view.evals.table
    return [table.verticalHeaderItem(r).text() for r in range(table.rowCount())]


def follow(qtbot, view: RunView) -> None:
    """The user checks "Evaluate new steps as they land"."""
    qtbot.mouseClick(view.follow_box, Qt.MouseButton.LeftButton)
    assert view.follow_box.isChecked() and view.pause_btn.isEnabled()


@pytest.fixture
def nanochat_run(tmp_path) -> Iterator:
    run = start_nanochat_training(tmp_path / "base", steps=(10, 20, 30), hold=True)
    yield run
    run.stop()


@pytest.mark.slow
def test_an_evaluation_set_to_follow_gives_one_row_per_step_a_real_run_saves(
    qtbot, windows, loop, monkeypatch, nanochat_run
):
    started = time.monotonic()
    run, base = nanochat_run, nanochat_run.folder
    folder = nanochat_checkpoints(base)
    run.allow(10)
    run.wait_saved(10)
    win = start_with_base(qtbot, windows, monkeypatch, base, fake=False)
    view = show_run(qtbot, win, folder)
    with qtbot.waitSignal(win.run_page.graded_sweep.finished, timeout=WAIT):
        view.evaluate("answers", None)
    assert rows(view) == ["base 10"]
    follow(qtbot, view)
    assert view.session.follow.evaluation == Evaluation("answers")
    assert f"following {TASK}: new steps are evaluated as they land" in view.status.text()
    said: list[str] = []
    win.run_page.graded_sweep.progress.connect(lambda *_: said.append(view.status.text()))

    run.allow(20)
    run.allow(30)
    qtbot.waitUntil(lambda: rows(view) == ["base 10", "base 20", "base 30"], timeout=WAIT)
    qtbot.waitUntil(lambda: "to base 30" in view.evals.flips_title.text(), timeout=WAIT)
    qtbot.waitUntil(lambda: view.session.follow.in_hand is None, timeout=WAIT)
    run.finish()
    assert any(s.startswith("Evaluating step 20 as it landed") for s in said)
    assert any(s.startswith("Evaluating step 30 as it landed") for s in said)

    # The rows are what the engine says those steps answer, asked directly; the flips are between
    # the newest step and the one before; the curve has a point per step.
    points = view.timeline.points
    checked = list(answer_sweep(points, bundled_problems()))
    assert view.session.scores[TASK] == accuracy(checked)
    flips = what_flipped(checked, ("base", 20), ("base", 30))
    assert view.session.flips == Flips(("base", 20), ("base", 30), tuple(flips.lost), tuple(flips.gained))
    assert [x for x, _ in view.timeline.line(TASK)] == [10.0, 20.0, 30.0]
    assert view.eval_btn.isEnabled() and view.sample_btn.isEnabled()
    assert not (win.banner.level == "error" and win.banner.isVisible())
    print(f"following a live run: {time.monotonic() - started:.1f} s")


def land(base: Path, step: int) -> None:
    write_checkpoint(base, "E7", phase="base", tag="d4", step=step, seed=step, tokenizer="pkl")


def test_following_waits_while_the_user_chats_unless_told_not_to(qtbot, windows, loop, monkeypatch, tmp_path):
    base = tmp_path / "base"
    land(base, 10)
    folder = base / "base_checkpoints" / "d4"
    text = tmp_path / "text.txt"
    text.write_text("Once upon a time there was a little dog who liked to run. " * 4, encoding="utf-8")
    win = start_with_base(qtbot, windows, monkeypatch, base, fake=False)
    view = show_run(qtbot, win, folder)
    task = f"bits per byte: {text.name}"
    # Checked with no evaluation run yet, it asks which: closed without a choice, nothing follows.
    monkeypatch.setattr(view.follow_menu, "exec", lambda *_args: None)
    qtbot.mouseClick(view.follow_box, Qt.MouseButton.LeftButton)
    assert not view.follow_box.isChecked() and view.session.follow is None
    assert not view.pause_btn.isEnabled()
    # Bits per byte… picked, and the text in the file dialog.
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_args, **_kw: (str(text), ""))
    choice = next(a for a in view.follow_menu.actions() if a.text() == "Bits per byte…")
    monkeypatch.setattr(view.follow_menu, "exec", lambda *_args: choice.trigger())
    follow(qtbot, view)
    assert view.session.follow.evaluation == Evaluation("bpb", text)
    with qtbot.waitSignal(win.run_page.bits_sweep.finished, timeout=WAIT):
        view.evaluate("bpb", text)

    with hold_background("a reply"):  # a reply streams in Chat
        land(base, 20)
        qtbot.waitUntil(lambda: "step 20 waits while you chat" in view.status.text(), timeout=WAIT)
        assert rows(view) == ["base 10"] and not view.eval_btn.isEnabled()
        qtbot.wait(300)  # (it goes on waiting)
        assert rows(view) == ["base 10"] and view.session.follow.held
    qtbot.waitUntil(lambda: rows(view) == ["base 10", "base 20"], timeout=WAIT)
    qtbot.waitUntil(lambda: view.session.follow.in_hand is None, timeout=WAIT)

    # Paused, a step that lands waits; resumed, it is evaluated.
    qtbot.mouseClick(view.pause_btn, Qt.MouseButton.LeftButton)
    assert view.pause_btn.text() == "Resume"
    land(base, 30)
    qtbot.waitUntil(lambda: "1 step waiting: paused" in view.status.text(), timeout=WAIT)
    qtbot.wait(300)
    assert rows(view) == ["base 10", "base 20"]
    qtbot.mouseClick(view.pause_btn, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: rows(view) == ["base 10", "base 20", "base 30"], timeout=WAIT)

    # "even while I chat": the step that lands is evaluated while the reply streams.
    qtbot.mouseClick(view.chat_too, Qt.MouseButton.LeftButton)
    assert view.session.even_while_chatting
    qtbot.waitUntil(lambda: view.session.follow.in_hand is None, timeout=WAIT)
    with hold_background("a reply"):
        land(base, 40)
        qtbot.waitUntil(lambda: len(rows(view)) == 4, timeout=WAIT)
        assert not view.session.follow.held
    points = view.timeline.points
    measured = {
        (r.stage, r.step): r.bits_per_byte for r in bpb_sweep(points, text.read_text(encoding="utf-8"))
    }
    assert view.session.scores[task] == pytest.approx(measured)


@pytest.mark.slow
def test_an_evaluation_follows_a_kempnerforge_run_saving_with_dcp(
    qtbot, windows, loop, monkeypatch, tmp_path
):
    base = tmp_path / "base"
    text = tmp_path / "text.txt"
    text.write_text("the small cat sat on the red mat. a big dog ran to the old barn. " * 3, encoding="utf-8")
    run = start_kf_training(base / "kf", steps=(10, 20, 30), hold=True)
    try:
        run.allow(10)
        run.wait_saved(10)
        win = start_with_base(qtbot, windows, monkeypatch, base, fake=False)
        view = show_run(qtbot, win, kf_checkpoints(run.folder))
        with qtbot.waitSignal(win.run_page.bits_sweep.finished, timeout=WAIT):
            view.evaluate("bpb", text)
        assert rows(view) == ["kempnerforge 10"]
        follow(qtbot, view)
        run.allow(20)
        run.allow(30)
        wanted = ["kempnerforge 10", "kempnerforge 20", "kempnerforge 30"]
        qtbot.waitUntil(lambda: rows(view) == wanted and view.session.follow.in_hand is None, timeout=WAIT)
        run.finish()
        task = f"bits per byte: {text.name}"
        direct = {
            (r.stage, r.step): r.bits_per_byte for r in bpb_sweep(view.timeline.points, text.read_text())
        }
        assert view.session.scores[task] == direct
        assert [x for x, _ in view.timeline.line(task)] == [10.0, 20.0, 30.0]
    finally:
        run.stop()
