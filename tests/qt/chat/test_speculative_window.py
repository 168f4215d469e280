"""Chat and Compare with speculative decoding on, through the real window (issue #22): the Parameters
panel's speed section picks the demo's own int8 copy as the draft; a reply streams with every
token marked kept or corrected, the footer says speculative decoding was on and how much of the
draft was kept, Stop ends a reply mid-stream, a regeneration drafts again, and View › Draft
colours paints kept and corrected tokens apart. In Compare, every pane drafts with its own copy,
colours, stops, and its marks and footer come back from history; switched off, panes decode
plainly. One pane's checkpoint drafts for the others: a pane of another tokenizer says so in one
line while the rest answer to the end.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support.window import WAIT, action, click_row, open_folder, restart, send, start_with_base
from test_fork_window import DEMO_BASE, last

from desktop.config import settings
from desktop.engine.decode.compiled_draft import why_not_compiled
from desktop.qt.compare.controller import CompareController
from desktop.qt.compare.pane_view import ComparePane
from desktop.qt.compare.view import CompareView

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]
DEMO_RUN = DEMO_BASE / "chatsft_checkpoints" / "demo"
# A nanochat chat checkpoint the tool's own code wrote, with its own 300-token tokenizer.
OTHER_TOKENIZER = (
    Path(__file__).resolve().parents[2] / "golden" / "nanochat" / "E7" / "chatsft_checkpoints" / "d2"
)


def reopen_comparison(qtbot, open_windows, conv_id: int) -> tuple[CompareView, CompareController]:
    """Restart the app and open the saved comparison ``conv_id`` from the history list."""
    win = restart(qtbot, open_windows, fake=False)
    with qtbot.waitSignal(win.background.checkpoints_found, timeout=WAIT):
        win.background.scan()
    win.controller.refresh_list()
    click_row(qtbot, win, conv_id)
    assert win.tabs.currentWidget() is win.compare_view
    return win.compare_view, win.compare


def test_chat_streams_stops_and_regenerates_with_a_draft_and_colours_it(qtbot, windows, loop, monkeypatch):
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
        qtbot.waitUntil(lambda: len(win.controller.session.reply.tokens) >= 3, timeout=WAIT)
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


def test_compare_panes_draft_colour_stop_reopen_then_decode_plainly(qtbot, windows, loop, monkeypatch):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    box = win.sampling.speculative
    box.draft.setCurrentIndex(box.draft.findData("int8"))
    box.k.setValue(3)  # Compare's draft length is Chat's
    view, compare = win.compare_view, win.compare
    win.tabs.setCurrentWidget(view)
    assert view.speed.currentData() == "int8"  # Compare starts from Chat's choice
    for pane in view.panes:
        with qtbot.waitSignal(compare.pane_loaded, timeout=WAIT):
            qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)
    view.temperature.setValue(0.8)
    view.max_tokens.setValue(40)
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        view.input.editor.setPlainText("What is 12 times 7? Tell me about the sea.")
        qtbot.keyClick(view.input.editor, Qt.Key.Key_Return)
    for pane, shown in zip(compare.panes, view.panes, strict=True):
        run = pane.run
        assert run.stats["drafted"] > 0 and run.stats["accepted"] == run.trace.drafts.count("accepted")
        assert "accepted" in run.trace.drafts
        assert "speculative (int8)" in shown.stats.text() and "drafted kept" in shown.stats.text()
        assert "Nanoscope's own speculative stream" in shown.stats.toolTip()

    # View › Draft colours paints every pane's kept drafts apart from the rest.
    action(win, "Draft colours").trigger()
    shown = view.panes[0]
    drafts = compare.panes[0].run.trace.drafts
    assert shown.view.drafts_shown
    plain = next((i for i, d in enumerate(drafts) if d != "accepted"), None)
    if plain is not None:
        assert shown.view.background(drafts.index("accepted")) != shown.view.background(plain)

    # Stop mid-stream: every pane keeps what it drafted and says it stopped.
    view.max_tokens.setValue(400)
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        view.input.editor.setPlainText("Tell me a long story about the sea and the ships.")
        qtbot.keyClick(view.input.editor, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: all(len(p.run.trace) >= 3 for p in compare.panes), timeout=WAIT)
        qtbot.mouseClick(view.input.stop_btn, Qt.MouseButton.LeftButton)
    stopped = [p.run for p in compare.panes]
    assert all(r.stats["stopped"] == "cancelled" and r.stats["draft"] == "int8" for r in stopped)
    with qtbot.waitSignal(compare.saved, timeout=WAIT) as saved:
        qtbot.mouseClick(view.save_btn, Qt.MouseButton.LeftButton)

    # Restart and reopen: the marks and the footers come back from history.
    view, compare = reopen_comparison(qtbot, windows, saved.args[0])
    for run, shown, before in zip((p.run for p in compare.panes), view.panes, stopped, strict=True):
        assert run.trace.drafts == before.trace.drafts
        assert "speculative (int8)" in shown.stats.text() and "stopped" in shown.stats.text()

    # Speculative off: the next comparison decodes plainly, with nothing marked.
    view.speed.setCurrentIndex(view.speed.findData(""))
    for i, pane in enumerate(view.panes):  # a reopened comparison's panes load on demand
        if compare.panes[i].info is None:
            with qtbot.waitSignal(compare.pane_loaded, timeout=WAIT):
                qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)
    view.max_tokens.setValue(12)
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        view.input.editor.setPlainText("What is 12 times 7?")
        qtbot.keyClick(view.input.editor, Qt.Key.Key_Return)
    for pane, shown in zip(compare.panes, view.panes, strict=True):
        assert not any(pane.run.trace.drafts) and "draft" not in pane.run.stats
        assert "speculative" not in shown.stats.text() and not shown.stats.toolTip()


def test_the_demo_miniseries_smaller_depth_is_offered_and_drafts_for_it(qtbot, windows, loop, monkeypatch):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    box = win.sampling.speculative
    offered = {box.draft.itemText(i): box.draft.itemData(i) for i in range(box.draft.count())}
    d2 = next(spec for label, spec in offered.items() if "demo-d2" in label)
    assert any("of this run" in label for label in offered)  # the run's other steps, too
    box.draft.setCurrentIndex(box.draft.findData(d2))
    box.k.setValue(3)
    win.sampling.set_values({**win.sampling.values(), "temperature": 0.0, "max_tokens": 32})
    send(qtbot, win, "How many r are in strawberry?")
    reply = win.controller.path[-1][1]
    stats = reply.meta["stats"]
    assert reply.meta["draft"] == d2 and stats["drafted"] > 0 and stats["accepted"] > 0
    footer = last(win).footer
    assert f"speculative ({Path(d2).name})" in footer.text()
    assert f"draft: {d2}" in footer.toolTip()


def pick(qtbot, compare: CompareController, pane: ComparePane, path: Path, step: int) -> None:
    """The user picks a checkpoint and a step in a pane's two lists and presses Load."""
    pane.checkpoint.setCurrentIndex(pane.checkpoint.findData(str(path)))
    pane.step.setCurrentIndex(pane.step.findData(step))
    with qtbot.waitSignal(compare.pane_loaded, timeout=WAIT):
        qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)


