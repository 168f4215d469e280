"""Settings › Re-measure kernels, through the real window: the kept kernel choices go, the chat's
model loads again and times its products, and its load says the choices were made anew (what the
first reply's footer builds on)."""

from __future__ import annotations

import pytest
from support.window import WAIT, action, send, start_with_base

from desktop.qt.chat.message_footer import RENEWED

pytestmark = pytest.mark.gui


def test_re_measure_forgets_the_kept_choices_and_reloads_the_model(
    qtbot, windows, monkeypatch, nanochat_base
):
    win = start_with_base(qtbot, windows, monkeypatch, nanochat_base, fake=False)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as fast:
        win.picker.precision_changed.emit("fast")  # the user picks "Fast · 16-bit"
    assert fast.args[0].precision != "float32" and not fast.args[0].choices_renewed  # chosen the first time

    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as reloaded:
        action(win, "Re-measure kernels").trigger()
    info = reloaded.args[0]
    assert (info.path, info.step) == (fast.args[0].path, fast.args[0].step)
    assert info.choices_renewed  # the products were timed again, and the app knows it
    qtbot.waitUntil(lambda: not win.banner.isHidden() and win.banner.title.text() == "Re-measure kernels")

    # The first reply after it says its numbers may differ from older ones; the next does not.
    assert send(qtbot, win, "hello")["choices_renewed"]
    assert RENEWED in win.chat.widgets[-1].footer.text()
    assert not send(qtbot, win, "and again")["choices_renewed"]
    assert RENEWED not in win.chat.widgets[-1].footer.text()
