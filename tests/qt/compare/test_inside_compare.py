"""The Inside view across steps, through the real window, as a user does it (issue #45, window
test 5): three steps of the bundled demo run in Compare, one greedy question, a click on a reply
token in pane A, then Inside: one column per pane, headed by its letter and step, each its own
model's Inside at that token of its own reply (the last layer's lens probability is the pane's
own token probability)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from support import REPO
from support.window import open_window

from desktop.qt.widgets import theme

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]
WAIT = 60000
DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
SHOTS = os.environ.get("NANOSCOPE_SCREENSHOTS")  # a folder: save the window there, light and dark


def test_inside_in_compare_is_one_column_per_step_each_from_its_own_reply(qtbot, windows, loop, tmp_path):
    win = open_window(qtbot)
    windows.append(win)
    view, compare = win.compare_view, win.compare
    win.tabs.setCurrentWidget(view)
    steps = sorted(int(p.name.split("_")[1].split(".")[0]) for p in DEMO.glob("model_*.pt"))
    assert len(steps) >= 3
    wanted = [(DEMO, steps[0]), (DEMO, steps[len(steps) // 2]), (DEMO, steps[-1])]
    compare.open_checkpoints(wanted)
    qtbot.waitUntil(lambda: [p.loaded_key for p in compare.panes] == wanted, timeout=WAIT)

    view.sampling_row.set_values({"temperature": 0.0, "seed": 7})
    view.max_tokens.setValue(5)
    view.overlay_box.setChecked(True)  # the token probabilities: each pane's trace keeps them
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        view.input.editor.setPlainText("What is the capital of France?")
        qtbot.keyClick(view.input.editor, Qt.Key.Key_Return)
    assert all(len(p.run.trace) for p in compare.panes)

    token = 1
    pane_a = view.panes[0]
    qtbot.mouseClick(pane_a.view.viewport(), Qt.MouseButton.LeftButton, pos=pane_a.view.token_point(token))
    popup = pane_a.popup
    assert popup is not None and popup.inside_btn.isVisible() and popup.inside_btn.isEnabled()
    qtbot.mouseClick(popup.inside_btn, Qt.MouseButton.LeftButton)

    qtbot.waitUntil(lambda: view.inside_window is not None and view.inside_window.isVisible(), timeout=WAIT)
    window = view.inside_window
    assert window is not None
    qtbot.waitUntil(lambda: compare.inside is not None and compare.inside.done, timeout=WAIT)
    state = compare.inside
    assert state is not None and state.token == token
    assert len(window.columns) == len(compare.panes) == 3
    same = 0
    for i, (column, slot, (_, step)) in enumerate(zip(window.columns, compare.panes, wanted, strict=True)):
        col = state.columns[i]
        assert column.heading.text() == f"{'ABC'[i]} · step {step:,}"  # each column names its step
        trace = slot.run.trace
        if token >= len(trace):  # a shorter reply says so in one line
            assert column.view is None and "no token" in column.line.text()
            continue
        assert column.view is not None, column.line.text()
        inside = column.view.inside
        assert inside is not None and col.source is column.view.source
        assert inside.produced == trace.ids[token]  # this pane's own reply, not pane A's
        # after the very ids the pane's model was fed
        assert col.source.ids[: col.source.reply_start] == slot.run.prompt_ids
        lp = trace.logprobs[token]
        if lp is not None:
            assert inside.lens[-1].produced_prob == pytest.approx(math.exp(lp[0]), rel=1e-3)
            same += 1
    assert same == len([p for p in compare.panes if len(p.run.trace) > token]) >= 1

    # A prompt token clicked in column B's attention row: every column moves to that position.
    b = window.columns[1].view
    assert b is not None
    qtbot.mouseClick(b.tokens, Qt.MouseButton.LeftButton, pos=b.tokens.chip(3).center())
    assert [c.view.position for c in window.columns if c.view is not None] == [3] * same
    for column in window.columns:  # back to the reply token for the screenshots
        if column.view is not None:
            column.view.show_position(column.view.source.position_of(token))

    app = QApplication.instance()
    window.resize(1500, 900)
    for mode in ("light", "dark"):
        theme.apply_theme(app, mode)
        qtbot.wait(50)
        target = Path(SHOTS) if SHOTS else tmp_path
        assert window.grab().save(str(target / f"inside-compare-{mode}.png"))
    theme.apply_theme(app, "light")

    # Pane C's model freed: its column says so in one line; A and B look again at token 0.
    compare.unload(2)
    qtbot.mouseClick(pane_a.view.viewport(), Qt.MouseButton.LeftButton, pos=pane_a.view.token_point(0))
    assert pane_a.popup is not None
    qtbot.mouseClick(pane_a.popup.inside_btn, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: compare.inside is not state and compare.inside.done, timeout=WAIT)
    assert "not loaded" in window.columns[2].line.text() and window.columns[2].view is None
    for column, slot in zip(window.columns[:2], compare.panes[:2], strict=True):
        assert column.view is not None and column.view.inside.produced == slot.run.trace.ids[0]
    assert window.columns[0].view.position == window.columns[0].view.source.reply_start - 1


def test_a_column_without_an_inside_says_why_in_one_line():
    from desktop.engine.messages import TokenEvent, TokenTrace
    from desktop.session.compare.inside import NO_IDS, NO_REPLY, CompareInside

    def trace(ids: list[int]) -> TokenTrace:
        t = TokenTrace()
        for i in ids:
            t.add(TokenEvent(i, f"t{i}", False, "text", logprob=-0.5))
        return t

    state = CompareInside(token=2)
    long = state.column_for(trace([5, 6, 7]), "A", 300)
    short = state.column_for(trace([5, 6]), "B", 1700)
    served = state.column_for(trace([-1, -1, -1]), "C", None)
    empty = state.column_for(TokenTrace(), "D", 2400)
    assert (long.line, long.token_id, long.token_logprob) == ("", 7, -0.5)
    assert short.line == "its reply has no token 3 (it is 2 tokens long)"
    assert served.line == NO_IDS and empty.line == NO_REPLY
    assert [c.heading for c in state.columns] == ["A · step 300", "B · step 1,700", "C", "D · step 2,400"]
    state.asked = {0: 11}
    assert state.failed(12, "no") is None and state.failed(11, "the pass failed") == 0
    assert long.line == "the pass failed" and state.done