def ask(qtbot, view, compare: CompareController, text: str) -> None:
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        view.input.editor.setPlainText(text)
        qtbot.keyClick(view.input.editor, Qt.Key.Key_Return)


def test_a_pane_drafts_for_the_others_one_of_another_tokenizer_fails_alone_then_all_answer_plainly(
    qtbot,
    windows,
    loop,
    monkeypatch,
):
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        open_folder(qtbot, win, OTHER_TOKENIZER, monkeypatch)  # listed for the panes, too
    win.sampling.speculative.k.setValue(3)  # Compare's draft length is Chat's
    view, compare = win.compare_view, win.compare
    win.tabs.setCurrentWidget(view)
    assert view.speed.currentText() == "Off"
    qtbot.mouseClick(view.add_btn, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.panes[2].checkpoint.findData(str(OTHER_TOKENIZER)) >= 0, timeout=WAIT)
    picks = ((DEMO_RUN, 300), (DEMO_RUN, 1000), (OTHER_TOKENIZER, 20))
    for pane, (path, step) in zip(view.panes, picks, strict=True):
        pick(qtbot, compare, pane, path, step)

    # Pane A's checkpoint drafts for B and C; C's tokenizer is another, so C says so, and B runs on.
    view.speed.setCurrentIndex(view.speed.findText("Pane A's checkpoint (demo@300)"))
    view.temperature.setValue(0.8)
    view.max_tokens.setValue(40)
    ask(qtbot, view, compare, "What is 12 times 7? Tell me about the sea.")
    a, b, c = (p.run for p in compare.panes)
    assert a.trace.ids and not a.error and "draft" not in a.stats and not any(a.trace.drafts)
    assert not b.error and b.stats["draft"] == f"{DEMO_RUN}@300" and b.stats["drafted"] > 0
    assert b.stats["new_tokens"] == len(b.trace) and b.stats["stopped"] != "cancelled"
    footer = view.panes[1].stats.text()
    assert "tok/s" in footer and "speculative (demo@300)" in footer and "drafted kept" in footer
    line = view.panes[2].stats.text()
    assert c.error and line.startswith("⚠") and "\n" not in line
    assert "demo@300" in line and "tokenizer" in line and "Traceback" not in line
    assert "speculative" not in view.panes[0].stats.text()
    with qtbot.waitSignal(compare.saved, timeout=WAIT) as saved:
        qtbot.mouseClick(view.save_btn, Qt.MouseButton.LeftButton)

    # Speculative off: every pane answers plainly, pane C too.
    view.speed.setCurrentIndex(view.speed.findData(""))
    ask(qtbot, view, compare, "What is 12 times 7?")
    for run, shown in zip((p.run for p in compare.panes), view.panes, strict=True):
        assert run.trace.ids and not run.error and "draft" not in run.stats and not any(run.trace.drafts)
        assert "tok/s" in shown.stats.text() and "speculative" not in shown.stats.text()

    # Restart and reopen the drafted comparison: pane B's footer comes back from history.
    view, compare = reopen_comparison(qtbot, windows, saved.args[0])
    reopened = view.panes[1].stats.text()
    assert compare.panes[1].run.stats["draft"] == f"{DEMO_RUN}@300"
    assert "speculative (demo@300)" in reopened and "drafted kept" in reopened


