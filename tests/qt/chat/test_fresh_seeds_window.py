"""Every reply without a locked seed gets a fresh seed (issue #40), through the real window on the
bundled demo: sends, regenerations (Ctrl+R), edits resent, forks at a token, new chats, and forks
raced in Compare, 200 requests in all, each on a seed no other used; each chat reply's footer
shows its seed (a race's panes share theirs, shown in Compare's sampling row: the same seed is
what makes their draws comparable), and every reply is saved with it: after a restart the
history holds the same seeds.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter

import pytest
from PySide6.QtCore import Qt
from support.window import WAIT, action, regenerate, restart, send, start_with_base
from test_fork_window import DEMO_BASE, click_token, last

from desktop.qt.app.main_window import MainWindow

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]
ROUNDS = 45  # each: a send, a regeneration, an edit resent, a fork: 180 chat replies
RACES = 20  # one every other round: 200 requests in all
NEW_CHAT_EVERY = 5


def shown_seed(win: MainWindow) -> int:
    """The last reply's seed, as its footer shows it."""
    seed = win.controller.path[-1][1].meta["sampling"]["seed"]
    assert f"seed {seed}" in last(win).footer.text()
    return int(seed)


def edit_and_resend(qtbot, win: MainWindow, text: str) -> None:
    asked = win.chat.widgets[-2]
    qtbot.mouseClick(asked.edit_btn, Qt.MouseButton.LeftButton)
    assert asked.edit_box is not None
    asked.edit_box.editor.setPlainText(text)
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        qtbot.mouseClick(asked.edit_box.save_btn, Qt.MouseButton.LeftButton)


def fork_at(qtbot, win: MainWindow, position: int, race: bool = False) -> None:
    """Click the last reply's token at ``position`` and take an alternative (raced in Compare, or
    here)."""
    # A click elsewhere first: two clicks on one spot in a row would be a double click.
    qtbot.mouseClick(win.input.editor, Qt.MouseButton.LeftButton)
    before = last(win).popup
    click_token(qtbot, last(win).raw_view, position)
    popup = last(win).popup
    assert popup is not None and popup is not before
    other = next(b for b in popup.buttons[1:] if b.isEnabled())
    if not race:
        with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
            other.click()
        return
    assert popup.race.isVisible()
    popup.race.setChecked(True)
    compare = win.compare_view.controller
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        other.click()


def test_two_hundred_unlocked_requests_draw_two_hundred_seeds_shown_and_saved(
    qtbot, windows, loop, monkeypatch
):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    win.sampling.set_values(
        {**win.sampling.values(), "temperature": 0.9, "max_tokens": 3, "seed_locked": False}
    )
    action(win, "Raw tokens").trigger()  # the fork popup opens on a raw token
    chat: list[int] = []
    races: list[int] = []
    for r in range(ROUNDS):
        if r and r % NEW_CHAT_EVERY == 0:
            action(win, "New chat").trigger()
            assert not win.controller.path
        send(qtbot, win, f"Tell me about the sea, part {r}.")
        chat.append(shown_seed(win))
        regenerate(qtbot, win)
        chat.append(shown_seed(win))
        edit_and_resend(qtbot, win, f"Tell me about the ships, part {r}.")
        chat.append(shown_seed(win))
        fork_at(qtbot, win, 0)
        chat.append(shown_seed(win))
        if r % 2 == 0 and len(races) < RACES:
            fork_at(qtbot, win, 1, race=True)  # after the fork's own token
            view, compare = win.compare_view, win.compare
            raced = [p.run for p in compare.panes if p.run.has_reply and p.run.params]
            seeds = {run.params.seed for run in raced if run.params}
            assert len(raced) > 1 and all(run.reply.meta["fork"]["at"] == 1 for run in raced)
            assert len(seeds) == 1 and view.seed.value() in seeds  # the race's one seed, shown
            races.append(view.seed.value())
            with qtbot.waitSignal(compare.saved, timeout=WAIT):
                qtbot.mouseClick(view.save_btn, Qt.MouseButton.LeftButton)
            win.tabs.setCurrentIndex(0)
    assert len(chat) == 4 * ROUNDS and len(races) == RACES
    assert len(set(chat) | set(races)) == len(chat) + len(races) == 200

    # After a restart, the history holds every reply with the seed it was shown with.
    win = restart(qtbot, windows, fake=False)
    with sqlite3.connect(f"file:{win.controller.store.path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT c.kind, m.meta FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            "WHERE m.role = 'assistant'"
        ).fetchall()
    saved: dict[str, Counter[int]] = {"chat": Counter(), "compare": Counter()}
    for kind, meta in rows:
        saved[kind][json.loads(meta)["sampling"]["seed"]] += 1
    assert saved["chat"] == Counter(chat)  # every chat reply, once, with its own seed
    assert set(saved["compare"]) == set(races)  # every raced pane, with its race's seed
