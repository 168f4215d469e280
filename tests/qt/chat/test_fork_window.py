"""Fork at a token, through the real window, as a user does it (issue #25): hover a token of the
demo's reply, click it, pick an alternative, switch between the versions, regenerate the fork,
continue a reply cut at its token limit, restart and reopen, and race a fork in Compare on the
demo run's steps. The model is the bundled demo (trained, with calculator calls), loaded from a
nanochat base dir the first scan lists.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QToolTip
from support.window import WAIT, action, restart, send, start_with_base

from desktop.qt.app.main_window import MainWindow
from desktop.qt.chat.message_blocks import RichText, ToolCallBlock
from desktop.qt.chat.message_widget import MessageWidget
from desktop.qt.widgets.token_records import FORK_GLYPH
from desktop.qt.widgets.token_view import TokenView

# The offscreen platform cannot raise a popup or grab the keyboard for it, and says so.
pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]
DEMO_BASE = Path(__file__).resolve().parents[3] / "resources" / "demo"


def greedy(win: MainWindow, max_tokens: int = 40) -> None:
    win.sampling.set_values({**win.sampling.values(), "temperature": 0.0, "max_tokens": max_tokens})


def last(win: MainWindow) -> MessageWidget:
    return win.chat.widgets[-1]


def click_token(qtbot, view: TokenView, index: int) -> None:
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.token_point(index))


def hover_text(view: TokenView, index: int) -> str:
    point = view.token_point(index)
    event = QHelpEvent(QEvent.Type.ToolTip, point, view.viewport().mapToGlobal(point))
    view.viewportEvent(event)
    return QToolTip.text()


def shown_text(widget: MessageWidget) -> str:
    """What the rendered message reads: its text runs, calculator calls and results."""
    out = []
    for seg in widget.segment_widgets():
        if isinstance(seg, RichText):
            out.append(seg.toPlainText())
        elif isinstance(seg, ToolCallBlock):
            out += [seg.code.text(), seg.result.text()]
    return "".join(out)


def choice(win: MainWindow) -> int:
    """The first sampled token past the second whose runner-up differs from it."""
    trace = win.controller.path[-1][1].tokens
    for i in range(2, len(trace)):
        lp = trace.logprobs[i]
        if not trace.forced[i] and lp is not None and len(lp[1]) > 1 and lp[1][1][0] != trace.ids[i]:
            return i
    raise AssertionError("no token with a distinct runner-up")


def test_fork_switch_regenerate_continue_restart_and_race(qtbot, windows, loop, monkeypatch):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    greedy(win)
    send(qtbot, win, "What is 12 times 7?")
    action(win, "Raw tokens").trigger()
    original = win.controller.path[-1][1]
    view = last(win).raw_view
    assert view.isVisible() and len(view.tokens) == len(original.tokens)

    # Hover: the token's probability and what the model weighed instead.
    i = choice(win)
    assert "p = " in hover_text(view, i)
    alt_id = original.tokens.logprobs[i][1][1][0]

    # Click: the popup lists the alternatives; the runner-up forks the reply there.
    click_token(qtbot, view, i)
    popup = last(win).popup
    assert popup is not None and popup.isVisible()
    assert not popup.buttons[0].isEnabled()  # what the reply said
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        popup.buttons[1].click()
    forked = win.controller.path[-1][1]
    assert forked.tokens.ids[:i] == original.tokens.ids[:i]
    assert forked.tokens.ids[i] == alt_id and forked.tokens.given[i] and not any(forked.tokens.given[:i])
    assert forked.meta["fork"]["at"] == i
    assert forked.meta["stats"]["prefilled_tokens"] == 1  # the cache held the reply: one token
    w = last(win)
    assert w.branch_label.text() == "2 / 2"
    assert f"forked at token {i}" in w.footer.text()
    assert FORK_GLYPH in w.raw_view.toPlainText()

    # Switch back and forth between the original and the fork.
    qtbot.mouseClick(last(win).prev_btn, Qt.MouseButton.LeftButton)
    assert win.controller.path[-1][1].tokens.ids == original.tokens.ids
    qtbot.mouseClick(last(win).next_btn, Qt.MouseButton.LeftButton)
    assert win.controller.path[-1][1].tokens.ids == forked.tokens.ids

    # Regenerate the fork: a third version from the same fork point, with the same choice.
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        action(win, "Regenerate last reply").trigger()
    again = win.controller.path[-1][1]
    assert last(win).branch_label.text() == "3 / 3"
    assert again.tokens.ids[: i + 1] == forked.tokens.ids[: i + 1] and again.tokens.given[i]
    assert again.tokens.ids == forked.tokens.ids  # greedy: the same continuation

    # Typing your own words at a token forks the same way.
    click_token(qtbot, last(win).raw_view, i)
    popup = last(win).popup
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        popup.own.setText(" eighty")
        qtbot.keyClick(popup.own, Qt.Key.Key_Return)
    typed = win.controller.path[-1][1]
    given = [t for t, g in zip(typed.tokens.texts, typed.tokens.given, strict=True) if g]
    assert "".join(given) == " eighty" and last(win).branch_label.text() == "4 / 4"

    # Prefill: the user writes how the reply begins; the model goes on from there, and a
    # regeneration keeps the user's start.
    qtbot.mouseClick(win.input.prefill_btn, Qt.MouseButton.LeftButton)
    assert win.input.prefill_row.isVisible()
    win.input.prefill_edit.setText("Sure! The answer")
    send(qtbot, win, "What is 6 times 7?")
    begun = win.controller.path[-1][1]
    start = [t for t, g in zip(begun.tokens.texts, begun.tokens.given, strict=True) if g]
    assert "".join(start) == "Sure! The answer" and begun.tokens.given[0]
    assert begun.plain_text().startswith("Sure! The answer") and len(begun.tokens) > len(start)
    assert "began with your words" in last(win).footer.text()
    assert win.input.prefill_edit.text() == ""  # used once, like the message
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        action(win, "Regenerate last reply").trigger()
    assert win.controller.path[-1][1].plain_text().startswith("Sure! The answer")
    qtbot.mouseClick(win.input.prefill_btn, Qt.MouseButton.LeftButton)
    assert not win.input.prefill_row.isVisible()

    # A reply cut at its token limit goes on with Continue, as a new version.
    greedy(win, max_tokens=6)
    send(qtbot, win, "Tell me a story.")
    cut = win.controller.path[-1][1]
    assert cut.meta["stats"]["stopped"] == "max_tokens" and last(win).continue_btn.isVisibleTo(last(win))
    greedy(win, max_tokens=10)
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        last(win).continue_btn.click()
    longer = win.controller.path[-1][1]
    assert longer.tokens.ids[: len(cut.tokens)] == cut.tokens.ids and len(longer.tokens) > len(cut.tokens)
    assert "continued after token 6" in last(win).footer.text()
    conv = win.controller.conv_id

    # Restart and reopen: the versions, the fork marks and the user's token are all kept.
    win = restart(qtbot, windows, fake=False)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        win.start()
    win.controller.open_conversation(conv)
    reply_index = 1
    kept = win.controller.path[reply_index][1]
    assert kept.tokens.ids == typed.tokens.ids and kept.tokens.given == typed.tokens.given
    shown = win.chat.widgets[reply_index]
    assert shown.branch_label.text() == "4 / 4" and FORK_GLYPH in shown.footer.text()
    assert FORK_GLYPH in shown_text(shown)  # the fork point is marked in the text itself

    # Race a fork in Compare: every step of the demo run, the same fork, cross-scored.
    action(win, "Raw tokens").trigger()
    shown = win.chat.widgets[reply_index]
    click_token(qtbot, shown.raw_view, i)
    popup = shown.popup
    assert popup is not None and popup.race.isVisible()
    popup.race.setChecked(True)
    compare = win.compare_view.controller
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        popup.buttons[1].click()
    assert win.tabs.currentWidget() is win.compare_view
    runs = [p.run for p in compare.panes]
    assert len(runs) == 4 and len({p.info.step for p in compare.panes}) == 4
    for run in runs:
        assert run.trace.ids[:i] == kept.tokens.ids[:i] and run.trace.ids[i] == alt_id and run.trace.given[i]
        assert run.reply.meta["fork"]["at"] == i
    assert compare.messages[-1].plain_text() == "What is 12 times 7?"
    assert compare.cross_score(0)
    # Pane A's branch scored under every other step: "which step would have said this?"
    qtbot.waitUntil(lambda: set(runs[0].cross_scores) >= {"B", "C", "D"}, timeout=WAIT)
    assert all("error" not in score for score in runs[0].cross_scores.values())
    # The agreement matrix: each step drafting for each other's branch after the fork point.
    win.compare_view.show_agreement()
    dialog = win.compare_view.agreement
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: all(v is not None for row in compare.agreement() for v in row), timeout=WAIT)
    matrix = compare.agreement()
    assert all(matrix[k][k] >= 0.95 for k in range(4))  # greedy replies: a checkpoint agrees with itself
    assert dialog.cell(0, 0).endswith("%") and dialog.cell(3, 0) == f"{100 * matrix[3][0]:.0f}%"
    # A pane's own token popup races a fork of that pane's reply on every pane.
    pane = win.compare_view.panes[1]
    j = i + 1
    click_token(qtbot, pane.view, j)
    assert pane.popup is not None and not pane.popup.race.isVisible()
    candidates = [b for b in pane.popup.buttons if b.isEnabled()]
    if candidates:
        with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
            candidates[0].click()
        assert all(p.run.trace.given[j] for p in compare.panes)
