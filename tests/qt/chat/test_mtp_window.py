"""The fork's MTP head as a draft, through the real window (issue #22): with a checkpoint that has
the head, the Parameters panel's speed section offers it, and with one without, it does not; a
reply drafted by it is the plain greedy one and says how much was kept. Kept as the choice when a
checkpoint without the head is loaded, it fails the reply with one line naming the checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support.golden import GOLDEN, manifest
from support.window import WAIT, banner_says, open_folder, regenerate, send, start_with_base

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]
CASE = GOLDEN / "fork" / "engram-mhc-mtp-swiglu"
HEADLESS = GOLDEN / "fork" / "engram"


def reply_ids(win) -> list[int]:
    return list(win.controller.path[-1][1].tokens.ids)


def test_the_speed_section_offers_the_mtp_head_only_where_the_checkpoint_has_one(
    qtbot,
    windows,
    loop,
    monkeypatch,
    tmp_path,
):
    win = start_with_base(qtbot, windows, monkeypatch, HEADLESS, fake=False)
    box = win.sampling.speculative
    assert not win.controller.model_info.capabilities.draft_head and box.draft.findData("mtp") < 0
    headless = Path(win.controller.model_info.path)

    m = manifest(CASE)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        open_folder(qtbot, win, CASE / "chatsft_checkpoints" / m["tag"], monkeypatch)
    assert win.controller.model_info.capabilities.draft_head
    at = box.draft.findData("mtp")
    assert at >= 0 and "MTP head" in box.draft.itemText(at)
    box.grab().save(str(tmp_path / "speed-box-mtp.png"))

    win.sampling.set_values({**win.sampling.values(), "temperature": 0.0, "max_tokens": 24})
    send(qtbot, win, "What is 12 plus 7?")
    plain = reply_ids(win)
    box.draft.setCurrentIndex(at)
    box.k.setValue(1)  # on a model this small the adaptive length finds drafting not worth it
    assert (win.settings.get("draft"), win.settings.get("draft_k")) == ("mtp", 1)
    regenerate(qtbot, win)  # the same prompt, the head drafting
    reply = win.controller.path[-1][1]
    assert reply_ids(win) == plain and reply.meta["draft"] == "mtp"
    assert reply.meta["stats"]["drafted"] > 0 and "accepted" in reply.tokens.drafts

    # Back to the checkpoint without the head, the choice kept: the reply fails with one line.
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        open_folder(qtbot, win, headless, monkeypatch)
    assert box.draft.itemText(box.draft.findData("mtp")) == "mtp"  # kept as named, not offered
    with qtbot.waitSignal(win.controller.notice, timeout=WAIT) as notice:
        win.input.editor.setPlainText("What is 12 plus 7?")
        qtbot.keyClick(win.input.editor, Qt.Key.Key_Return)
    level, title, reason = notice.args
    assert (level, title) == ("error", "Generation failed") and banner_says(win, "Generation failed")
    assert "draft mtp: " in reason and "has no multi-token-prediction head" in reason and "\n" not in reason
