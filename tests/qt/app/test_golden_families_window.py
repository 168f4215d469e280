"""The golden files of the other families through the real window, as a user opens them (File ›
Open folder…).

* KempnerForge (saved by its own CheckpointManager): the latest step loads and the greedy reply to
  a prompt is KempnerForge's own ``generate()``, token for token; the earlier step, picked and
  loaded, answers as that step did; after a restart the first chat shows the same reply.
* transformers (``save_pretrained``): each folder loads, and the greedy reply to a chat is
  ``generate()``'s on the prompt its chat template renders; a restart shows it again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support.golden import GOLDEN, manifest
from support.window import click_row, open_folder, open_window, restart

pytestmark = pytest.mark.gui
WAIT = 60000
KF = sorted(p.parent for p in (GOLDEN / "kempnerforge").glob("*/golden.json"))
HF = sorted(p.parent for p in (GOLDEN / "transformers").glob("*/golden.json"))


def reply_ids(win) -> list[int]:
    return list(win.chat.widgets[-1].message.tokens.ids)


def ask(qtbot, win, text: str) -> list[int]:
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        win.input.editor.setPlainText(text)
        qtbot.keyClick(win.input.editor, Qt.Key.Key_Return)
    return reply_ids(win)


def open_greedy(qtbot, windows, monkeypatch, folder: Path, max_tokens: int):
    """A new window; File › Open folder… on ``folder``; the Greedy preset. The loaded model's info."""
    win = open_window(qtbot, fake=False)
    windows.append(win)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
        open_folder(qtbot, win, folder, monkeypatch)
    win.sampling.apply_preset("Greedy")
    win.sampling.set_values({"max_tokens": max_tokens})
    return win, loaded.args[0]


def reopened_shows(qtbot, windows, conv_id: int, ids: list[int]) -> None:
    """After a restart, the chat clicked in the list shows the same reply."""
    win = restart(qtbot, windows, fake=False)
    win.controller.refresh_list()
    click_row(qtbot, win, conv_id)
    qtbot.waitUntil(lambda: bool(win.chat.widgets) and reply_ids(win) == ids, timeout=WAIT)


@pytest.mark.parametrize("case", KF, ids=[c.name for c in KF])
def test_the_window_answers_as_kempnerforge_does_at_each_step(
    qtbot,
    windows,
    loop,
    monkeypatch,
    case: Path,
):
    m = manifest(case)
    run = case / "run"
    win, info = open_greedy(qtbot, windows, monkeypatch, run, m["max_new_tokens"])
    assert info.step == m["latest"] and info.family == "kempnerforge"
    latest = m["expected"][str(m["latest"])][0]
    assert ask(qtbot, win, latest["text"]) == latest["greedy"]
    conv_id = win.controller.conv_id

    first = m["steps"][0]
    qtbot.waitUntil(lambda: any(Path(e.path) == run for e in win.picker.entries), timeout=WAIT)
    assert next(e for e in win.picker.entries if Path(e.path) == run).steps == m["steps"]
    win.picker.select(run, first)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
        qtbot.mouseClick(win.picker.load_btn, Qt.MouseButton.LeftButton)
    assert loaded.args[0].step == first
    win.controller.new_chat()
    earlier = m["expected"][str(first)][0]
    assert ask(qtbot, win, earlier["text"]) == earlier["greedy"]

    reopened_shows(qtbot, windows, conv_id, latest["greedy"])


@pytest.mark.parametrize("case", HF, ids=[c.name for c in HF])
def test_the_window_answers_as_transformers_does(
    qtbot,
    windows,
    loop,
    monkeypatch,
    case: Path,
):
    m = manifest(case)
    win, info = open_greedy(qtbot, windows, monkeypatch, case, m["max_new_tokens"])
    assert info.family.startswith("hf") and Path(info.path) == case
    chat = next(c for c in m["expected"] if c["chat"])
    assert ask(qtbot, win, chat["text"]) == chat["greedy"]
    conv_id = win.controller.conv_id

    reopened_shows(qtbot, windows, conv_id, chat["greedy"])
