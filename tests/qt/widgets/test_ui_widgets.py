"""The chat window's widgets on their own (offscreen, no model): signals, rendering and state."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QApplication, QLabel

from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, Part, TokenEvent
from desktop.engine.params import KNOB
from desktop.qt.app.shortcuts_dialog import SHORTCUTS, ShortcutsDialog
from desktop.qt.chat import history_sidebar
from desktop.qt.chat.chat_view import BATCH, ChatView
from desktop.qt.chat.history_sidebar import HistorySidebar, relative_time
from desktop.qt.chat.input_box import MAX_VISIBLE_LINES, InputBox
from desktop.qt.chat.message_blocks import FoldBlock, RichText, ToolCallBlock
from desktop.qt.chat.message_widget import MessageWidget, draft_label
from desktop.qt.widgets import theme
from desktop.qt.widgets.checkpoint_picker import CheckpointPicker, human_bytes, human_params
from desktop.qt.widgets.common import ElidedLabel
from desktop.qt.widgets.error_banner import ErrorBanner
from desktop.qt.widgets.markdown_render import COPY_CODE_SCHEME
from desktop.qt.widgets.sampling_panel import BUILTIN_PRESETS, SamplingPanel
from desktop.qt.widgets.status_bar import StatusBar
from desktop.qt.widgets.token_view import TokenRecord

pytestmark = pytest.mark.gui


@dataclass
class Row:
    id: int
    title: str
    updated: float
    kind: str


@dataclass
class Entry:
    source: str
    tag: str
    path: Path
    steps: list[int]


def calculator_events(expression: str, result: str) -> list[TokenEvent]:
    """What the engine streams for "<text> <|python_start|>expr<|python_end|> <forced output> <text>"."""
    events = [TokenEvent(1, "Let me compute.", False, TEXT)]
    events.append(TokenEvent(2, "", False, PYTHON, "<|python_start|>"))
    events += [TokenEvent(10 + i, ch, False, PYTHON) for i, ch in enumerate(expression)]
    events.append(TokenEvent(3, "", False, PYTHON, "<|python_end|>"))
    events.append(TokenEvent(4, "", True, PYTHON_OUTPUT, "<|output_start|>"))
    events += [TokenEvent(40 + i, ch, True, PYTHON_OUTPUT) for i, ch in enumerate(result)]
    events.append(TokenEvent(5, "", True, PYTHON_OUTPUT, "<|output_end|>"))
    events.append(TokenEvent(6, f" So the answer is {result}.", False, TEXT))
    return events


# ----- sampling panel ----------------------------------------------------------------------


def test_sampling_slider_and_spin_box_stay_in_sync(qtbot):
    panel = SamplingPanel()
    qtbot.addWidget(panel)
    row = panel.rows["temperature"]
    knob = KNOB["temperature"]
    row.slider.setValue(row.slider.maximum())
    assert row.box.value() == pytest.approx(knob.ui_hi)  # the slider's end; typing may go beyond
    row.box.setValue(knob.ui_hi + 1)
    assert panel.values()["temperature"] == knob.ui_hi + 1
    row.box.setValue(0.35)
    assert row.slider.value() == round(0.35 / knob.step)
    row.box.setValue(0.73)  # between two slider steps: the typed value is kept
    assert panel.values()["temperature"] == 0.73
    assert row.slider.value() == round(0.73 / knob.step)
    row.slider.setValue(0)
    assert panel.values()["temperature"] == 0.0 and row.note.text() == "greedy"
    top_k = panel.rows["top_k"]
    top_k.slider.setValue(17)
    assert panel.values()["top_k"] == 17 and isinstance(panel.values()["top_k"], int)


def test_sampling_values_round_trip_and_emit_once(qtbot):
    panel = SamplingPanel()
    qtbot.addWidget(panel)
    values = {
        "temperature": 1.35,
        "top_k": 17,
        "top_p": 0.9,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
        "max_tokens": 300,
        "seed": 987,
        "seed_locked": False,
        "system_prompt": "Be brief.",
    }
    emitted = []
    panel.values_changed.connect(emitted.append)
    panel.set_values(values)
    assert panel.values() == values
    assert emitted == [values]
    panel.set_values(values)  # nothing changed: no signal
    assert len(emitted) == 1
    other = SamplingPanel()
    qtbot.addWidget(other)
    other.set_values(panel.values())
    assert other.values() == values


def test_presets_apply_save_and_delete(qtbot):
    panel = SamplingPanel()
    qtbot.addWidget(panel)
    panel.set_values({"max_tokens": 77, "system_prompt": "kept"})
    index = panel.preset_box.findData("Creative")
    with qtbot.waitSignal(panel.values_changed) as changed:
        panel.preset_box.activated.emit(index)  # as when the user picks it
    for key, value in BUILTIN_PRESETS["Creative"].items():
        assert changed.args[0][key] == value
    assert panel.values()["max_tokens"] == 77 and panel.values()["system_prompt"] == "kept"
    assert panel.preset_box.currentText() == "Creative"
    panel.rows["temperature"].box.setValue(0.55)
    assert panel.preset_box.currentIndex() == -1  # shown as "Custom"

    with qtbot.waitSignal(panel.presets_changed) as saved:
        panel.save_preset("Mine")
    mine = saved.args[0]["Mine"]
    assert mine["temperature"] == 0.55 and "system_prompt" not in mine
    assert panel.apply_preset("Greedy")
    assert panel.values()["temperature"] == 0.0
    assert panel.apply_preset("Mine")
    assert panel.values()["temperature"] == 0.55 and panel.preset_box.currentText() == "Mine"
    assert panel.delete_preset_btn.isEnabled()
    with qtbot.waitSignal(panel.presets_changed) as deleted:
        panel.delete_preset_btn.click()
    assert deleted.args[0] == {}
    assert not panel.apply_preset("Mine")


def test_next_seed_is_fresh_unless_locked(qtbot):
    panel = SamplingPanel()
    qtbot.addWidget(panel)
    panel.set_values({"seed": 5, "seed_locked": True})
    assert panel.state.next_request()[0].seed == 5
    panel.set_values({"seed_locked": False})
    seeds = {panel.state.next_request()[0].seed for _ in range(5)}
    assert panel.seed_box.value() in seeds and len(seeds) > 1


def test_sampling_panel_folds_to_a_strip(qtbot):
    panel = SamplingPanel()
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.collapsed_changed, check_params_cb=lambda c: c is True):
        panel.collapse_btn.click()
    assert panel.is_collapsed() and panel.maximumWidth() < panel.rows["temperature"].minimumSizeHint().width()
    panel.collapse_btn.click()
    assert not panel.is_collapsed()


# ----- input box -----------------------------------------------------------------------------


def test_enter_sends_and_shift_enter_adds_a_line(qtbot):
    box = InputBox()
    qtbot.addWidget(box)
    box.editor.setPlainText("hello")
    box.editor.moveCursor(QTextCursor.MoveOperation.End)
    with qtbot.assertNotEmitted(box.send_requested):
        qtbot.keyClick(box.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert box.text() == "hello\n"
    qtbot.keyClicks(box.editor, "world")
    with qtbot.waitSignal(box.send_requested) as sent:
        qtbot.keyClick(box.editor, Qt.Key.Key_Return)
    assert sent.args == ["hello\nworld"]
    assert box.text() == "hello\nworld"  # kept until the caller accepts it
    box.clear()
    with qtbot.assertNotEmitted(box.send_requested):
        qtbot.keyClick(box.editor, Qt.Key.Key_Return)  # nothing to send


def test_ctrl_enter_sends_when_enter_makes_lines(qtbot):
    box = InputBox()
    qtbot.addWidget(box)
    box.set_enter_sends(False)
    box.editor.setPlainText("a")
    box.editor.moveCursor(QTextCursor.MoveOperation.End)
    with qtbot.assertNotEmitted(box.send_requested):
        qtbot.keyClick(box.editor, Qt.Key.Key_Return)
    assert box.text() == "a\n"
    with qtbot.waitSignal(box.send_requested) as sent:
        qtbot.keyClick(box.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert sent.args == ["a\n"]


def test_escape_stops_only_while_generating(qtbot):
    box = InputBox()
    qtbot.addWidget(box)
    with qtbot.assertNotEmitted(box.stop_requested):
        qtbot.keyClick(box.editor, Qt.Key.Key_Escape)
    box.set_generating(True)
    assert box.stop_btn.isVisibleTo(box) and not box.send_btn.isVisibleTo(box)
    with qtbot.waitSignal(box.stop_requested):
        qtbot.keyClick(box.editor, Qt.Key.Key_Escape)
    box.editor.setPlainText("queued")
    with qtbot.assertNotEmitted(box.send_requested):
        qtbot.keyClick(box.editor, Qt.Key.Key_Return)  # no second request while one runs
    box.set_generating(False)
    assert box.send_btn.isVisibleTo(box) and not box.stop_btn.isVisibleTo(box)


def test_a_100_kb_paste_is_sent_whole_and_the_box_stays_small(qtbot):
    box = InputBox()
    qtbot.addWidget(box)
    box.show()
    big = "".join(f"line {i}: {'x' * 90}\n" for i in range(1000))
    assert len(big) > 100_000
    QApplication.clipboard().setText(big)
    box.editor.paste()
    assert box.editor.height() <= (MAX_VISIBLE_LINES + 1) * box.editor.fontMetrics().lineSpacing() + 20
    with qtbot.waitSignal(box.send_requested) as sent:
        box.send_btn.click()
    assert sent.args[0] == big


# ----- messages and the chat view ----------------------------------------------------------


def test_streamed_calculator_call_renders_as_a_tool_block(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    view.set_messages([Message.of_text("user", "What is 12 times 7?")])
    reply = Message("assistant", [], {"sampling": {"temperature": 0.0}})
    view.begin_assistant(reply)
    events = calculator_events("12*7", "84")
    for ev in events:
        reply.add_event(ev)  # what the controller does; the view re-renders the same message
        view.append_event(ev)
    widget = view.streaming
    assert widget.segment_widgets() == []  # nothing rendered per token: the timer coalesces
    qtbot.waitUntil(lambda: len(widget.findChildren(ToolCallBlock)) == 1)
    block = widget.findChildren(ToolCallBlock)[0]
    expression = "".join(e.text for e in events if e.kind == PYTHON)
    result = "".join(e.text for e in events if e.forced)
    assert block.expression == expression and block.output == result
    assert block.code.text() == expression and block.result.text() == f"= {result}"
    kinds = [type(w) for w in widget.segment_widgets()]
    assert kinds == [RichText, ToolCallBlock, RichText]
    assert "So the answer is 84." in widget.segment_widgets()[2].toPlainText()
    view.end_assistant({"new_tokens": len(events), "decode_tok_s": 50.0, "ttft_ms": 12.0})
    assert view.streaming is None
    assert f"{len(events)} tokens" in widget.footer.text() and "greedy" in widget.footer.text()


def test_script_in_a_message_shows_as_text(qtbot):
    msg = Message.of_text("assistant", "<script>alert(1)</script> hi")
    widget = MessageWidget(msg)
    qtbot.addWidget(widget)
    text = widget.segment_widgets()[0]
    assert "<script>alert(1)</script> hi" in text.toPlainText()
    assert "<script" not in text.html_source()


def test_fork_thought_is_folded_and_tool_query_open(qtbot):
    msg = Message(
        "assistant",
        [
            Part("thought", "thinking hard"),
            Part("tool_query", 'weather("Paris")'),
            Part("tool_result", "18C"),
        ],
    )
    widget = MessageWidget(msg)
    qtbot.addWidget(widget)
    thought, query = widget.findChildren(FoldBlock)
    assert not thought.is_open() and thought.body.isHidden()
    assert query.is_open() and query.result.text() == "→ 18C"
    thought.toggle.click()
    assert thought.is_open() and not thought.body.isHidden()


def test_message_actions_emit_with_the_right_index(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    user = Message.of_text("user", "first")
    reply = Message("assistant", [Part(TEXT, "answer\n```\ncode here\n```")])
    view.set_messages([user, reply], [(0, 1), (1, 3)])
    w_user, w_reply = view.widgets
    assert w_reply.branch_label.text() == "2 / 3" and not w_user.branch_label.isVisibleTo(w_user)
    with qtbot.waitSignal(view.regenerate_requested) as regen:
        w_reply.regenerate_btn.click()
    assert regen.args == [1]
    with qtbot.waitSignal(view.branch_requested) as branch:
        w_reply.prev_btn.click()
    assert branch.args == [1, -1]
    with qtbot.waitSignal(view.copy_requested) as copied:
        w_reply.copy_btn.click()
    assert copied.args == [reply.plain_text()]
    with qtbot.waitSignal(view.copy_requested) as code:
        w_reply.segment_widgets()[0].anchorClicked.emit(QUrl(f"{COPY_CODE_SCHEME}:0"))
    assert code.args == ["code here"]
    w_user.start_edit()
    w_user.edit_box.editor.setPlainText("second try")
    with qtbot.waitSignal(view.edit_requested) as edited:
        w_user.edit_box.save_btn.click()
    assert edited.args == [0, "second try"]
    assert w_user.edit_box is None


def test_raw_token_mode_switches_the_view(qtbot):
    widget = MessageWidget(Message.of_text("assistant", "hi"))
    qtbot.addWidget(widget)
    records = [TokenRecord("", "<|python_start|>", PYTHON), TokenRecord("2", kind=PYTHON_OUTPUT, forced=True)]
    widget.set_raw_tokens(records)
    assert widget.raw_view.isVisibleTo(widget) and widget.segment_widgets()[0].isHidden()
    assert "‹python" in widget.raw_view.toPlainText()
    assert widget.raw_summary.text().startswith("2 tokens · 1 special · 1 forced by a tool")
    widget.set_raw_tokens(None)
    assert not widget.raw_view.isVisibleTo(widget) and widget.segment_widgets()[0].isVisibleTo(widget)


def test_long_chat_builds_widgets_lazily_and_loads_older_on_scroll(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    messages = [Message.of_text("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(200)]
    view.set_messages(messages)
    assert len(view.widgets) == BATCH and view.widgets[-1].message is messages[-1]
    bar = view.scroll_area.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())

    def scrolled_to_the_first() -> None:
        bar.setValue(0)
        assert len(view.widgets) == len(messages)

    qtbot.waitUntil(scrolled_to_the_first, timeout=15000)
    assert [w.index for w in view.widgets] == list(range(len(messages)))


def test_auto_scroll_follows_until_the_user_scrolls_up(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(500, 300)
    view.show()
    view.set_messages([Message.of_text("user", f"line {i}\n" * 3) for i in range(12)])
    reply = Message("assistant")
    view.begin_assistant(reply)
    bar = view.scroll_area.verticalScrollBar()

    def stream(ev: TokenEvent) -> None:
        reply.add_event(ev)
        view.append_event(ev)

    for i in range(20):
        stream(TokenEvent(i, f"token {i}\n\n", False, TEXT))
    view.streaming.flush()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    bar.setValue(0)  # the user scrolls up to read
    assert not view.is_following() and view.jump_btn.isVisibleTo(view)
    for i in range(20, 40):
        stream(TokenEvent(i, f"token {i}\n\n", False, TEXT))
    view.streaming.flush()
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    assert bar.value() == 0
    view.jump_btn.click()
    assert view.is_following() and bar.value() == bar.maximum()


def test_showing_the_same_chat_again_reuses_widgets(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    messages = [Message.of_text("user", "q"), Message.of_text("assistant", "a")]
    view.set_messages(messages)
    before = list(view.widgets)
    view.set_messages([*messages, Message.of_text("user", "next")])
    assert view.widgets[:2] == before and len(view.widgets) == 3


def test_empty_state_and_mode_notice(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    assert view.stack.currentWidget() is view.placeholder
    view.set_mode_notice("Completion mode")
    assert view.notice.text() == "Completion mode" and not view.notice.isHidden()
    view.set_mode_notice(None)
    assert view.notice.isHidden()
    view.set_messages([Message.of_text("user", "hi")])
    assert view.stack.currentWidget() is view.scroll_area
    view.clear()
    assert view.stack.currentWidget() is view.placeholder and view.widgets == []


def test_switching_to_dark_re_renders_code_colours(qtbot, qapp):
    widget = MessageWidget(Message.of_text("assistant", "```python\nx = 1\n```"))
    qtbot.addWidget(widget)
    text = widget.segment_widgets()[0]
    assert theme.LIGHT.code_bg in text.html_source()
    try:
        theme.apply_theme(qapp, "dark")
        qtbot.waitUntil(lambda: theme.DARK.code_bg in text.html_source())
        assert qapp.palette().window().color().name() == theme.DARK.window
        assert theme.apply_theme(qapp, "system") in (theme.LIGHT, theme.DARK)
        with pytest.raises(ValueError):
            theme.apply_theme(qapp, "sepia")
    finally:
        theme.apply_theme(qapp, "light")


# ----- history sidebar ---------------------------------------------------------------------


def test_delete_then_undo(qtbot):
    side = HistorySidebar()
    qtbot.addWidget(side)
    side.show()
    now = time.time()
    side.set_conversations([Row(1, "first", now, "chat"), Row(2, "second", now - 60, "chat")])
    assert side.list.count() == 2
    with qtbot.waitSignal(side.delete_requested) as deleted:
        side.delete(2)
    assert deleted.args == [2] and side.list.count() == 1
    assert side.undo_bar.isVisible()
    with qtbot.waitSignal(side.undo_delete_requested) as undone:
        qtbot.mouseClick(side.undo_btn, Qt.MouseButton.LeftButton)
    assert undone.args == [2] and not side.undo_bar.isVisible()


def test_the_undo_bar_goes_by_itself_after_a_delete(qtbot, monkeypatch):
    monkeypatch.setattr(history_sidebar, "UNDO_MS", 50)
    side = HistorySidebar()
    qtbot.addWidget(side)
    side.show()
    side.set_conversations([Row(1, "first", time.time(), "chat")])
    side.delete(1)
    assert side.undo_bar.isVisible()
    qtbot.waitUntil(lambda: not side.undo_bar.isVisible())


def test_select_is_quiet_and_a_click_selects(qtbot):
    side = HistorySidebar()
    qtbot.addWidget(side)
    side.show()
    now = time.time()
    side.set_conversations([Row(1, "first", now, "chat"), Row(2, "second", now, "chat")])
    with qtbot.assertNotEmitted(side.conversation_selected):
        side.select(2)
    assert side.current_id() == 2
    rect = side.list.visualItemRect(side.list.item(0))
    with qtbot.waitSignal(side.conversation_selected) as picked:
        qtbot.mouseClick(side.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert picked.args == [1]


def test_rename_in_place_emits_the_new_title(qtbot):
    side = HistorySidebar()
    qtbot.addWidget(side)
    side.set_conversations([Row(7, "old", time.time(), "chat")])
    with qtbot.waitSignal(side.rename_requested) as renamed:
        side.list.item(0).setText("  new title ")
    assert renamed.args == [7, "new title"]
    with qtbot.assertNotEmitted(side.rename_requested):
        side.list.item(0).setText("")  # emptied: treated as a cancel
    assert side.list.item(0).text() == "new title"


def test_relative_time():
    now = 1_700_000_000.0
    assert relative_time(now - 5, now) == "just now"
    assert relative_time(now - 5 * 60, now) == "5 min ago"
    assert relative_time(now - 3 * 3600, now) == "3 h ago"
    assert relative_time(now - 30 * 3600, now) == "yesterday"
    assert relative_time(now - 4 * 86400, now) == "4 days ago"
    assert relative_time(now - 400 * 86400, now).endswith(
        time.strftime("%Y", time.localtime(now - 400 * 86400))
    )


# ----- picker, status bar, banner, shortcuts -----------------------------------------------


def test_picker_loads_the_chosen_step(qtbot):
    picker = CheckpointPicker()
    qtbot.addWidget(picker)
    entries = [
        Entry("sft", "d20", Path("/ckpt/chatsft_checkpoints/d20"), [100, 200, 300]),
        Entry("base", "d32", Path("/ckpt/base_checkpoints/d32"), [50, 60]),
    ]
    picker.set_entries(entries)
    assert picker.current() == (entries[0].path, entries[0].steps[-1])  # newest step first
    assert picker.model_btn.text() == "sft/d20"  # as ModelInfo.name and the exports name it
    assert picker.select(entries[0].path, 200)
    with qtbot.waitSignal(picker.load_requested) as load:
        qtbot.mouseClick(picker.load_btn, Qt.MouseButton.LeftButton)
    assert load.args == [entries[0].path, 200]
    with qtbot.waitSignal(picker.selection_changed) as changed:
        assert picker.select(entries[1].path, 50)
    assert changed.args == [entries[1].path, 50] and picker.model_btn.text() == "base/d32"
    with qtbot.waitSignal(picker.selection_changed) as changed:
        picker.step.setCurrentIndex(picker.step.findData(60))
    assert changed.args == [entries[1].path, 60]
    with qtbot.waitSignal(picker.picker_requested):
        qtbot.mouseClick(picker.model_btn, Qt.MouseButton.LeftButton)  # the full picker (Ctrl+K)
    picker.set_progress(40, "checking values")
    assert not picker.load_btn.isEnabled() and not picker.progress.isHidden()
    picker.set_progress(100, "ready")
    assert picker.load_btn.isEnabled() and picker.progress.isHidden()


def test_picker_summary_is_human_readable(qtbot):
    picker = CheckpointPicker()
    qtbot.addWidget(picker)
    params, memory = 561_000_000, 3 * 1024**3 // 2
    picker.set_summary(
        {
            "era": "E7",
            "params": params,
            "dtype": "bfloat16",
            "sequence_len": 2048,
            "memory_bytes": memory,
            "device": "cuda",
        }
    )
    text = picker.summary.text()
    assert f"{params // 10**6}M params" in text and "E7" in text and "bfloat16" in text
    assert f"{memory / 1024**3:.1f} GB" in text and "2048" in text
    assert human_params(1_880_000_000) == "1.9B" and human_params(85_000) == "85K"
    assert human_bytes(512) == "512 B"
    picker.set_summary({"error": "meta_000100.json: unknown architecture"})
    assert "unknown architecture" in picker.summary.text()


def test_context_bar_turns_amber_over_80_percent(qtbot):
    status = StatusBar()
    qtbot.addWidget(status)
    total = 2048
    last_ok = int(total * 0.8)  # exactly 80 % is still fine
    status.set_context(last_ok, total)
    assert status.context_bar.property("level") == "ok"
    status.set_context(last_ok + 1, total)
    assert status.context_bar.property("level") == "warn"
    assert status.context.text() == f"{last_ok + 1} / {total}"
    status.set_context(total, total)
    assert status.context_bar.property("level") == "full"
    status.set_speed(42.26, 180.4)
    assert status.speed.text() == "42.3 tok/s"
    assert status.ttft.text() == "TTFT 180 ms"
    status.set_device_info("CPU · 8 threads", "float32")
    assert status.device.text() == "CPU · 8 threads" and status.dtype.text() == "float32"
    assert status.attention.isHidden()


def test_the_precision_tooltip_lists_the_kernels_and_forgets_them_on_the_next_model(qtbot):
    status = StatusBar()
    qtbot.addWidget(status)
    plain = status.dtype.toolTip()
    lines = ("2304×768 int8: int8 weight-only (µs: int8 weight-only 261, fbgemm int8 314); refused <x>",)
    status.set_device_info("CPU · 2 threads", "int8 weights", "sdpa", lines)
    tip = status.dtype.toolTip()
    assert "2304×768 int8: int8 weight-only" in tip and "refused &lt;x&gt;" in tip  # escaped, not markup
    status.set_device_info("CUDA: H100 (SM 9.0)", "bfloat16", "sdpa")  # a model with no CPU kernels
    assert status.dtype.toolTip() == plain


def test_banner_levels_details_and_dismiss(qtbot):
    banner = ErrorBanner()
    qtbot.addWidget(banner)
    long_message = "model_000100.pt: file is truncated or corrupt " * 5
    banner.show_error("Could not load /ckpt/d20", long_message, details="Traceback …")
    assert banner.level == "error" and banner.property("severity") == "error"
    assert banner.message.text() == long_message  # elided on screen, whole in text()
    assert banner.details.isHidden() and banner.more.isVisibleTo(banner)
    banner.more.click()
    assert not banner.details.isHidden() and banner.details.toPlainText() == "Traceback …"
    banner.show_info("Exported", "saved /tmp/chat.md")
    assert banner.level == "info" and not banner.more.isVisibleTo(banner) and banner.details.isHidden()
    with qtbot.waitSignal(banner.dismissed):
        banner.close_btn.click()
    assert banner.isHidden()


def test_elided_label_shows_an_ellipsis_when_narrow_and_asks_for_the_whole_text(qtbot):
    label = ElidedLabel("<b>short</b>")
    qtbot.addWidget(label)
    label.show()
    assert label.textFormat() == Qt.TextFormat.PlainText and label.toolTip() == ""
    long = "E7 · 561M params · stored bfloat16 · 2048 ctx · ≈1.2 GB on cuda"
    label.setText(long)
    assert label.text() == long and label.toolTip() == long
    whole = label.fontMetrics().horizontalAdvance(long)
    assert label.sizeHint().width() >= whole
    label.resize(whole // 3, label.sizeHint().height())
    shown = QLabel.text(label)  # what is painted
    assert shown.endswith("…") and len(shown) < len(long) and label.text() == long
    label.resize(label.sizeHint())
    assert QLabel.text(label) == long


def test_shortcuts_dialog_lists_every_shortcut(qtbot):
    dialog = ShortcutsDialog()
    qtbot.addWidget(dialog)
    shown = {cap.accessibleName() for cap in dialog.findChildren(QLabel, "Kbd")}
    assert shown == {keys for _, rows in SHORTCUTS for keys, _ in rows}
    for keys in (
        "Return",
        "Shift+Return",
        "Esc",
        "Ctrl+N",
        "Ctrl+F",
        "Ctrl+K",
        "F1",
        "Ctrl+R",
        "Ctrl+Shift+C",
    ):
        assert keys in shown


def test_a_footer_names_a_checkpoint_draft_by_its_folder_and_step_not_its_path():
    assert draft_label("int8") == "int8" and draft_label("auto") == "auto"
    assert draft_label("/home/me/runs/sft_checkpoints/d6@1200") == "d6@1200"
    assert draft_label("float16:/home/me/runs/sft_checkpoints/d6/") == "float16 d6"
