"""The Chat screen while a reply streams and around it, as a user meets it in the real window:
a continuation typed in the token popup keeps its start on screen and in the context counter,
the counter and the tok/s move with the tokens, right-clicking another chat never shows two chats
at once, and Enter in "Reply starts with:" sends."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QEventLoop, Qt, QTimer
from PySide6.QtGui import QContextMenuEvent
from PySide6.QtWidgets import QApplication, QMenu
from support.window import WAIT, action, load_fake, send, start_with_base
from test_fork_window import DEMO_BASE, click_token, greedy

from desktop.qt.app.main_window import MainWindow
from desktop.qt.chat.message_widget import MessageWidget

# The offscreen platform cannot raise a popup or grab the keyboard for it, and says so.
pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]


def context_shown(window: MainWindow) -> int:
    used, total = (int(x) for x in window.status.context.text().split(" / "))
    assert window.input.hint.text() == f"{used} / {total} context tokens"
    return used


def on_screen(window: MainWindow) -> list[str]:
    """The texts of the message widgets the conversation column shows, top to bottom."""
    box = window.chat.column.box
    widgets = [box.itemAt(i).widget() for i in range(box.count())]
    return [
        w.message.plain_text()
        for w in widgets
        if isinstance(w, MessageWidget) and w.isVisibleTo(window.chat.column)
    ]


def test_a_continuation_keeps_its_start_on_screen_and_in_the_counter(qtbot, windows, loop, monkeypatch):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    greedy(win)
    send(qtbot, win, "What is 12 times 7?")
    action(win, "Raw tokens").trigger()
    original = win.controller.path[-1][1]
    at = 4
    kept = original.tokens.texts[:at]
    click_token(qtbot, win.chat.widgets[-1].raw_view, at)
    popup = win.chat.widgets[-1].popup
    assert popup is not None

    moments: list[tuple[list[str], int, int]] = []  # (raw tokens shown, tokens so far, counter)

    def look(_ev) -> None:
        streaming = win.chat.streaming
        reply = win.controller.session.reply
        assert streaming is not None and reply is not None
        moments.append(([r.text for r in streaming.raw_view.tokens], len(reply.tokens), context_shown(win)))

    win.controller.reply_event.connect(look)
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT) as done:
        popup.own.setText(" eighty")
        qtbot.keyClick(popup.own, Qt.Key.Key_Return)
        # Before any token: the kept start is already on screen.
        assert win.chat.streaming is not None
        assert [r.text for r in win.chat.streaming.raw_view.tokens] == kept
    win.controller.reply_event.disconnect(look)
    stats = done.args[0]
    assert len(moments) > 3
    for shown, count, _used in moments:
        assert shown[:at] == kept and len(shown) == count  # the start, then every token so far
    # The counter counts the prompt, the kept start and every token so far, from the first token
    # on: what it shows at the end, less the tokens not yet there.
    final = stats["prompt_tokens"] + stats["new_tokens"]
    reply = win.controller.path[-1][1]
    assert [used for _, _, used in moments] == [final - len(reply.tokens) + count for _, count, _ in moments]
    assert context_shown(win) == final


def test_the_context_counter_and_the_speed_move_while_a_reply_streams(qtbot, win):
    load_fake(qtbot, win)
    send(qtbot, win, "hello")
    before = context_shown(win)
    seen: list[tuple[int, str]] = []
    win.controller.reply_event.connect(lambda _ev: seen.append((context_shown(win), win.status.speed.text())))
    win.status.set_speed(None, None)  # as a fresh window shows it: "— tok/s"
    stats = send(qtbot, win, "a longer question for the fake model")
    counts = [used for used, _ in seen]
    prompt = stats["prompt_tokens"]
    assert counts == list(range(prompt + 1, prompt + stats["new_tokens"] + 1)) and prompt > before
    speeds = [speed for _, speed in seen]
    assert speeds[0] == "— tok/s"  # one token is no rate yet
    assert all(s.endswith(" tok/s") and s != "— tok/s" for s in speeds[1:])  # measured from the 2nd on
    engine = stats.get("decode_tok_s")  # at the end, the engine's own measure (the fake has none)
    assert win.status.speed.text() == (f"{engine:.1f} tok/s" if engine else "— tok/s")


def test_right_clicking_another_chat_never_shows_two_chats_at_once(qtbot, win):
    load_fake(qtbot, win)
    send(qtbot, win, "first chat")
    first = win.controller.conv_id
    action(win, "New chat").trigger()
    send(qtbot, win, "second chat")
    assert on_screen(win) == ["second chat", "echo: second chat"]

    lst = win.sidebar.list
    row = next(i for i in range(lst.count()) if lst.item(i).data(Qt.ItemDataRole.UserRole) == first)
    pos = lst.visualItemRect(lst.item(row)).center()
    during: list[list[str]] = []

    def while_the_menu_is_open() -> None:
        menu = next(m for m in win.sidebar.findChildren(QMenu) if m.isVisible())
        QApplication.processEvents()
        during.append(on_screen(win))
        menu.close()

    def right_click() -> None:
        QTimer.singleShot(0, while_the_menu_is_open)
        qtbot.mousePress(lst.viewport(), Qt.MouseButton.RightButton, pos=pos)
        menu_event = QContextMenuEvent(QContextMenuEvent.Reason.Mouse, pos, lst.viewport().mapToGlobal(pos))
        QApplication.sendEvent(lst.viewport(), menu_event)  # opens the menu; returns once it closes
        qtbot.mouseRelease(lst.viewport(), Qt.MouseButton.RightButton, pos=pos)
        app_loop.quit()

    # The click arrives while the app's event loop runs, as it does for the user (a widget taken
    # away then is deleted only once that loop runs again, after the menu's own loop ends).
    app_loop = QEventLoop()
    QTimer.singleShot(0, right_click)
    app_loop.exec()
    assert during, "the context menu did not open"
    shown = [m.plain_text() for _, m in win.controller.path]
    assert during[0] == shown and shown in (
        ["first chat", "echo: first chat"],
        ["second chat", "echo: second chat"],
    )
    assert on_screen(win) == shown


def test_enter_in_reply_starts_with_sends_the_message_with_its_start(qtbot, win):
    load_fake(qtbot, win)
    qtbot.mouseClick(win.input.prefill_btn, Qt.MouseButton.LeftButton)
    win.input.editor.setPlainText("What is 6 times 7?")
    qtbot.keyClicks(win.input.prefill_edit, "Sure")
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        qtbot.keyClick(win.input.prefill_edit, Qt.Key.Key_Return)
    user, reply = (m for _, m in win.controller.path)
    assert user.plain_text() == "What is 6 times 7?"
    assert reply.meta["fork"] == {"at": 0, "prefill": True}  # the model was asked to go on from it
    assert "began with your words" in win.chat.widgets[-1].footer.text()
    assert win.input.text() == "" and win.input.prefill_edit.text() == ""
    # Empty: Enter there sends nothing.
    qtbot.keyClick(win.input.prefill_edit, Qt.Key.Key_Return)
    assert not win.controller.busy and len(win.controller.path) == 2
