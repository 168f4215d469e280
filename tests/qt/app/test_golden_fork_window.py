"""A checkpoint of the C++ fork with its own tokenizer.json (written by the fork's own code, see
tests/engine/nanochat/test_golden_fork.py) through the real window: start the app on the case's
base dir, load the SFT step, type the task, and the greedy completion is the fork's own, token for
token, up to the ``<EOS>`` where the window stops; a restart shows it again from history.

(The fork's tokenizer.pkl variants go through the window in test_golden_window.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support.golden import GOLDEN, manifest
from support.window import click_row, open_window, restart

pytestmark = pytest.mark.gui
WAIT = 60000
CPP = sorted(p.parent for p in (GOLDEN / "fork").glob("cpp/*/golden.json"))


def reply_ids(win) -> list[int]:
    return list(win.chat.widgets[-1].message.tokens.ids)


def until_stop(ids: list[int], stops: list[int]) -> list[int]:
    ends = [i for i, t in enumerate(ids) if t in stops]
    return ids[: ends[0] + 1] if ends else ids


def test_there_is_a_tokenizer_json_case():
    assert CPP


@pytest.mark.parametrize("case", CPP, ids=[c.name for c in CPP])
def test_the_window_completes_as_the_fork_does_with_its_tokenizer_json(
    qtbot,
    windows,
    loop,
    monkeypatch,
    case: Path,
):
    m = manifest(case)
    c = m["cases"][0]
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(case))
    win = open_window(qtbot, fake=False)
    windows.append(win)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
        win.controller.load_checkpoint(case / "chatsft_checkpoints" / m["tag"], m["step"])
    info = loaded.args[0]
    assert info.family == "nanochat-fork" and info.tokenizer_kind == "cpp" and not info.capabilities.chat
    win.sampling.apply_preset("Greedy")
    win.sampling.set_values({"max_tokens": 40})
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        win.input.editor.setPlainText(c["text"])
        qtbot.keyClick(win.input.editor, Qt.Key.Key_Return)
    got = reply_ids(win)
    assert got == until_stop(c["naive_greedy"], c["stop_ids"])
    assert got[-1] in c["stop_ids"]  # ended at <EOS>, well before max_tokens
    conv_id = win.controller.conv_id

    win = restart(qtbot, windows, fake=False)
    win.controller.refresh_list()
    click_row(qtbot, win, conv_id)
    qtbot.waitUntil(lambda: bool(win.chat.widgets) and reply_ids(win) == got, timeout=WAIT)
