"""Inside the model at a reply's token, through the real window, as a user does it (issue #45):
send to the bundled demo (a nanochat checkpoint), open the raw tokens, click a reply token, then
Inside; pick a layer and a head, hover an earlier token, click it to move there; restart: the
same token's Inside view opens again from history, without the model and without a new pass."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QMouseEvent
from PySide6.QtWidgets import QApplication, QWidget
from support.window import WAIT, action, load_fake, open_window, restart, send, start_with_base

from desktop.engine.inside import InsideCache
from desktop.qt.app.main_window import MainWindow
from desktop.qt.widgets.token_view import TokenView

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]
DEMO_BASE = Path(__file__).resolve().parents[3] / "resources" / "demo"
LONG = 60000


def click_token(qtbot, view: TokenView, index: int) -> None:
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.token_point(index))


def hover(widget: QWidget, point: QPoint) -> None:
    """The mouse moved over ``point`` of ``widget`` (no button held)."""
    event = QMouseEvent(
        QEvent.Type.MouseMove,
        QPointF(point),
        QPointF(widget.mapToGlobal(point)),
        Qt.MouseButton.NoButton,
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(widget, event)


def open_inside(qtbot, win: MainWindow, index: int):
    """Click reply token ``index`` in the raw view, then the popup's Inside button."""
    widget = win.chat.widgets[-1]
    click_token(qtbot, widget.raw_view, index)
    popup = widget.popup
    assert popup is not None and popup.inside_btn.isVisible()
    qtbot.mouseClick(popup.inside_btn, Qt.MouseButton.LeftButton)
    return popup


def open_and_check(qtbot, win: MainWindow, reply, i: int):
    """Click the reply's token ``i``, then Inside, and wait for the view: it shows the position
    that predicted that token, and its lens's last layer is the model's own distribution there
    (the reply's own probability of the token, in the table too). (source, position, view)."""
    with qtbot.waitSignal(win.controller.inside.inside_ready, timeout=LONG) as ready:
        open_inside(qtbot, win, i)
    source, position = ready.args
    view = win.chat_page.inside_view
    assert view is not None and view.isVisible() and view.position == position
    assert position == source.reply_start + i - 1 and source.ids[position + 1] == reply.tokens.ids[i]
    inside = view.inside
    assert inside.produced == reply.tokens.ids[i]
    assert inside.lens[-1].produced_prob == pytest.approx(math.exp(reply.tokens.logprobs[i][0]), rel=1e-3)
    assert view.lens.rowCount() == len(inside.lens)
    assert view.lens.item(len(inside.lens) - 1, 7).text() == f"{inside.lens[-1].produced_prob:.4f}"
    return source, position, view


def pick_hover_and_move(qtbot, view, source) -> int:
    """In the Inside view: pick the last layer and head in the grid, hover the token two before
    the position (its weight, as the engine says), click it: the view moves to that token's own
    position, from the same pass. Returns that position."""
    inside, position = view.inside, view.position
    layer, head = len(inside.attention) - 1, len(inside.attention[0]) - 1
    qtbot.mouseClick(view.grid, Qt.MouseButton.LeftButton, pos=view.grid.cell(layer, head).center())
    assert (view.layer, view.head) == (layer, head)
    j = position - 2
    hover(view.tokens, view.tokens.chip(j).center())
    want = inside.attention[layer][head][j]
    assert f"weight {want:.4f}" in view.tokens.toolTip()
    assert view.weight(j) == want
    with qtbot.waitSignal(view.position_changed) as moved:
        qtbot.mouseClick(view.tokens, Qt.MouseButton.LeftButton, pos=view.tokens.chip(j).center())
    assert moved.args == [j] and view.inside.position == j and view.inside.produced == source.ids[j + 1]
    return j


def reopen(qtbot, windows, conv_id: int, load: bool) -> MainWindow:
    """Quit and start the app again (loading its newest model when ``load``), open the
    conversation and show the raw tokens."""
    win = restart(qtbot, windows, fake=False)
    if load:
        with qtbot.waitSignal(win.controller.model_loaded, timeout=LONG):
            win.start()
    win.controller.open_conversation(conv_id)
    action(win, "Raw tokens").trigger()
    qtbot.waitUntil(lambda: bool(win.chat.widgets), timeout=WAIT)
    return win


