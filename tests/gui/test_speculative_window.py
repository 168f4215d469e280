"""Chat with speculative decoding on, through the real window (issue #22): the Parameters
panel's speed section picks the demo's own int8 copy as the draft; a reply streams with every
token marked kept or corrected, the footer says speculative decoding was on and how much of the
draft was kept, Stop ends a reply mid-stream, a regeneration drafts again, and View › Draft
colours paints kept and corrected tokens apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from test_fork_window import DEMO_BASE, last
from test_window_sequences import WAIT, action, loop, send, start_with_base, windows  # noqa: F401

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]


def test_chat_streams_stops_and_regenerates_with_a_draft_and_colours_it(qtbot, windows, loop, monkeypatch):  # noqa: F811
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    box = win.sampling.speculative
    box.draft.setCurrentIndex(box.draft.findData("int8"))
    # A fixed draft length: on a model this small, the adaptive one finds drafting not worth it.
    box.k.setValue(3)
    assert (win.settings.get("draft"), win.settings.get("draft_k")) == ("int8", 3)
    win.sampling.set_values({**win.sampling.values(), "temperature": 0.8, "max_tokens": 48})

    send(qtbot, win, "What is 12 times 7? Tell me about the sea.")
    reply = win.controller.path[-1][1]
    stats = reply.meta["stats"]
    assert reply.meta["draft"] == "int8" and stats["drafted"] > 0
    marks = set(reply.tokens.drafts)
    assert "accepted" in marks and marks <= {"accepted", "corrected", ""}
    assert stats["accepted"] == reply.tokens.drafts.count("accepted")
    footer = last(win).footer
    assert "speculative (int8)" in footer.text() and "drafted kept" in footer.text()
    assert "Nanoscope's own speculative stream" in footer.toolTip()

    # Draft colours: kept tokens and corrections are painted apart, on the raw token view.
    action(win, "Draft colours").trigger()
    view = last(win).raw_view
    assert view.isVisible() and view.drafts_shown and not view.overlay
    kept = reply.tokens.drafts.index("accepted")
    plain = next(
        (i for i, d in enumerate(reply.tokens.drafts) if d != "accepted" and not reply.tokens.forced[i]), None
    )
    if plain is not None:
        assert view.background(kept) != view.background(plain)

    # Stop mid-reply: the reply keeps what streamed, marked as stopped.
    win.sampling.set_values({**win.sampling.values(), "max_tokens": 400})
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT) as done:
        win.input.editor.setPlainText("Tell me a long story about the sea and the ships.")
        qtbot.keyClick(win.input.editor, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: len(win.controller._reply.tokens) >= 3, timeout=WAIT)
        action(win, "Stop generating").trigger()
    assert done.args[0]["stopped"] == "cancelled"
    stopped = win.controller.path[-1][1]
    assert 3 <= len(stopped.tokens) < 400 and stopped.meta["draft"] == "int8"

    # Regenerate: a second version, drafted again.
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
        action(win, "Regenerate last reply").trigger()
    again = win.controller.path[-1][1]
    assert last(win).branch_label.text() == "2 / 2"
    assert again.meta["draft"] == "int8" and again.meta["stats"]["drafted"] > 0
    assert Path(win.controller.model_info.path).name == "demo"