@pytest.mark.skipif(why_not_compiled() is not None, reason=str(why_not_compiled()))
def test_a_compiled_draft_is_taken_up_between_replies_and_quitting_mid_compile_ends_it(
    qtbot,
    windows,
    loop,
    monkeypatch,
):
    """With the app's default (compile drafts), picking the demo's smaller depth starts its
    compile on a thread of its own; replies go on meanwhile with the eager draft, the reply after
    the compile times both forms, and the footer says which drafted. Picking the draft again and
    restarting while it compiles neither hangs nor leaves the compile running."""
    monkeypatch.setitem(settings.DEFAULTS, "compile_drafts", True)
    win = start_with_base(qtbot, windows, monkeypatch, DEMO_BASE, fake=False)
    box = win.sampling.speculative
    d2 = next(box.draft.itemData(i) for i in range(box.draft.count()) if "demo-d2" in box.draft.itemText(i))
    box.draft.setCurrentIndex(box.draft.findData(d2))
    box.k.setValue(3)
    win.sampling.set_values({**win.sampling.values(), "temperature": 0.0, "max_tokens": 24})
    first = send(qtbot, win, "How many r are in strawberry?")
    assert first["drafted"] > 0 and not first["draft_compiled"]  # drafted while it compiles
    said = list(win.controller.path[-1][1].tokens.ids)
    backend = win.controller.slot.host.worker.backend
    twin = backend.draft(d2).twin  # the draft the reply held, read-only from here
    assert twin is not None
    qtbot.waitUntil(twin.done.is_set, timeout=600_000)
    assert twin.error is None
    second = send(qtbot, win, "How many r are in strawberry?")
    reply = win.controller.path[-1][1]
    assert second["drafted"] > 0 and reply.tokens.ids == said  # greedy: the model's own reply again
    compiled = backend.draft(d2).compiled
    assert second["draft_compiled"] == compiled
    # The target's passes compile after the draft (one compile at a time): adopted if ready.
    checked = backend.verifier.compiled
    assert second["verifier_compiled"] == checked
    named = [Path(d2).name, *(["compiled"] * compiled), *(["target compiled"] * checked)]
    footer = last(win).footer.text()
    assert f"speculative ({', '.join(named)})" in footer

    # Another draft, then this one again: a new compile starts; quitting now ends it.
    box.draft.setCurrentIndex(box.draft.findData("int8"))
    send(qtbot, win, "What is 12 times 7?")
    box.draft.setCurrentIndex(box.draft.findData(d2))
    send(qtbot, win, "What is 12 times 7?")
    again = backend.draft(d2).twin
    assert again is not None and again is not twin
    checking = backend.verifier.twin  # the target's compile, if still under way
    restart(qtbot, windows, fake=False)
    qtbot.waitUntil(lambda: not again._thread.is_alive(), timeout=600_000)
    assert again.compiled is None  # stopped before its warm-up ended
    if checking is not None:
        qtbot.waitUntil(lambda: not checking._thread.is_alive(), timeout=600_000)
