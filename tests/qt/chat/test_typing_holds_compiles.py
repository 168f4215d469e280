"""Typing in the chat's input box holds background compiles (engine/foreground.py) until the user
pauses, through the real window: what the user types is never slowed by a compile of a model's
forward, which goes on once the typing stops (issue #40)."""

from __future__ import annotations

from support.window import WAIT, open_window

from desktop.engine.foreground import holding
from desktop.qt.chat.page import TYPING_HOLD_MS


def test_typing_holds_background_compiles_until_a_pause(qtbot):
    win = open_window(qtbot)
    assert holding() == []
    qtbot.keyClicks(win.chat_page.input.editor, "What is 12 times")
    assert holding() == ["typing"]
    qtbot.waitUntil(lambda: holding() == [], timeout=TYPING_HOLD_MS + WAIT)
    qtbot.keyClicks(win.chat_page.input.editor, " 7?")  # typing again holds again
    assert holding() == ["typing"]
    win.close()
    qtbot.waitUntil(lambda: holding() == [], timeout=TYPING_HOLD_MS + WAIT)
