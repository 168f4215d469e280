"""Compare through the real window, as a user's sequences of actions: steps marked on the Run
tab's curve become the panes, a pane's button says Load or Unload for what is loaded, and the
Compare screen comes back after a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support import REPO
from support.window import open_window, restart

from desktop.qt.app.main_window import MainWindow
from desktop.qt.compare.pane_view import ComparePane
from desktop.qt.widgets.checkpoint_picker import FOLLOW

pytestmark = pytest.mark.gui
WAIT = 60000
DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"


def ask(qtbot, win: MainWindow, text: str, max_tokens: int = 4) -> None:
    """Type ``text`` in Compare's prompt box and press Enter; back once every pane has replied."""
    view = win.compare_view
    view.max_tokens.setValue(max_tokens)
    with qtbot.waitSignal(win.compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        view.input.editor.setPlainText(text)
        qtbot.keyClick(view.input.editor, Qt.Key.Key_Return)


def press_load(qtbot, win: MainWindow, pane: ComparePane) -> None:
    """Press a pane's Load button and wait for the model."""
    assert pane.load_btn.text() == "Load"
    with qtbot.waitSignal(win.compare.pane_loaded, timeout=WAIT):
        qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)


def scanned(qtbot, windows, monkeypatch, base: Path) -> MainWindow:
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(base))
    win = open_window(qtbot)
    windows.append(win)
    with qtbot.waitSignal(win.background.checkpoints_found, timeout=WAIT):
        win.background.scan()
    win.tabs.setCurrentWidget(win.compare_view)
    return win


def test_three_steps_marked_on_the_run_curve_are_the_panes_and_each_names_the_step_that_replies(
    qtbot,
    windows,
    loop,
):
    win = open_window(qtbot)
    windows.append(win)
    run = win.run_page.run_view
    win.tabs.setCurrentWidget(run)
    with qtbot.waitSignal(win.background.timeline_ready, timeout=WAIT):
        run.choose_run(DEMO)
    points = run.timeline.points
    assert len(points) >= 4
    marked = [points[0], points[1], points[-1]]  # the report: 300, 1,000 and 2,400 of the demo
    for point in marked:
        run.click_point(point, Qt.KeyboardModifier.ShiftModifier)
    assert run.compare_btn.text() == "Compare 3"
    qtbot.mouseClick(run.compare_btn, Qt.MouseButton.LeftButton)

    view, compare = win.compare_view, win.compare
    assert win.tabs.currentWidget() is view
    wanted = [(Path(p.path), p.step) for p in marked]
    # The demo run is not among the scanned checkpoints: each pane still shows its own step.
    assert [pane.current() for pane in view.panes] == wanted
    qtbot.waitUntil(lambda: [p.loaded_key for p in compare.panes] == wanted, timeout=WAIT)
    for pane, (_, step) in zip(view.panes, wanted, strict=True):
        assert pane.load_btn.text() == "Unload"
        assert pane.summary.text().startswith(f"step {step:,}  ·")

    ask(qtbot, win, "hello")
    for pane, slot, (_, step) in zip(view.panes, compare.panes, wanted, strict=True):
        assert slot.run.tokens and slot.run.model["step"] == step  # the step that replied
        assert pane.summary.text().startswith(f"step {step:,}  ·") and pane.load_btn.text() == "Unload"


def test_a_panes_button_says_load_or_unload_for_what_is_loaded(
    qtbot,
    windows,
    loop,
    nanochat_base,
    monkeypatch,
):
    win = scanned(qtbot, windows, monkeypatch, nanochat_base)
    pane = win.compare_view.panes[0]
    steps = [pane.step.itemData(i) for i in range(pane.step.count()) if pane.step.itemData(i) != FOLLOW]
    assert pane.step.itemData(0) == FOLLOW and pane.step.currentData() == steps[0]  # "Latest", then steps
    newest, older = steps[0], steps[1]
    assert pane.summary.text() == "Not loaded" and pane.load_btn.text() == "Load"

    press_load(qtbot, win, pane)  # the step the lists show first: the newest
    assert pane.load_btn.text() == "Unload" and pane.summary.text().startswith(f"step {newest:,}  ·")
    qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)
    assert pane.load_btn.text() == "Load" and pane.summary.text() == "Not loaded"
    assert win.compare.panes[0].info is None

    press_load(qtbot, win, pane)
    pane.step.setCurrentIndex(pane.step.findData(older))  # another step, picked but not loaded
    assert pane.load_btn.text() == "Load"
    assert pane.summary.text() == f"step {newest:,} answers · step {older:,} picked: Load to switch"
    press_load(qtbot, win, pane)
    assert win.compare.panes[0].loaded_key == (pane.current()[0], older)
    assert pane.load_btn.text() == "Unload" and pane.summary.text().startswith(f"step {older:,}  ·")


def test_the_compare_screen_comes_back_after_a_restart(
    qtbot,
    windows,
    loop,
    nanochat_base,
    monkeypatch,
):
    win = scanned(qtbot, windows, monkeypatch, nanochat_base)
    view = win.compare_view
    first, second = view.panes
    second.step.setCurrentIndex(1)  # the older step in pane B
    for pane in (first, second):
        press_load(qtbot, win, pane)
    second.temperature.setValue(0.6)
    picks = [p.current() for p in view.panes]
    ask(qtbot, win, "hello there")
    replies = [list(p.run.tokens) for p in win.compare.panes]
    assert all(replies)

    win = restart(qtbot, windows)  # quit without saving: nothing is lost
    view, compare = win.compare_view, win.compare
    win.tabs.setCurrentWidget(view)
    assert [p.current() for p in view.panes] == picks
    assert [p.state.picked for p in view.panes] == picks
    assert [p.load_btn.text() for p in view.panes] == ["Load", "Load"]  # picked, not loaded
    assert [list(p.run.tokens) for p in compare.panes] == replies
    assert [len(p.view.tokens) for p in view.panes] == [len(r) for r in replies]
    assert view.panes[1].temperature.text() == "0.60"
    assert view.input.editor.toPlainText() == "hello there"
    assert view.shared_params() == compare.session.shared  # the row shows what ran, not Chat's values
    win.controller.refresh_list()  # the history list, as the app's start fills it
    assert compare.conv_id is not None and win.sidebar.kind_of(compare.conv_id) == "compare"
    assert view.status.text() == compare.session.divergence_status() != ""
