"""The Inside view opens at once while the raw tokens are shown (issue #45, Cost): each reply's
pass is prepared on the model's thread as soon as the reply ends, and it gives way to the user's
next message, through the real window as a user does it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support.window import action, send, start_with_base
from test_inside_window import LONG, click_token, open_inside

from desktop.engine import inside as inside_module

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]
DEMO_BASE = Path(__file__).resolve().parents[3] / "resources" / "demo"


def start(qtbot, windows, monkeypatch):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    win.sampling.set_values({**win.sampling.values(), "temperature": 0.0, "max_tokens": 12})
    return win


def test_with_raw_tokens_shown_a_replys_inside_opens_without_waiting_for_a_pass(qtbot, windows, monkeypatch):
    win = start(qtbot, windows, monkeypatch)
    inside, slot = win.controller.inside, win.controller.slot
    action(win, "Raw tokens").trigger()
    with qtbot.waitSignal(inside.inside_prepared, timeout=LONG) as prepared:
        send(qtbot, win, "Hello there")
    first_id = win.controller.path[-1][0]
    assert prepared.args == [first_id] and slot.inside_passes == 1

    # The click shows the view before the GUI thread hears from the model's thread again.
    shown: list[int] = []
    inside.inside_ready.connect(lambda _source, position: shown.append(position))
    open_inside(qtbot, win, 3)
    assert len(shown) == 1 and slot.inside_passes == 1
    view = win.chat_page.inside_view
    assert view is not None and view.isVisible() and view.position == shown[0]
    assert view.inside.produced == win.controller.path[-1][1].tokens.ids[3]

    # The next reply is prepared in its turn; one pass is held at a time, so the first reply's
    # other tokens need a pass of their own again (the token seen stays kept).
    with qtbot.waitSignal(inside.inside_prepared, timeout=LONG) as prepared:
        send(qtbot, win, "And again")
    assert prepared.args == [win.controller.path[-1][0]] and slot.inside_passes == 2
    first = win.chat.widgets[-3]
    assert first.message is dict(win.controller.path)[first_id]
    click_token(qtbot, first.raw_view, 3)
    qtbot.mouseClick(first.popup.inside_btn, Qt.MouseButton.LeftButton)
    assert len(shown) == 2 and slot.inside_passes == 2
    with qtbot.waitSignal(inside.inside_ready, timeout=LONG):
        click_token(qtbot, first.raw_view, 5)
        qtbot.mouseClick(first.popup.inside_btn, Qt.MouseButton.LeftButton)
    assert slot.inside_passes == 3


def test_a_prepared_pass_gives_way_to_the_next_message_and_a_click_on_it_still_opens(
    qtbot, windows, monkeypatch
):
    win = start(qtbot, windows, monkeypatch)
    inside = win.controller.inside
    gate = threading.Event()  # the prepared pass waits on the model's thread until it is set
    real = inside_module.inspect_all

    def held(*args):
        assert gate.wait(LONG / 1000)
        return real(*args)

    monkeypatch.setattr("desktop.engine.inside.inspect_all", held)
    action(win, "Raw tokens").trigger()
    send(qtbot, win, "Hello there")
    open_inside(qtbot, win, 3)  # waits on the prepared pass, which is held
    assert win.chat_page.inside_view is None

    order: list[str] = []
    win.controller.reply_finished.connect(lambda _stats: order.append("reply"))
    inside.inside_ready.connect(lambda _source, position: order.append(f"inside {position}"))
    with qtbot.waitSignal(inside.inside_ready, timeout=LONG) as ready:
        send_now = win.input.editor
        send_now.setPlainText("Next question")
        qtbot.keyClick(send_now, Qt.Key.Key_Return)
        gate.set()
    source, position = ready.args
    # The prepared pass gave way at once: the reply came first, then a pass of its own for the
    # click (the third pass asked: the new reply's own is prepared too).
    assert order == ["reply", f"inside {position}"]
    assert position == source.reply_start + 3 - 1 and win.controller.slot.inside_passes == 3
    assert source.ids[position + 1] == win.controller.path[-3][1].tokens.ids[3]
    assert win.chat_page.inside_view is not None and win.chat_page.inside_view.position == position
