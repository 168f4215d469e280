"""One chat message: avatar and role, rendered parts, hover actions, branch arrows and a stats footer.

A message is a list of parts. Text parts are rendered Markdown; a calculator call (``python``)
and its forced result (``python_output``) become one ``ToolCallBlock``, drawn on the tool colours
so nobody mistakes the tool's answer for the model's; the fork's tool queries and thoughts fold.

Streaming is cheap: ``append_event`` only grows the Message, and a single-shot timer re-renders
at most every 50 ms, or less often once one render of a very long reply takes over 12 ms.
Re-rendering reuses the part widgets and only re-sets those whose text changed (in practice the
last one), and no token ever renders on its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from PySide6.QtCore import QEvent, QPoint, QTimer, Signal
from PySide6.QtGui import QEnterEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop.engine.messages import (
    PYTHON,
    TEXT,
    Message,
    TokenEvent,
)
from desktop.qt.chat.message_blocks import (
    FORK_MARK,
    EditBox,
    FoldBlock,
    RichText,
    Segment,
    ToolCallBlock,
    fork_marked,
    fork_point,
    group_parts,
)
from desktop.qt.chat.message_footer import SPECULATIVE_NOTE as SPECULATIVE_NOTE  # Compare's
from desktop.qt.chat.message_footer import copy_text, format_stats, raw_summary
from desktop.qt.chat.message_footer import draft_label as draft_label  # Compare's
from desktop.qt.chat.message_footer import speculative_line as speculative_line  # Compare's
from desktop.qt.widgets import common, icons, theme
from desktop.qt.widgets.fork_popup import ForkPopup
from desktop.qt.widgets.markdown_render import render_markdown, render_plain
from desktop.qt.widgets.token_records import FORK_GLYPH, TokenRecord, record_of
from desktop.qt.widgets.token_view import TokenView

RENDER_INTERVAL_MS = 50
COPIED_FEEDBACK_MS = 1500
ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
AVATAR = 24
CONTINUABLE = ("cancelled", "max_tokens")  # a reply that stopped for these may go on
STREAMING_FORK = "The reply is still streaming: fork it once it ends."


@dataclass
class _Slot:
    kind: str
    widget: QWidget
    blank: bool = False


class MessageWidget(QFrame):
    """One message row.

    Signals:
        copy_requested(str): text to put on the clipboard (the message, or one code block).
        regenerate_requested(): answer again (assistant messages).
        edit_submitted(str): the edited text of a user message, to send as a new branch.
        branch_requested(int): -1 / +1 to show the previous / next sibling version.
        fork_requested(int, int, str, bool): fork at token index with an alternative's id (-1:
            the text written instead), the text, and whether to race it in Compare.
        continue_requested(): go on from where this reply stopped (as a new version).
    """

    copy_requested = Signal(str)
    regenerate_requested = Signal()
    edit_submitted = Signal(str)
    branch_requested = Signal(int)
    fork_requested = Signal(int, int, str, bool)
    inside_requested = Signal(int)  # the Inside view at this token index (issue #45)
    continue_requested = Signal()

    def __init__(
        self,
        message: Message,
        sibling: tuple[int, int] = (0, 1),
        streaming: bool = False,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.message = message
        self.streaming = streaming
        self.index = -1  # position in the conversation; the chat view keeps it current
        role = message.role
        self.setObjectName("Message")
        self.setAccessibleName(f"{ROLE_NAMES.get(role, role)} message")
        self._pinned = False
        self._dark_rendered = theme.is_dark()
        self._segments: list[_Slot] = []
        self._raw = False  # the raw token view is offered (its tokens live in raw_view)
        self.edit_box: EditBox | None = None
        self.popup: ForkPopup | None = None
        self._fork_point = fork_point(message)

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 6, 0, 6)
        outer.setSpacing(4)
        outer.addLayout(self._build_header())

        self.bubble = QFrame()
        self.bubble.setObjectName("Bubble")
        self.bubble.setProperty("role", role)
        padded = role != "assistant"
        bubble_lay = QVBoxLayout(self.bubble)
        bubble_lay.setContentsMargins(
            14 if padded else 0, 10 if padded else 2, 14 if padded else 0, 10 if padded else 2
        )
        bubble_lay.setSpacing(8)
        self.parts_box = QVBoxLayout()
        self.parts_box.setSpacing(8)
        bubble_lay.addLayout(self.parts_box)
        self.pending = QLabel("Generating…")
        self.pending.setObjectName("Pending")
        self.pending.hide()
        bubble_lay.addWidget(self.pending)
        # The reply token by token: probability colours where they were computed, alternating
        # shades at the boundaries, a click opens the token's alternatives (and forks).
        self.raw_view = TokenView(fit=True)
        self.raw_view.setAccessibleName("Raw tokens")
        self.raw_view.set_overlay(True)
        self.raw_view.chips = True
        self.raw_view.token_clicked.connect(self._open_popup)
        self.raw_view.hide()
        bubble_lay.addWidget(self.raw_view)
        self.raw_summary = QLabel()
        self.raw_summary.setObjectName("Muted")
        self.raw_summary.setWordWrap(True)  # a long line must not widen the chat column
        self.raw_summary.hide()
        bubble_lay.addWidget(self.raw_summary)
        self.footer = QLabel()
        self.footer.setObjectName("Footer")
        self.footer.setWordWrap(True)
        self.footer.hide()
        indented = QVBoxLayout()
        indented.setContentsMargins(AVATAR + 10, 0, 0, 0)
        indented.setSpacing(4)
        indented.addWidget(self.bubble)
        indented.addWidget(self.footer)
        outer.addLayout(indented)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self.flush)
        self._copied_timer = QTimer(self)
        self._copied_timer.setSingleShot(True)
        self._copied_timer.setInterval(COPIED_FEEDBACK_MS)
        self._copied_timer.timeout.connect(self._restore_copy_icon)

        self.set_sibling(*sibling)
        self.flush()
        self.set_stats(message.meta.get("stats") or {})

    def _build_header(self) -> QHBoxLayout:
        role = self.message.role
        header = QHBoxLayout()
        header.setSpacing(8)
        self.avatar = QLabel()
        self.avatar.setFixedSize(AVATAR, AVATAR)
        self.avatar.setPixmap(icons.avatar(role, theme.is_dark(), AVATAR))
        self.role_label = QLabel(ROLE_NAMES.get(role, role))
        self.role_label.setObjectName("RoleLabel")
        header.addWidget(self.avatar)
        header.addWidget(self.role_label)
        header.addStretch(1)

        self.prev_btn = common.flat_button("chevron-left", "Previous version")
        self.branch_label = QLabel()
        self.branch_label.setObjectName("Muted")
        self.next_btn = common.flat_button("chevron-right", "Next version")
        self.prev_btn.clicked.connect(lambda: self.branch_requested.emit(-1))
        self.next_btn.clicked.connect(lambda: self.branch_requested.emit(1))
        for w in (self.prev_btn, self.branch_label, self.next_btn):
            header.addWidget(w)

        self.action_bar = QWidget()
        actions = QHBoxLayout(self.action_bar)
        actions.setContentsMargins(6, 0, 0, 0)
        actions.setSpacing(2)
        self.raw_btn = common.flat_button("tokens", "Show raw tokens", checkable=True)
        self.raw_btn.toggled.connect(self._show_raw)
        self.raw_btn.hide()
        self.copy_btn = common.flat_button("copy", "Copy message")
        self.copy_btn.clicked.connect(self._copy)
        actions.addWidget(self.raw_btn)
        actions.addWidget(self.copy_btn)
        self.regenerate_btn: QToolButton | None = None
        self.edit_btn: QToolButton | None = None
        self.continue_btn: QToolButton | None = None
        if role == "assistant":
            self.continue_btn = common.flat_button("continue", "Continue this reply (keeps this version)")
            self.continue_btn.clicked.connect(self.continue_requested)
            self.continue_btn.hide()
            actions.addWidget(self.continue_btn)
            self.regenerate_btn = common.flat_button("refresh", "Regenerate (keeps this version)")
            self.regenerate_btn.clicked.connect(self.regenerate_requested)
            actions.addWidget(self.regenerate_btn)
        elif role == "user":
            self.edit_btn = common.flat_button("edit", "Edit and resend (keeps this version)")
            self.edit_btn.clicked.connect(self.start_edit)
            actions.addWidget(self.edit_btn)
        policy = self.action_bar.sizePolicy()
        policy.setRetainSizeWhenHidden(True)  # no layout jump when the actions appear on hover
        self.action_bar.setSizePolicy(policy)
        self.action_bar.hide()
        header.addWidget(self.action_bar)
        return header

    # ----- hover actions ---------------------------------------------------------------------

    def set_actions_pinned(self, pinned: bool) -> None:
        """Keep the action buttons visible without hovering (the chat pins the last message)."""
        self._pinned = pinned
        self.action_bar.setVisible(pinned or self.underMouse())

    def enterEvent(self, event: QEnterEvent) -> None:
        self.action_bar.show()
        super().enterEvent(event)

    def leaveEvent(self, event: QEvent) -> None:
        self.action_bar.setVisible(self._pinned)
        super().leaveEvent(event)

    # ----- content ---------------------------------------------------------------------------

    def set_sibling(self, index: int, count: int) -> None:
        """Branch navigation "‹ i/n ›": ``index`` is 0-based among ``count`` versions."""
        show = count > 1
        self.branch_label.setText(f"{index + 1} / {count}")
        self.branch_label.setAccessibleName(f"Version {index + 1} of {count}")
        for w in (self.prev_btn, self.branch_label, self.next_btn):
            w.setVisible(show)
        self.prev_btn.setEnabled(index > 0)
        self.next_btn.setEnabled(index < count - 1)

    def set_message(self, message: Message) -> None:
        """Show ``message`` (same role) instead, re-rendering only the parts that differ."""
        self.message = message
        self._fork_point = fork_point(message)
        self.flush()
        self.set_stats(message.meta.get("stats") or {})

    def append_event(self, ev: TokenEvent) -> None:
        """The shown reply grew by ``ev`` (already added to ``self.message`` by its owner); the
        display catches up within RENDER_INTERVAL_MS."""
        if self._raw:
            if ev.continues:
                self.raw_view.append_text(ev.text)
            else:
                self.raw_view.append_token(record_of(ev))
        if not self._timer.isActive():
            self._timer.start()

    def finish(self, stats: dict) -> None:
        """The reply ended: render what is left and show its stats."""
        self.streaming = False
        self.message.meta["stats"] = stats
        if "error" in stats:
            self.message.meta["error"] = stats["error"]
        self.flush()
        self.set_stats(stats)

    def flush(self) -> None:
        """Render now (the streaming timer calls this; so do tests and ``finish``)."""
        self._timer.stop()
        started = time.perf_counter()
        self._render()
        # A very long reply costs more per render: render it less often, so that rendering
        # never takes more than about a fifth of the GUI thread's time.
        elapsed_ms = (time.perf_counter() - started) * 1000
        self._timer.setInterval(max(RENDER_INTERVAL_MS, round(4 * elapsed_ms)))

    def _render(self) -> None:
        dark = theme.is_dark()
        force = dark != self._dark_rendered
        self._dark_rendered = dark
        segments = group_parts(fork_marked(self.message, self._fork_point))
        for i, segment in enumerate(segments):
            if i < len(self._segments) and self._segments[i].kind == segment.kind:
                slot = self._segments[i]
            else:
                self._drop_segments(i)
                slot = _Slot(segment.kind, self._make_segment(segment.kind))
                self.parts_box.addWidget(slot.widget)
                self._segments.append(slot)
            slot.blank = segment.kind == TEXT and not segment.body.strip()
            self._update_segment(slot.widget, segment, force)
        self._drop_segments(len(segments))
        raw_on = self._raw and self.raw_btn.isChecked()
        if raw_on:
            self.raw_summary.setText(raw_summary(self.raw_view.tokens))
        self.raw_view.setVisible(raw_on)
        self.raw_summary.setVisible(raw_on)
        for slot in self._segments:
            slot.widget.setVisible(not raw_on and self.edit_box is None and not slot.blank)
        self.pending.setVisible(self.streaming and all(slot.blank for slot in self._segments))

    def _drop_segments(self, start: int) -> None:
        for slot in self._segments[start:]:
            # Off the layout now: a nested event loop (a context menu's) would show it until
            # the deletion runs.
            slot.widget.hide()
            self.parts_box.removeWidget(slot.widget)
            slot.widget.deleteLater()
        del self._segments[start:]

    def _make_segment(self, kind: str) -> QWidget:
        if kind == TEXT:
            widget = RichText()
            widget.copy_requested.connect(self.copy_requested)
            return widget
        if kind == PYTHON:
            return ToolCallBlock()
        return FoldBlock(kind)

    def _update_segment(self, widget: QWidget, segment: Segment, force: bool) -> None:
        if isinstance(widget, RichText):
            # Colours are baked into the HTML, so a theme switch changes it and re-renders.
            if self.message.role == "assistant":
                rendered = render_markdown(segment.body, dark=self._dark_rendered)
                accent = theme.colors().accent
                mark = f'<span style="color:{accent}; font-weight:700">{FORK_GLYPH}</span>'
                widget.set_content(rendered.html.replace(FORK_MARK, mark), rendered.code_blocks)
            else:
                widget.set_content(render_plain(segment.body))
        else:
            assert isinstance(widget, ToolCallBlock | FoldBlock)
            result = segment.result.replace(FORK_MARK, FORK_GLYPH) if segment.result is not None else None
            shown = replace(segment, body=segment.body.replace(FORK_MARK, FORK_GLYPH), result=result)
            widget.update_segment(shown, self.streaming)
            if force:
                widget.refresh_colors()

    def segment_widgets(self) -> list[QWidget]:
        """The part widgets in display order (RichText, ToolCallBlock or FoldBlock)."""
        return [slot.widget for slot in self._segments]

    def set_stats(self, stats: dict) -> None:
        """Show the reply's stats (and the sampling values and checkpoint from its meta)."""
        meta = dict(self.message.meta)
        if stats:
            meta["stats"] = stats
        text, tip = format_stats(meta) if self.message.role == "assistant" else ("", "")
        if self.continue_btn is not None:
            stopped = (meta.get("stats") or {}).get("stopped")
            self.continue_btn.setVisible(
                not self.streaming and stopped in CONTINUABLE and len(self.message.tokens) > 0
            )
        self.footer.setText(text)
        self.footer.setToolTip(tip)
        self.footer.setVisible(bool(text))

    # ----- raw tokens ------------------------------------------------------------------------

    def set_draft_colours(self, on: bool) -> None:
        """The token view colours speculative decoding's marks (or, off, the probabilities)."""
        self.raw_view.set_drafts_shown(on)
        self.raw_view.set_overlay(not on)

    def set_raw_tokens(self, tokens: list[TokenRecord] | None) -> None:
        """Show the raw token stream (special tokens by name, probabilities where computed), or,
        with None, the rendered message again. An empty list shows tokens as they stream in."""
        self._raw = tokens is not None
        self.raw_view.set_tokens(list(tokens or []))
        self.raw_btn.setVisible(tokens is not None)
        self.raw_btn.setChecked(tokens is not None)  # a change re-renders through _show_raw
        self.flush()

    def _show_raw(self, on: bool) -> None:
        self.raw_btn.setToolTip("Show the rendered message" if on else "Show raw tokens")
        self.flush()

    def _open_popup(self, index: int, where: QPoint) -> None:
        """A click on token ``index``: its alternatives, each a fork."""
        if not self._raw or not 0 <= index < len(self.raw_view.tokens):
            return
        refusal = ""
        if self.streaming:
            refusal = STREAMING_FORK
        if self.popup is not None:
            self.popup.close()
        token, inside = self.raw_view.tokens[index], self.message.role == "assistant"
        self.popup = ForkPopup(index, token, refusal, race=True, parent=self, inside=inside)
        self.popup.chosen.connect(
            lambda token, text, race: self.fork_requested.emit(index, token, text, race)
        )
        self.popup.inside_requested.connect(lambda: self.inside_requested.emit(index))
        self.popup.show_at(where)

    # ----- actions ---------------------------------------------------------------------------

    def _copy(self) -> None:
        self.copy_requested.emit(copy_text(self.message))
        self.copy_btn.setIcon(icons.icon("check", theme.colors().success))
        self._copied_timer.start()

    def _restore_copy_icon(self) -> None:
        self.copy_btn.setIcon(icons.icon("copy", theme.colors().muted))

    def start_edit(self) -> None:
        """Swap the user message for an inline editor (Save sends it as a new branch)."""
        if self.edit_box is not None:
            return
        self.edit_box = EditBox(self.message.plain_text())
        self.edit_box.submitted.connect(self._on_edit_submitted)
        self.edit_box.cancelled.connect(self._end_edit)
        bubble_lay = self.bubble.layout()
        assert bubble_lay is not None  # the bubble's QVBoxLayout, made in __init__
        bubble_lay.addWidget(self.edit_box)
        self.flush()
        self.edit_box.editor.setFocus()

    def _on_edit_submitted(self, text: str) -> None:
        self._end_edit()
        self.edit_submitted.emit(text)

    def _end_edit(self) -> None:
        if self.edit_box is None:
            return
        self.edit_box.hide()
        self.edit_box.deleteLater()
        self.edit_box = None
        self.flush()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and theme.is_dark() != self._dark_rendered:
            self.avatar.setPixmap(icons.avatar(self.message.role, theme.is_dark(), AVATAR))
            common.retint_flat_buttons(self)
            self.flush()
