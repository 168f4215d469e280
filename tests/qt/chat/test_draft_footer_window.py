"""Footers say what speculative decoding did (issue #40), through the real window on the bundled
demo: a reply whose int8 copy measured no faster than the model (as on a CPU without int8
products: the draft's measured cost is set, not timed) decodes plainly and says so, with no
"speculative"; one drafted by the demo's smaller depth says how much was kept; one with
speculative decoding off says nothing of it. In Compare every pane says the same, and the pane
whose checkpoint drafts for the others says it decoded plainly. A restart and the history
bring back the same footers.
"""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import Qt
from support.window import WAIT, click_row, restart, send, start_with_base
from test_fork_window import DEMO_BASE, last
from test_speculative_window import OTHER_TOKENIZER, reopen_comparison

from desktop.config import settings
from desktop.engine.decode import speculative
from desktop.qt.compare.controller import CompareController
from desktop.qt.compare.view import CompareView

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]
NOT_FASTER = "int8 copy not faster on this CPU: drafted nothing"
DRAFTED = re.compile(r"speculative \(.+\) · \d+% of \d+ drafted kept")


@pytest.fixture
def int8_not_faster(monkeypatch) -> None:
    """The int8 copy's step measures as costly as the model's: no draft length can pay."""
    measured = speculative.measure_costs

    def as_costly(target, target_cache, draft) -> None:
        measured(target, target_cache, draft)
        if draft.name == "self (int8)":
            draft.cost = 1.0

    monkeypatch.setattr(speculative, "measure_costs", as_costly)


def test_chat_footers_say_what_the_draft_did_and_say_it_again_from_history(
    qtbot, windows, loop, monkeypatch, int8_not_faster
):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    box = win.sampling.speculative
    win.sampling.set_values({**win.sampling.values(), "temperature": 0.8, "max_tokens": 24})

    # The int8 copy, adaptive: it cannot pay, so nothing is drafted and the footer says why.
    box.draft.setCurrentIndex(box.draft.findData("int8"))
    assert win.settings.get("draft_k") == 0
    stats = send(qtbot, win, "What is 12 times 7?")
    reply = win.controller.path[-1][1]
    assert stats["drafted"] == 0 and not any(reply.tokens.drafts)
    assert reply.meta["draft"] == "int8" and reply.meta["stats"]["draft_skipped"] == NOT_FASTER
    footer = last(win).footer
    assert NOT_FASTER in footer.text() and "speculative" not in footer.text()
    assert "Nanoscope's own speculative stream" not in footer.toolTip()

    # The demo's smaller depth at a fixed length drafts: the footer says how much it kept.
    d2 = next(box.draft.itemData(i) for i in range(box.draft.count()) if "demo-d2" in box.draft.itemText(i))
    box.draft.setCurrentIndex(box.draft.findData(d2))
    box.k.setValue(3)
    stats = send(qtbot, win, "How many r are in strawberry?")
    assert stats["drafted"] > 0 and not stats["draft_skipped"]
    kept = DRAFTED.search(last(win).footer.text())
    assert kept is not None and f"of {stats['drafted']} drafted kept" in kept.group()

    # Off: the footer says nothing of drafts.
    box.draft.setCurrentIndex(box.draft.findData(""))
    send(qtbot, win, "Tell me about the sea.")
    assert not re.search("speculative|draft", last(win).footer.text())

    footers = [w.footer.text() for w in win.chat.widgets]
    conv = win.controller.conv_id
    win = restart(qtbot, windows, fake=False)
    win.controller.refresh_list()
    click_row(qtbot, win, conv)
    assert [w.footer.text() for w in win.chat.widgets] == footers
    assert sum(NOT_FASTER in f for f in footers) == 1 and sum(bool(DRAFTED.search(f)) for f in footers) == 1


def test_a_draft_the_model_cannot_use_is_named_in_the_footer_not_called_speculative(
    qtbot, windows, loop, monkeypatch
):
    """A draft named in the settings (or on the command line) whose tokenizer is another: the
    reply fails, and its footer says which draft and why, not that it was speculative."""
    monkeypatch.setitem(settings.DEFAULTS, "draft", str(OTHER_TOKENIZER))
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    assert win.sampling.speculative.value()[0] == str(OTHER_TOKENIZER)
    send(qtbot, win, "What is 12 times 7?")
    reply = win.controller.path[-1][1]
    assert reply.meta["draft"] == str(OTHER_TOKENIZER) and "tokenizer" in reply.meta["error"]
    footer = last(win).footer.text()
    assert footer.startswith(f"⚠ draft {OTHER_TOKENIZER}: its tokenizer") and "differs" in footer
    assert "speculative" not in footer


def ask(qtbot, view: CompareView, compare: CompareController, text: str) -> None:
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        view.input.editor.setPlainText(text)
        qtbot.keyClick(view.input.editor, Qt.Key.Key_Return)


def test_every_compare_pane_says_what_its_draft_did_and_says_it_again_reopened(
    qtbot, windows, loop, monkeypatch, int8_not_faster
):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    box = win.sampling.speculative
    box.draft.setCurrentIndex(box.draft.findData("int8"))
    view, compare = win.compare_view, win.compare
    win.tabs.setCurrentWidget(view)
    for pane in view.panes:
        with qtbot.waitSignal(compare.pane_loaded, timeout=WAIT):
            qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)
    view.max_tokens.setValue(16)

    # Every pane's int8 copy cannot pay: each decodes plainly and says why.
    assert view.speed.currentData() == "int8"
    ask(qtbot, view, compare, "What is 12 times 7?")
    for pane, shown in zip(compare.panes, view.panes, strict=True):
        assert pane.run.stats["drafted"] == 0 and pane.run.stats["draft_skipped"] == NOT_FASTER
        assert NOT_FASTER in shown.stats.text() and "speculative" not in shown.stats.text()
        assert not shown.stats.toolTip()
    with qtbot.waitSignal(compare.saved, timeout=WAIT) as saved:
        qtbot.mouseClick(view.save_btn, Qt.MouseButton.LeftButton)
    skipped = [shown.stats.text() for shown in view.panes]

    # Pane A's checkpoint drafts for B at a fixed length: A says why it decoded plainly, B drafts.
    box.k.setValue(3)
    view.speed.setCurrentIndex(
        next(i for i in range(view.speed.count()) if view.speed.itemText(i).startswith("Pane A's checkpoint"))
    )
    ask(qtbot, view, compare, "How many r are in strawberry?")
    a, b = (shown.stats.text() for shown in view.panes)
    assert "decoded plainly: it is the draft" in a and "speculative" not in a
    assert compare.panes[1].run.stats["drafted"] > 0 and DRAFTED.search(b)
    with qtbot.waitSignal(compare.saved, timeout=WAIT) as saved_drafted:
        qtbot.mouseClick(view.save_btn, Qt.MouseButton.LeftButton)
    drafted = [shown.stats.text() for shown in view.panes]

    # Restart and reopen both comparisons: every pane's footer comes back the same.
    view, compare = reopen_comparison(qtbot, windows, saved.args[0])
    assert [shown.stats.text() for shown in view.panes] == skipped
    win = windows[-1]
    win.controller.refresh_list()
    click_row(qtbot, win, saved_drafted.args[0])
    assert [shown.stats.text() for shown in view.panes] == drafted