def test_inside_a_reply_token_then_an_earlier_one_then_again_after_a_restart(
    qtbot, windows, loop, monkeypatch
):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    win.sampling.set_values({**win.sampling.values(), "temperature": 0.0, "max_tokens": 12})
    send(qtbot, win, "Hello there")
    action(win, "Raw tokens").trigger()
    reply = win.controller.path[-1][1]
    i = 3
    assert len(reply.tokens) > i and reply.tokens.logprobs[i] is not None

    # Click a reply token, then Inside: one pass, off the GUI thread, then the view.
    source, position, view = open_and_check(qtbot, win, reply, i)
    assert win.controller.slot.inside_passes == 1
    inside = view.inside

    j = pick_hover_and_move(qtbot, view, source)
    assert win.controller.slot.inside_passes == 1

    # Both positions are kept with the reply in history.
    conv_id, reply_id = win.controller.conv_id, win.controller.path[-1][0]
    stored = dict(win.controller.store.active_path(conv_id))[reply_id].meta["inside"]
    kept = InsideCache.saved(stored)
    assert {p for p, _ in kept} == {position, j}

    # Restart (no model loaded this time): the same token's Inside opens from history.
    win = reopen(qtbot, windows, conv_id, load=False)
    with qtbot.waitSignal(win.controller.inside.inside_ready, timeout=WAIT) as again:
        open_inside(qtbot, win, i)
    assert again.args[1] == position and win.controller.slot.inside_passes == 0
    view = win.chat_page.inside_view
    assert view is not None and view.inside.lens == inside.lens and view.inside.attention == inside.attention

    # A token never looked at needs the model, which is not loaded: the popup says so in one line.
    popup = open_inside(qtbot, win, i + 2)
    qtbot.waitUntil(lambda: "not loaded" in popup.inside_note.text(), timeout=WAIT)
    assert win.controller.slot.inside_passes == 0


def test_a_model_without_an_inside_view_says_so_in_the_popup(qtbot, windows):
    win = open_window(qtbot)
    windows.append(win)
    load_fake(qtbot, win)
    send(qtbot, win, "hi")
    action(win, "Raw tokens").trigger()
    with qtbot.waitSignal(win.controller.inside.inside_failed, timeout=WAIT) as failed:
        popup = open_inside(qtbot, win, 1)
    line = failed.args[0]
    assert line and "\n" not in line and popup.inside_note.text() == line
    assert win.chat_page.inside_view is None

    # A reply a served model wrote: no pass is asked for.
    reply = win.controller.path[-1][1]
    reply.meta["family"] = "remote"
    passes = win.controller.slot.inside_passes
    with qtbot.waitSignal(win.controller.inside.inside_failed, timeout=WAIT) as failed:
        open_inside(qtbot, win, 1)
    assert "served model" in failed.args[0] and win.controller.slot.inside_passes == passes


def test_a_reply_from_history_is_looked_inside_with_the_prompt_its_model_was_fed(
    qtbot, windows, loop, monkeypatch
):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    win.sampling.set_values(
        {**win.sampling.values(), "temperature": 0.0, "max_tokens": 12, "system_prompt": "Answer in rhyme."}
    )
    send(qtbot, win, "Hello there")
    conv_id, reply_id = win.controller.conv_id, win.controller.path[-1][0]
    reply = win.controller.path[-1][1]
    assert reply.meta["system_prompt"] == "Answer in rhyme." and reply.meta["prompt_digest"]

    # Restart and load the same model: the reply's conversation is rendered again for the pass,
    # with its system prompt and the room its generation kept, so the numbers are the reply's own.
    win = reopen(qtbot, windows, conv_id, load=True)
    i = 4
    with qtbot.waitSignal(win.controller.inside.inside_ready, timeout=LONG) as ready:
        open_inside(qtbot, win, i)
    inside = win.chat_page.inside_view.inside
    assert ready.args[0].ids[ready.args[1] + 1] == reply.tokens.ids[i]
    assert inside.lens[-1].produced_prob == pytest.approx(math.exp(reply.tokens.logprobs[i][0]), rel=1e-3)

    # A conversation that renders otherwise now (here: its system prompt edited in history) is
    # one line in the popup, not numbers the model never computed.
    stored = dict(win.controller.store.active_path(conv_id))[reply_id]
    stored.meta["system_prompt"] = "Answer in prose."
    win.controller.store.update_message(reply_id, stored, complete=True)
    win = reopen(qtbot, windows, conv_id, load=True)
    with qtbot.waitSignal(win.controller.inside.inside_failed, timeout=LONG) as failed:
        popup = open_inside(qtbot, win, i + 1)
    assert "renders otherwise" in failed.args[0] and popup.inside_note.text() == failed.args[0]
    assert win.chat_page.inside_view is None
