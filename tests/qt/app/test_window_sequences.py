"""What a new user does in the window, as sequences of actions (send, regenerate, switch chat,
delete, reopen, restart), and what the window must show after each step (issue 11).

Each test drives the real window: MainWindow with a real ChatController and CompareController,
a real SQLite store and settings file in the test's home, and a real model thread. The chat's
model is the deterministic fake backend where the replies do not matter, and a tiny real
nanochat checkpoint where they do. The fixtures are in tests/qt/conftest.py, the helpers in
support/window.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QAbstractButton, QLabel, QWidget
from support.checkpoint_factory import write_checkpoint
from support.fake_backend import FakeBackend
from support.window import (
    WAIT,
    action,
    banner_says,
    click_row,
    load_fake,
    open_folder,
    open_window,
    regenerate,
    restart,
    send,
    start_with_base,
)

from desktop.config.settings import Settings
from desktop.engine.discovery import summarize
from desktop.qt.app.main_window import MainWindow
from desktop.qt.chat.history_sidebar import MARK_END, MARK_START
from desktop.qt.widgets.checkpoint_picker import human_bytes, human_params
from desktop.qt.widgets.common import ElidedLabel

pytestmark = pytest.mark.gui


# ----- the app around the window --------------------------------------------------------------


# ----- 1. regenerate shows its branches at once -----------------------------------------------


def test_each_regeneration_shows_its_place_among_the_versions_while_it_streams(qtbot, win):
    load_fake(qtbot, win)
    send(qtbot, win, "slow hello")  # "slow": each token waits on the gate, so a test can look mid-reply
    for n in (2, 3, 4):
        FakeBackend.gate.clear()
        with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT):
            qtbot.keyClick(win.input.editor, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
            qtbot.waitUntil(lambda: win.controller.busy, timeout=WAIT)
            streaming = win.chat.streaming
            assert streaming is not None and streaming is win.chat.widgets[-1]
            assert streaming.branch_label.isVisibleTo(streaming)
            assert streaming.branch_label.text() == f"{n} / {n}"
            assert streaming.prev_btn.isEnabled() and not streaming.next_btn.isEnabled()
            FakeBackend.gate.set()
        last = win.chat.widgets[-1]
        assert last.branch_label.isVisibleTo(last) and last.branch_label.text() == f"{n} / {n}"
    # The arrow goes back to the earlier versions, as after reopening the chat.
    qtbot.mouseClick(win.chat.widgets[-1].prev_btn, Qt.MouseButton.LeftButton)
    assert win.chat.widgets[-1].branch_label.text() == "3 / 4"


# ----- 2. the sidebar follows the conversation shown ------------------------------------------


def listed(win: MainWindow) -> list[int]:
    lst = win.sidebar.list
    return [lst.item(i).data(Qt.ItemDataRole.UserRole) for i in range(lst.count())]


def highlighted(win: MainWindow) -> int | None:
    items = win.sidebar.list.selectedItems()
    return items[0].data(Qt.ItemDataRole.UserRole) if items else None


def test_the_highlight_follows_new_chat_send_and_delete_and_a_click_opens_the_row(qtbot, win, loop):
    load_fake(qtbot, win)
    send(qtbot, win, "first chat")
    first = win.controller.conv_id
    assert highlighted(win) == first
    action(win, "New chat").trigger()
    assert highlighted(win) is None
    send(qtbot, win, "second chat")  # sending from a new chat makes it the current row
    second = win.controller.conv_id
    assert second != first and highlighted(win) == second

    click_row(qtbot, win, first)
    assert win.controller.conv_id == first and highlighted(win) == first
    action(win, "New chat").trigger()
    click_row(qtbot, win, first)  # the row that was highlighted a moment ago opens at once
    assert win.controller.conv_id == first and win.chat.messages[0].plain_text() == "first chat"

    win.sidebar.delete(first)  # the context menu's Delete: the open chat goes
    assert win.controller.conv_id is None and highlighted(win) is None
    click_row(qtbot, win, second, double=True)
    assert win.controller.conv_id == second and highlighted(win) == second

    # From the Compare tab, a click on the highlighted chat brings it back.
    win.tabs.setCurrentWidget(win.compare_view)
    click_row(qtbot, win, second)
    assert win.tabs.currentIndex() == 0 and win.controller.conv_id == second

    # A search result for the chat that is shown, and for another one, both open.
    action(win, "New chat").trigger()
    send(qtbot, win, "third chat")
    third = win.controller.conv_id
    with qtbot.waitSignal(win.background.search_results, timeout=WAIT):
        qtbot.keyClicks(win.sidebar.search, "second")
    assert listed(win) == [second]
    assert highlighted(win) is None  # the chat shown (third) is not among the results
    click_row(qtbot, win, second)
    assert win.controller.conv_id == second and highlighted(win) == second
    action(win, "New chat").trigger()
    assert highlighted(win) is None
    click_row(qtbot, win, second)
    assert win.controller.conv_id == second
    assert third in {r.id for r in win.controller.store.list_conversations()}


# ----- 7. quitting from the Compare tab keeps the Parameters panel ------------------------------


def test_quitting_on_the_compare_tab_keeps_the_parameters_panel_as_the_user_left_it(qtbot, windows):
    win = open_window(qtbot)
    windows.append(win)
    win.tabs.setCurrentWidget(win.compare_view)
    win = restart(qtbot, windows)
    assert win.settings.get("sampling_panel_visible") is True
    assert win.sampling.isVisible()
    # Hidden on purpose (Ctrl+Shift+S), then quit from Compare: it stays hidden, and comes back.
    action(win, "Sampling panel").trigger()
    assert not win.sampling.isVisible()
    win.tabs.setCurrentWidget(win.compare_view)
    action(win, "Sampling panel").trigger()  # the shortcut works from the Compare tab too
    win.tabs.setCurrentIndex(0)
    assert win.sampling.isVisible()
    action(win, "Sampling panel").trigger()
    win.tabs.setCurrentWidget(win.compare_view)
    win = restart(qtbot, windows)
    assert win.settings.get("sampling_panel_visible") is False and not win.sampling.isVisible()


# ----- 9. regenerate draws a new seed unless the user locked one -------------------------------


def seed_of(widget) -> int:
    return widget.message.meta["sampling"]["seed"]


def test_regenerate_uses_a_new_seed_unless_locked_and_the_footer_names_it(qtbot, win, windows):
    assert win.sampling.lock_btn.text() == "Random" and not win.sampling.lock_btn.isChecked()
    load_fake(qtbot, win)
    send(qtbot, win, "hello")
    seeds = [seed_of(win.chat.widgets[-1])]
    for _ in range(2):
        regenerate(qtbot, win)
        seeds.append(seed_of(win.chat.widgets[-1]))
    assert len(set(seeds)) == 3  # three draws from 2**31 seeds
    footer = win.chat.widgets[-1].footer
    assert footer.isVisibleTo(win.chat.widgets[-1]) and f"seed {seeds[-1]}" in footer.text()
    assert win.sampling.seed_box.value() == seeds[-1]  # the panel shows the seed just used

    qtbot.mouseClick(win.sampling.lock_btn, Qt.MouseButton.LeftButton)  # "keep this seed"
    assert win.sampling.lock_btn.text() == "Locked"
    regenerate(qtbot, win)
    regenerate(qtbot, win)
    assert seed_of(win.chat.widgets[-1]) == seeds[-1]
    assert f"seed {seeds[-1]}" in win.chat.widgets[-1].footer.text()

    win.sampling.apply_preset("Greedy")
    regenerate(qtbot, win)
    assert "greedy" in win.chat.widgets[-1].footer.text()
    # The choice survives a restart: locked stays locked.
    win = restart(qtbot, windows)
    assert win.sampling.lock_btn.isChecked()


# ----- 5. "Context full" is about the chat on screen, and only while it is true ----------------

LONG = "tell me about the long history of this very long question, please"  # 66 characters


def test_the_context_full_banner_goes_with_the_chat_that_overflowed(qtbot, win):
    load_fake(qtbot, win)  # the fake's context: 200 characters, less the room kept for the reply
    send(qtbot, win, LONG)
    assert not banner_says(win, "Context full")
    send(qtbot, win, LONG)  # the first exchange no longer fits: it is left out
    assert banner_says(win, "Context full")
    long_chat = win.controller.conv_id

    action(win, "New chat").trigger()
    assert not banner_says(win, "Context full")
    send(qtbot, win, "hi")
    assert not banner_says(win, "Context full")
    short_chat = win.controller.conv_id

    win.controller.open_conversation(long_chat)
    send(qtbot, win, LONG)
    assert banner_says(win, "Context full")
    click_row(qtbot, win, short_chat)  # switching chats takes it away
    assert not banner_says(win, "Context full")
    send(qtbot, win, "and again")  # a reply that needed no dropping keeps it away
    assert not banner_says(win, "Context full")
    # Another notice is not taken away by a chat switch.
    win.banner.show_error("Could not load x", "y")
    action(win, "New chat").trigger()
    assert banner_says(win, "Could not load x")


# ----- 6. counters and labels follow what is on screen ----------------------------------------


def context_shown(win: MainWindow) -> tuple[int, int]:
    used, total = (int(x) for x in win.status.context.text().split(" / "))
    assert win.input.hint.text() == f"{used} / {total} context tokens"
    return used, total


def test_the_context_counter_follows_chat_switches_and_a_restart(qtbot, windows):
    win = open_window(qtbot)
    windows.append(win)
    load_fake(qtbot, win)
    stats = [send(qtbot, win, "a first question"), send(qtbot, win, "and a second one")]
    long_chat, long_used = win.controller.conv_id, stats[-1]["prompt_tokens"] + stats[-1]["new_tokens"]
    assert context_shown(win) == (long_used, 200)  # the prompt and the reply it got
    action(win, "New chat").trigger()
    assert context_shown(win) == (0, 200)
    short = send(qtbot, win, "hi")
    short_chat, short_used = win.controller.conv_id, short["prompt_tokens"] + short["new_tokens"]
    click_row(qtbot, win, long_chat)
    assert context_shown(win) == (long_used, 200)
    click_row(qtbot, win, short_chat)
    assert context_shown(win) == (short_used, 200)

    win = restart(qtbot, windows)
    win.controller.refresh_list()
    click_row(qtbot, win, long_chat)
    assert context_shown(win)[0] == long_used  # known before any model is loaded
    load_fake(qtbot, win)
    assert context_shown(win) == (long_used, 200)


def test_after_deleting_the_open_chat_the_view_does_not_ask_for_a_checkpoint(qtbot, win):
    assert "Pick a checkpoint" in win.chat.placeholder_title.text()  # nothing is loaded yet
    load_fake(qtbot, win, "tiny")
    send(qtbot, win, "hello")
    win.sidebar.delete(win.controller.conv_id)
    assert win.chat.stack.currentWidget() is win.chat.placeholder
    title = win.chat.placeholder_title.text()
    assert "Pick a checkpoint" not in title and "fake/tiny · step 7" in title


def test_search_snippets_keep_a_tool_call_apart_from_its_result_and_the_text(qtbot, win, loop):
    load_fake(qtbot, win)
    send(qtbot, win, "what is calc")  # the fake answers with text, a calculator call 6*7 and its 42
    with qtbot.waitSignal(win.background.search_results, timeout=WAIT):
        qtbot.keyClicks(win.sidebar.search, "42")
    snippet = win.sidebar.list.item(0).data(Qt.ItemDataRole.UserRole + 1)
    plain = snippet.replace(MARK_START, "").replace(MARK_END, "")
    assert "6*7 42" in plain and "calc 6*7" in plain and "\n" not in plain


def test_while_the_first_scan_and_load_run_nothing_says_no_checkpoints_found(
    qtbot, windows, loop, nanochat_base, monkeypatch
):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(nanochat_base))
    win = open_window(qtbot)
    windows.append(win)
    panes = win.compare_view.panes
    texts = lambda: [win.picker.summary.text(), *(p.summary.text() for p in panes)]  # noqa: E731
    assert not any("No checkpoints found" in t for t in texts())  # before the scan has answered
    with qtbot.waitSignal(win.background.checkpoints_found, timeout=WAIT):
        win.start()  # the scan, then the newest checkpoint starts loading
    assert not any("No checkpoints found" in t for t in texts())
    qtbot.waitUntil(lambda: win.controller.model_info is not None, timeout=WAIT)
    qtbot.waitUntil(lambda: "E7" in win.picker.summary.text(), timeout=WAIT)
    assert not any("No checkpoints found" in t for t in texts())
    # A pane that was loaded, then unloaded, says so.
    pane = panes[0]
    with qtbot.waitSignal(win.compare.pane_loaded, timeout=WAIT):
        qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)  # now "Unload"
    assert pane.summary.text() == "Not loaded" and pane.load_btn.text() == "Load"


# ----- 4. a reopened comparison keeps its setup -----------------------------------------------


def test_a_reopened_comparison_keeps_each_panes_overrides_and_every_cross_score(
    qtbot, windows, loop, nanochat_base, monkeypatch
):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(nanochat_base))
    win = open_window(qtbot)
    windows.append(win)
    with qtbot.waitSignal(win.background.checkpoints_found, timeout=WAIT):
        win.background.scan()
    view, compare = win.compare_view, win.compare
    win.tabs.setCurrentWidget(view)
    qtbot.mouseClick(view.add_btn, Qt.MouseButton.LeftButton)
    temperatures = (0.0, 0.6, 1.5)
    for pane, t in zip(view.panes, temperatures, strict=True):
        with qtbot.waitSignal(compare.pane_loaded, timeout=WAIT):
            qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)
        pane.temperature.setValue(t)
    assert [p.overrides["temperature"] for p in compare.panes] == list(temperatures)
    view.max_tokens.setValue(6)
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        view.input.editor.setPlainText("hello there")
        qtbot.keyClick(view.input.editor, Qt.Key.Key_Return)
    for source in (0, 2):  # score A's reply and C's reply under every pane
        with qtbot.waitSignals([compare.cross_scored] * 3, timeout=WAIT):
            compare.cross_score(source)
    before = [pane.score_lines() for pane in view.panes]
    assert all(len(lines) == 2 for lines in before)
    with qtbot.waitSignal(compare.saved, timeout=WAIT) as saved:
        qtbot.mouseClick(view.save_btn, Qt.MouseButton.LeftButton)
    conv_id = saved.args[0]

    win = restart(qtbot, windows, fake=False)
    with qtbot.waitSignal(win.background.checkpoints_found, timeout=WAIT):
        win.background.scan()
    win.controller.refresh_list()
    click_row(qtbot, win, conv_id)
    view = win.compare_view
    assert win.tabs.currentWidget() is view and len(view.panes) == 3
    assert [p.temperature.text() for p in view.panes] == ["0.00", "0.60", "1.50"]
    assert [p.top_k.text() for p in view.panes] == ["shared"] * 3
    assert view.max_tokens.value() == 6 and view.input.editor.toPlainText() == "hello there"
    assert [pane.score_lines() for pane in view.panes] == before
    assert all(pane.score.isVisibleTo(pane) for pane in view.panes)


# ----- 3. Open folder… says what it found, at once, and is remembered ---------------------------


def test_open_folder_reports_an_empty_or_broken_folder_at_once_and_keeps_the_model(
    qtbot, windows, loop, nanochat_base, monkeypatch, tmp_path
):
    win = start_with_base(qtbot, windows, monkeypatch, nanochat_base)
    loaded = (Path(win.controller.model_info.path), win.controller.model_info.step)
    assert win.picker.current() == loaded

    empty = tmp_path / "empty"
    empty.mkdir()
    open_folder(qtbot, win, empty, monkeypatch)
    assert banner_says(win, "Nothing to open in empty")
    assert "model_<step>.pt" in win.banner.message.text()
    assert win.settings.get("checkpoint_folders") == []

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model_000001.pt").write_bytes(random.Random(7).randbytes(4096))
    (broken / "meta_000001.json").write_text("{}", encoding="utf-8")
    open_folder(qtbot, win, broken, monkeypatch)
    assert banner_says(win, "Cannot load broken") and win.banner.level == "error"
    message = win.banner.message.text()
    assert "model_000001.pt" in message and ("corrupt" in message or "not a PyTorch" in message)
    assert "meta_000001.json is empty" in message
    for leaked in ("pickled", "weights_only", "torch.load", "PyTorch 2.6"):
        assert leaked not in message
    assert win.picker.current() == loaded  # nothing else changed
    assert win.settings.get("checkpoint_folders") == [str(broken)]

    # Picked by hand and loaded anyway: the error, and the picker goes back to what is loaded.
    qtbot.waitUntil(lambda: any(Path(e.path) == broken for e in win.picker.entries), timeout=WAIT)
    win.picker.select(broken, 1)
    with qtbot.waitSignal(win.controller.model_load_failed, timeout=WAIT):
        qtbot.mouseClick(win.picker.load_btn, Qt.MouseButton.LeftButton)
    assert win.banner.level == "error" and "pickled" not in win.banner.message.text()
    assert win.picker.current() == loaded and win.picker.model_btn.text() == "sft/d4"


def test_an_opened_folder_loads_and_is_listed_again_after_a_restart(
    qtbot, windows, loop, nanochat_base, monkeypatch, tmp_path
):
    win = start_with_base(qtbot, windows, monkeypatch, nanochat_base, fake=False)
    mine = write_checkpoint(tmp_path / "runs", "E7", phase="chatsft", tag="mine", step=5, tokenizer="pkl")
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
        open_folder(qtbot, win, mine, monkeypatch)
    assert Path(loaded.args[0].path) == mine and loaded.args[0].step == 5
    assert win.picker.current() == (mine, 5) and win.picker.model_btn.text() == "sft/mine"

    win = restart(qtbot, windows, fake=False)
    with qtbot.waitSignal(win.background.checkpoints_found, timeout=WAIT):
        win.background.scan()
    assert any(Path(e.path) == mine for e in win.picker.entries)


# ----- 10. Ctrl+K: a searchable, keyboard-driven list of every checkpoint -----------------------


def test_ctrl_k_lists_every_step_with_its_shape_and_loads_with_the_keyboard(
    qtbot, windows, loop, nanochat_base, monkeypatch, tmp_path
):
    written = write_checkpoint(tmp_path / "runs", "E2", phase="base", tag="mine", step=3)
    mine = written.rename(tmp_path / "my-run")  # a folder outside nanochat's layout
    settings = Settings()
    settings.set("checkpoint_folders", [str(mine)])
    settings.save()  # opened in an earlier session
    win = start_with_base(qtbot, windows, monkeypatch, nanochat_base)  # loads sft/d4 step 20
    d4 = nanochat_base / "chatsft_checkpoints" / "d4"

    qtbot.keyClick(win.input.editor, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier)
    picker = win.model_picker
    qtbot.waitUntil(picker.isVisible, timeout=WAIT)
    assert picker.focusWidget() is picker.search  # typing goes to the search box
    keys = picker.visible_keys()
    assert {(d4, 20), (d4, 10), (mine, 3)} <= set(keys) and keys.index((d4, 20)) < keys.index((d4, 10))
    assert picker.current() == (d4, 20)  # the loaded one
    qtbot.waitUntil(lambda: picker.row_texts((mine, 3))[2] == "nanochat E2", timeout=WAIT)
    qtbot.waitUntil(lambda: picker.row_texts((d4, 10))[2] == "nanochat E7", timeout=WAIT)
    name, step, family, params, context, stored, memory, last = picker.row_texts((d4, 20))
    summary = summarize(d4, 20)
    assert (name, step, family) == ("sft/d4", "20", "nanochat E7")
    assert params == human_params(summary.params) and context == f"{summary.sequence_len:,}"
    assert stored == summary.stored_dtype and memory == f"≈{human_bytes(summary.memory_estimate())}"
    assert last == "loaded now" and picker.row_texts((d4, 10))[7] == ""
    assert picker.row_texts((mine, 3))[0] == "my-run"  # an opened folder, by its own name

    qtbot.keyClicks(picker.search, "d4 10")  # every word must match
    assert picker.visible_keys() == [(d4, 10)] and picker.current() == (d4, 10)
    picker.search.clear()
    qtbot.keyClicks(picker.search, "e2")
    assert picker.visible_keys() == [(mine, 3)]
    qtbot.keyClick(picker.search, Qt.Key.Key_Escape)
    assert not picker.isVisible() and win.controller.model_info.step == 20  # Esc: nothing loaded

    action(win, "Pick checkpoint").trigger()
    assert picker.search.text() == "" and picker.current() == (d4, 20)
    qtbot.keyClick(picker.search, Qt.Key.Key_Down)
    assert picker.current() == (d4, 10)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
        qtbot.keyClick(picker.search, Qt.Key.Key_Return)
    assert not picker.isVisible() and loaded.args[0].step == 10
    assert win.picker.current() == (d4, 10)
    action(win, "Pick checkpoint").trigger()
    assert picker.current() == (d4, 10)
    assert picker.row_texts((d4, 10))[7] == "loaded now" and picker.row_texts((d4, 20))[7] == "just now"
    qtbot.keyClick(picker.search, Qt.Key.Key_Escape)


# ----- 6. the model has one name: in the picker, the panes, the reply and the export ----------


def test_the_picker_the_panes_the_footer_and_the_export_name_the_model_alike(
    qtbot, windows, loop, nanochat_base, monkeypatch, tmp_path
):
    win = start_with_base(qtbot, windows, monkeypatch, nanochat_base, fake=False)
    win.sampling.set_values({"max_tokens": 4})
    send(qtbot, win, "hello")
    name = win.controller.model_info.name
    assert name == "sft/d4 · step 20"
    assert win.picker.model_btn.text() == "sft/d4" and win.picker.step.currentData() == 20
    assert name in win.chat.widgets[-1].footer.text()
    assert win.compare_view.panes[0].checkpoint.currentText() == "sft/d4"
    target = tmp_path / "chat.json"
    win.controller.export(win.controller.conv_id, "json", target)
    exported = json.loads(target.read_text(encoding="utf-8"))
    assert exported["messages"][-1]["meta"]["name"] == name


# ----- 8. 800 × 600: panels fold, toolbars wrap, long names elide, nothing is cut off -------------

LONG_TAG = "a-very-long-run-name-for-the-picker"


def cut_off(root: QWidget) -> list[str]:
    """Buttons, check boxes and one-line labels under ``root`` that are narrower than their text
    or reach past ``root``'s right edge (ElidedLabels elide, and are left out)."""
    found = []
    for w in root.findChildren(QWidget):
        if not isinstance(w, (QAbstractButton, QLabel)) or not w.isVisibleTo(root):
            continue
        if isinstance(w, ElidedLabel) or (isinstance(w, QLabel) and (w.wordWrap() or not w.text())):
            continue
        needed = w.sizeHint().width() if isinstance(w, QAbstractButton) else w.minimumSizeHint().width()
        right = w.mapTo(root, QPoint(w.width(), 0)).x()
        if w.width() < needed or right > root.width():
            found.append(f"{type(w).__name__} {w.text()!r}: {w.width()} of {needed} px, right edge {right}")
    return found


