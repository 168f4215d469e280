"""Every era's golden checkpoint (written by nanochat's own code) through the real window: start
the app on the case's base dir, load the SFT step, type the question, and the greedy reply is
nanochat's own, token for token, calculator call included; a restart shows it again from history.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support.golden import CASES, PYTHON_END, against_engine, until_the_tool
from support.window import click_row, open_window, restart

pytestmark = pytest.mark.gui
WAIT = 60000


def reply_ids(win) -> list[int]:
    return list(win.chat.widgets[-1].message.tokens.ids)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_window_answers_as_nanochat_does(qtbot, windows, loop, monkeypatch, case: Path):
    m = json.loads((case / "golden.json").read_text(encoding="utf-8"))
    c = m["cases"][0]  # the arithmetic question: the model calls the calculator
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(case))
    win = open_window(qtbot, fake=False)
    windows.append(win)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        win.controller.load_checkpoint(case / "chatsft_checkpoints" / m["tag"], m["step"])
    win.sampling.apply_preset("Greedy")
    win.sampling.set_values({"max_tokens": 40})
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        win.input.editor.setPlainText(c["text"])
        qtbot.keyClick(win.input.editor, Qt.Key.Key_Return)
    got = reply_ids(win)
    conv_id = win.controller.conv_id
    if m["load_options"]:  # E5: the window cannot know the softcap and says so
        assert "softcap" in win.banner.message.text()
        return
    want = c["engine_greedy"] if against_engine(m) else c["naive_greedy"]
    if against_engine(m):
        assert got == want
        assert [int(f) for f in win.chat.widgets[-1].message.tokens.forced] == c["engine_greedy_forced"]
    else:
        assert until_the_tool(got, PYTHON_END) == until_the_tool(want, PYTHON_END)

    win = restart(qtbot, windows, fake=False)
    win.controller.refresh_list()
    click_row(qtbot, win, conv_id)
    qtbot.waitUntil(lambda: bool(win.chat.widgets) and reply_ids(win) == got, timeout=WAIT)
