"""The first message is never lost (#40, item 5): typed and sent right after the window opened,
before the first scan found a model or while it loads, it shows in the chat at once with a line
saying what it waits for, and is answered once the model is loaded; a failed load gives it back
to the box with the reason; Stop/Esc gives it back; a second one is refused visibly."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support.window import WAIT, action, banner_says, open_window

from desktop.config import paths
from desktop.qt.app.main_window import MainWindow

QUESTION = "What is 12 times 7?"


@pytest.fixture
def busy_machine() -> Iterator[None]:
    """Two processes spinning beside the window, as on a 2-core machine doing other work."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait(timeout=30)


def type_and_enter(qtbot, win: MainWindow, text: str) -> None:
    win.input.editor.setPlainText(text)
    qtbot.keyClick(win.input.editor, Qt.Key.Key_Return)


def lines_shown(win: MainWindow) -> list[str]:
    """Every line the waiting message shows, as the chat is told it."""
    shown: list[str] = []
    win.controller.waiting_changed.connect(lambda text, line, _p: shown.append(line) if text else None)
    return shown


def started(qtbot, windows, monkeypatch, base: Path, fake: bool) -> MainWindow:
    """The app just opened: the first scan is under way, no event has run yet."""
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(base))
    win = open_window(qtbot, fake)
    windows.append(win)
    win.start()
    return win


def answered_after_waiting(qtbot, win: MainWindow) -> list[str]:
    """Send the question at once; check it shows waiting; the lines it showed until answered."""
    shown = lines_shown(win)
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT * 8):
        type_and_enter(qtbot, win, QUESTION)
        # At once: out of the box, in the chat, saying what it waits for; Stop can cancel it.
        assert win.input.text() == ""
        block = win.chat.waiting
        assert block.isVisibleTo(win) and block.text == QUESTION
        assert block.line.startswith("Waiting for a model · looking for checkpoints")
        assert win.input.stop_btn.isVisibleTo(win) and not win.input.send_btn.isVisibleTo(win)
    assert win.chat.waiting.isHidden()
    assert [m.role for m in win.controller.session.messages] == ["user", "assistant"]
    assert win.controller.session.messages[0].plain_text() == QUESTION
    return shown


def test_a_message_sent_as_the_window_opens_waits_for_the_model_and_is_answered(
    qtbot, windows, loop, nanochat_base, monkeypatch
):
    win = started(qtbot, windows, monkeypatch, nanochat_base, fake=True)
    shown = answered_after_waiting(qtbot, win)
    assert win.controller.session.messages[1].plain_text() == f"echo: {QUESTION}"
    # It said what it waited for, from the load's own reports, in order.
    assert shown[0] == "Waiting for a model · looking for checkpoints…"
    assert "Waiting for sft/d4 step 20 to load · 0%" in shown
    assert any(
        line.startswith("Waiting for sft/d4 step 20 to load · reading the fake (50%)") for line in shown
    )
    assert win.controller.store.list_conversations()[0].title == QUESTION


def test_on_a_busy_machine_the_real_model_loads_slowly_and_the_message_still_gets_its_answer(
    qtbot, windows, loop, nanochat_base, monkeypatch, busy_machine
):
    win = started(qtbot, windows, monkeypatch, nanochat_base, fake=False)
    win.sampling.set_values({"max_tokens": 4})
    shown = answered_after_waiting(qtbot, win)
    loading = [line for line in shown if line.startswith("Waiting for sft/d4 step 20 to load")]
    assert loading and any("%)" in line for line in loading)  # the engine's own steps, with progress
    reply = win.controller.session.messages[1]
    assert "error" not in reply.meta and reply.meta["stats"]["new_tokens"] > 0


def test_a_failed_load_gives_the_message_back_with_the_reason(qtbot, windows, loop):
    win = open_window(qtbot)
    windows.append(win)
    with qtbot.waitSignal(win.controller.model_load_failed, timeout=WAIT):
        win.chat_page.load_step(Path("/fake/broken"), 1)
        qtbot.mouseClick(win.input.prefill_btn, Qt.MouseButton.LeftButton)  # the reply starts so
        win.input.prefill_edit.setText("It is")
        type_and_enter(qtbot, win, QUESTION)
        assert win.chat.waiting.line.startswith("Waiting for broken step 1 to load")
        assert win.input.prefill_edit.text() == ""
    assert win.input.text() == QUESTION and win.chat.waiting.isHidden()
    assert win.input.prefill() == "It is"
    assert banner_says(win, "Could not load broken")
    assert "truncated or corrupt" in win.banner.message.text()
    assert "back in the box" in win.banner.message.text()
    assert win.input.send_btn.isVisibleTo(win) and win.controller.store.list_conversations() == []


def test_esc_gives_the_waiting_message_back_and_the_model_still_loads(qtbot, windows, loop):
    win = open_window(qtbot)
    windows.append(win)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        win.chat_page.load_step(Path("/fake/m"), 7)
        type_and_enter(qtbot, win, QUESTION)
        assert win.chat.waiting.isVisibleTo(win)
        assert win.input.stop_btn.toolTip().startswith("Stop waiting for the model (Esc)")
        qtbot.keyClick(win.input.editor, Qt.Key.Key_Escape)
        assert win.input.text() == QUESTION and win.chat.waiting.isHidden()
    assert win.controller.session.messages == [] and not win.controller.busy


def test_a_second_message_while_one_waits_is_refused_visibly_and_kept(qtbot, windows, loop):
    win = open_window(qtbot)
    windows.append(win)
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        win.chat_page.load_step(Path("/fake/m"), 7)
        type_and_enter(qtbot, win, QUESTION)
        type_and_enter(qtbot, win, "and 13 times 7?")
        assert banner_says(win, "Not sent yet") and win.input.text() == "and 13 times 7?"
    assert [m.plain_text() for m in win.controller.session.messages] == [QUESTION, f"echo: {QUESTION}"]
    assert win.input.text() == "and 13 times 7?"


def test_with_no_model_to_load_the_waiting_message_comes_back_and_later_ones_are_refused_at_once(
    qtbot, windows, loop, monkeypatch, tmp_path
):
    monkeypatch.setattr(paths, "demo_checkpoint", lambda: None)  # an installation without the demo
    win = started(qtbot, windows, monkeypatch, tmp_path / "no-checkpoints", fake=True)
    with qtbot.waitSignal(win.background.checkpoints_found, timeout=WAIT):
        type_and_enter(qtbot, win, QUESTION)
        assert win.chat.waiting.isVisibleTo(win) and win.input.text() == ""
    assert win.input.text() == QUESTION and win.chat.waiting.isHidden()
    assert banner_says(win, "No checkpoints yet") and win.input.send_btn.isVisibleTo(win)
    type_and_enter(qtbot, win, QUESTION)  # nothing is coming now: said at once, and kept
    assert banner_says(win, "No model loaded") and win.input.text() == QUESTION
    assert win.chat.waiting.isHidden() and win.controller.store.list_conversations() == []


def test_a_new_chat_while_a_message_waits_gives_it_back_and_the_new_chat_stays_empty(qtbot, windows, loop):
    win = open_window(qtbot)
    windows.append(win)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        win.chat_page.load_step(Path("/fake/m"), 7)
        type_and_enter(qtbot, win, QUESTION)
        action(win, "New chat").trigger()  # Ctrl+N
        assert win.input.text() == QUESTION and win.chat.waiting.isHidden()
    assert win.controller.session.messages == [] and not win.controller.busy