def test_the_window_is_usable_at_800_by_600(qtbot, windows, loop, monkeypatch, tmp_path):
    base = tmp_path / "nanochat"
    write_checkpoint(base, "E7", phase="chatsft", tag=LONG_TAG, step=1)
    win = start_with_base(qtbot, windows, monkeypatch, base, fake=False)
    win.sampling.set_values({"max_tokens": 8})
    send(qtbot, win, "hello there, what do you know?")
    assert win.minimumSizeHint().width() <= 800 and win.minimumSizeHint().height() <= 600
    win.resize(800, 600)
    qtbot.waitUntil(lambda: (win.width(), win.height()) == (800, 600), timeout=WAIT)

    def chat_fits() -> None:
        viewport = win.chat.scroll_area.viewport().width()
        assert all(w.width() <= viewport for w in win.chat.widgets)  # no message runs off the side
        for part in (win.picker, win.input, win.status):
            assert cut_off(part) == []
        assert win.chat.width() >= 300

    assert win.sampling.is_collapsed()  # folded to its strip to leave the chat its width
    chat_fits()
    assert win.picker.model_btn.text() != LONG_TAG and "…" in win.picker.model_btn.text()
    qtbot.mouseClick(win.sampling.collapse_btn, Qt.MouseButton.LeftButton)  # the user opens it
    qtbot.waitUntil(lambda: win.sampling.width() >= win.sampling.minimumWidth(), timeout=WAIT)
    assert not win.sampling.is_collapsed() and win.width() == 800
    chat_fits()
    win.resize(1300, 800)  # wide: nothing to decide; narrow again: it folds by itself again
    qtbot.waitUntil(lambda: win.width() == 1300, timeout=WAIT)
    win.resize(800, 600)
    qtbot.waitUntil(lambda: win.sampling.is_collapsed(), timeout=WAIT)
    win.resize(1300, 800)
    qtbot.waitUntil(lambda: not win.sampling.is_collapsed(), timeout=WAIT)

    win.resize(800, 600)
    win.tabs.setCurrentWidget(win.compare_view)
    view = win.compare_view
    view.overlay_box.setChecked(True)
    qtbot.waitUntil(lambda: view.legend.width() >= view.legend.sizeHint().width(), timeout=WAIT)
    for part in (view.toolbar, view.sampling_row, *view.panes):
        assert cut_off(part) == []
    for pane in view.panes:
        assert pane.checkpoint.currentText() == f"sft/{LONG_TAG}"
        shown = pane.checkpoint.shown_text()
        assert shown.endswith("…") and LONG_TAG.startswith(shown[4:-1])  # elided, not cut
    while len(view.panes) < 4:
        qtbot.mouseClick(view.add_btn, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.pane_scroll.horizontalScrollBar().maximum() > 0, timeout=WAIT)
    assert all(pane.width() >= pane.minimumSizeHint().width() for pane in view.panes)
    assert win.width() == 800  # four panes scroll sideways instead of widening the window
