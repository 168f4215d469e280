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

import math
import time
from dataclasses import dataclass

from PySide6.QtCore import QEvent, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QEnterEvent, QKeyEvent, QTextOption
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop.engine.messages import (
    PYTHON,
    PYTHON_OUTPUT,
    TEXT,
    THOUGHT,
    TOOL_QUERY,
    TOOL_RESULT,
    Message,
    TokenEvent,
)
from desktop.ui import icons, theme, widgets
from desktop.ui.markdown_render import COPY_CODE_SCHEME, render_markdown, render_plain, render_raw_tokens

RENDER_INTERVAL_MS = 50
COPIED_FEEDBACK_MS = 1500
ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
AVATAR = 24
STOP_REASONS = {"cancelled": "stopped", "max_tokens": "max tokens reached", "context": "context full"}


@dataclass
class Segment:
    """What one part widget shows: a text run, or a tool call with its attached result."""

    kind: str  # TEXT, PYTHON, TOOL_QUERY or THOUGHT
    body: str
    result: str | None = None


def group_parts(message: Message) -> list[Segment]:
    """Parts → display segments: a result part attaches to the call before it."""
    segments: list[Segment] = []
    results = {PYTHON_OUTPUT: PYTHON, TOOL_RESULT: TOOL_QUERY}
    for part in message.parts:
        if part.kind in results:
            call = results[part.kind]
            if segments and segments[-1].kind == call and segments[-1].result is None:
                segments[-1].result = part.text
            else:
                segments.append(Segment(call, "", part.text))
        elif part.kind in (PYTHON, TOOL_QUERY, THOUGHT):
            segments.append(Segment(part.kind, part.text))
        elif segments and segments[-1].kind == TEXT:
            segments[-1].body += part.text
        else:  # text, and any kind we do not know yet: shown rather than dropped
            segments.append(Segment(TEXT, part.text))
    return segments


def copy_text(message: Message) -> str:
    """What "Copy" puts on the clipboard: the prose, or every part when there is no prose."""
    return message.plain_text() or "".join(p.text for p in message.parts)


def format_stats(meta: dict) -> tuple[str, str]:
    """The footer line and its tooltip, from a message's meta (stats, sampling, checkpoint)."""
    stats = meta.get("stats") or {}
    bits: list[str] = []
    if meta.get("error") or stats.get("error"):
        bits.append(f"⚠ {meta.get('error') or stats.get('error')}")
    if stats.get("new_tokens"):
        bits.append(f"{stats['new_tokens']} tokens")
    if stats.get("decode_tok_s"):
        bits.append(f"{stats['decode_tok_s']:.1f} tok/s")
    if stats.get("ttft_ms"):
        bits.append(f"TTFT {stats['ttft_ms']:.0f} ms")
    if stats.get("stopped") in STOP_REASONS:
        bits.append(STOP_REASONS[stats["stopped"]])
    if stats.get("greedy_fallbacks"):  # the distribution degenerated (e.g. a tiny temperature)
        bits.append(f"⚠ {stats['greedy_fallbacks']} token(s) taken greedily")
    sampling = meta.get("sampling") or {}
    if sampling:
        t = sampling.get("temperature")
        if t == 0:
            bits.append("greedy")
        else:
            knobs = [f"T {t:g}"] if t is not None else []
            if sampling.get("top_k"):
                knobs.append(f"top-k {sampling['top_k']}")
            if sampling.get("top_p") not in (None, 1, 1.0):
                knobs.append(f"top-p {sampling['top_p']:g}")
            if sampling.get("min_p"):
                knobs.append(f"min-p {sampling['min_p']:g}")
            if sampling.get("repetition_penalty") not in (None, 1, 1.0):
                knobs.append(f"rep {sampling['repetition_penalty']:g}")
            if sampling.get("seed") is not None:
                knobs.append(f"seed {sampling['seed']}")
            bits.append(" ".join(knobs))
    if meta.get("name"):  # "sft/d20 · step 1,500", as the exports and the picker name it
        bits.append(str(meta["name"]))
    elif meta.get("tag"):  # replies saved before the name was recorded
        step = meta.get("step")
        bits.append(f"{meta['tag']} · step {step:,}" if isinstance(step, int) else str(meta["tag"]))
    tip_lines = [f"{k.replace('_', ' ')}: {v}" for k, v in sampling.items()]
    tip_lines += [f"{k}: {meta[k]}" for k in ("checkpoint", "era", "dtype", "device") if meta.get(k)]
    if stats.get("prompt_tokens"):
        tip_lines.append(f"prompt tokens: {stats['prompt_tokens']}")
    return "  ·  ".join(bits), "\n".join(tip_lines)


@dataclass
class _Slot:
    kind: str
    widget: QWidget
    blank: bool = False


class RichText(QTextBrowser):
    """Read-only rich text exactly as tall as its content: no inner scroll bar, wheel events go
    to the chat's scroll area, links open in the browser (http/https/mailto only), code blocks'
    "Copy" links emit ``copy_requested`` and no resource (image, file) is ever loaded."""

    copy_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("RichText")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setOpenLinks(False)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.document().setDocumentMargin(0)
        self.document().setIndentWidth(18)  # list indent per level (Qt's 40 px looks sparse in a chat)
        self.viewport().setAutoFillBackground(False)
        self.anchorClicked.connect(self._on_anchor)
        self._html: str | None = None
        self.code_blocks: list[str] = []

    def set_content(self, html: str, code_blocks: list[str] | None = None) -> None:
        if html == self._html:
            return
        self._html = html
        self.code_blocks = list(code_blocks or [])
        self.setHtml(html)
        self._fit()

    def html_source(self) -> str:
        """The HTML last given to ``set_content`` (before Qt's own re-serialisation)."""
        return self._html or ""

    def _fit(self) -> None:
        doc = self.document()
        doc.setTextWidth(max(1, self.viewport().width()))
        height = math.ceil(doc.size().height())
        if height != self.height():
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._fit()

    def wheelEvent(self, event) -> None:
        event.ignore()  # let the conversation scroll

    def loadResource(self, _type: int, _name: QUrl | str) -> None:
        return None  # never fetch images or files named by (untrusted) model output

    def _on_anchor(self, url: QUrl) -> None:
        if url.scheme() == COPY_CODE_SCHEME:
            index = int(url.path()) if url.path().isdigit() else -1
            if 0 <= index < len(self.code_blocks):
                self.copy_requested.emit(self.code_blocks[index])
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)


class ToolCallBlock(QFrame):
    """A calculator call and its forced result: ``expression`` and ``output`` hold the texts."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ToolBlock")
        self.setAccessibleName("Calculator tool call")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 7, 10, 8)
        lay.setSpacing(5)
        header = QHBoxLayout()
        header.setSpacing(6)
        self.icon = QLabel()
        self.title = QLabel("calculator")
        self.title.setObjectName("ToolTitle")
        self.title.setToolTip(
            "The model called nanochat's calculator tool; the result was computed, not generated"
        )
        header.addWidget(self.icon)
        header.addWidget(self.title)
        header.addStretch(1)
        body = QHBoxLayout()
        body.setSpacing(10)
        self.code = QLabel()
        self.code.setObjectName("ToolCode")
        self.code.setWordWrap(True)
        self.code.setTextFormat(Qt.TextFormat.PlainText)
        self.code.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.code.setAccessibleName("Expression")
        self.result = QLabel()
        self.result.setObjectName("ToolResult")
        self.result.setTextFormat(Qt.TextFormat.PlainText)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result.setAccessibleName("Result")
        self.result.setToolTip("Forced by the tool: these tokens were not sampled")
        body.addWidget(self.code, 1)
        body.addWidget(self.result, 0, Qt.AlignmentFlag.AlignVCenter)
        lay.addLayout(header)
        lay.addLayout(body)
        self.expression = ""
        self.output = ""
        self.refresh_colors()

    def refresh_colors(self) -> None:
        label = theme.tool_colors(theme.is_dark()).label
        self.icon.setPixmap(icons.icon("calculator", label, 16).pixmap(16, 16))

    def update_segment(self, segment: Segment, streaming: bool) -> None:
        self.expression = segment.body
        self.output = segment.result or ""
        self.code.setText(segment.body.strip() or "…")
        if segment.result is not None:
            self.result.setText(f"= {segment.result.strip() or '…'}")
        elif not streaming:
            self.result.setText("no result")
        self.result.setVisible(segment.result is not None or not streaming)


class FoldBlock(QFrame):
    """A fork tool query (with its result) or a thought, folded behind a toggle."""

    def __init__(self, kind: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.kind = kind
        thought = kind == THOUGHT
        self.setObjectName("ThoughtBlock" if thought else "ToolBlock")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 5, 6, 7)
        lay.setSpacing(4)
        header = QHBoxLayout()
        header.setSpacing(6)
        self.icon = QLabel()
        self.title = QLabel("thought" if thought else "tool call")
        self.title.setObjectName("ThoughtTitle" if thought else "ToolTitle")
        self.preview = QLabel()
        self.preview.setObjectName("ThoughtPreview")
        self.preview.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.toggle = widgets.flat_button("chevron-down", "Show or hide")
        self.toggle.setAccessibleName(f"Show {self.title.text()}")
        header.addWidget(self.icon)
        header.addWidget(self.title)
        header.addWidget(self.preview, 100)
        header.addStretch(1)  # takes the room while the preview is hidden
        header.addWidget(self.toggle)
        self.body = QLabel()
        self.body.setObjectName("ThoughtText" if thought else "ToolCode")
        self.body.setWordWrap(True)
        self.body.setTextFormat(Qt.TextFormat.PlainText)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result = QLabel()
        self.result.setObjectName("ToolResult")
        self.result.setWordWrap(True)
        self.result.setTextFormat(Qt.TextFormat.PlainText)
        self.result.hide()
        result_row = QHBoxLayout()
        result_row.addWidget(self.result)
        result_row.addStretch(1)  # the result chip is as wide as its text
        lay.addLayout(header)
        lay.addWidget(self.body)
        lay.addLayout(result_row)
        self._open = False
        self.toggle.clicked.connect(lambda: self.set_open(not self._open))
        self._result: str | None = None
        self.refresh_colors()
        self.set_open(not thought)  # thoughts start folded; tool calls start open

    def refresh_colors(self) -> None:
        c = theme.colors()
        color = c.muted if self.kind == THOUGHT else theme.tool_colors(theme.is_dark()).label
        self.icon.setPixmap(
            icons.icon("thought" if self.kind == THOUGHT else "code", color, 16).pixmap(16, 16)
        )
        chevron = "chevron-up" if self._open else "chevron-down"
        self.toggle.setProperty("icon_name", chevron)
        self.toggle.setIcon(icons.icon(chevron, c.muted))

    def set_open(self, open_: bool) -> None:
        self._open = open_
        self.body.setVisible(open_)
        self.result.setVisible(open_ and self._result is not None)
        self.preview.setVisible(not open_)
        self.toggle.setToolTip(f"{'Hide' if open_ else 'Show'} {self.title.text()}")
        self.refresh_colors()

    def is_open(self) -> bool:
        return self._open

    def update_segment(self, segment: Segment, _streaming: bool) -> None:
        self._result = segment.result
        self.body.setText(segment.body.strip())
        first_line = segment.body.strip().split("\n", 1)[0]
        self.preview.setText(
            self.preview.fontMetrics().elidedText(first_line, Qt.TextElideMode.ElideRight, 400)
        )
        if segment.result is not None:
            self.result.setText(f"→ {segment.result.strip()}")
        self.result.setVisible(self.is_open() and segment.result is not None)


class EditBox(QWidget):
    """Inline editor for a user message: Ctrl+Enter saves, Esc cancels."""

    submitted = Signal(str)
    cancelled = Signal()

    def __init__(self, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.editor = QPlainTextEdit(text)
        self.editor.setObjectName("Field")
        self.editor.setAccessibleName("Edit message")
        self.editor.setMinimumHeight(80)
        self.editor.installEventFilter(self)
        self.save_btn = QPushButton("Save && send")
        self.save_btn.setObjectName("Primary")
        self.save_btn.setToolTip("Send the edited message as a new branch (Ctrl+Enter); the original stays")
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setToolTip("Keep the original message (Esc)")
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.cancel_btn)
        row.addWidget(self.save_btn)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.editor)
        lay.addLayout(row)
        self.save_btn.clicked.connect(self._save)
        self.cancel_btn.clicked.connect(self.cancelled)

    def _save(self) -> None:
        if self.editor.toPlainText().strip():
            self.submitted.emit(self.editor.toPlainText())

    def eventFilter(self, obj, event) -> bool:
        if obj is self.editor and isinstance(event, QKeyEvent) and event.type() == QEvent.Type.KeyPress:
            if event.key() == Qt.Key.Key_Escape:
                self.cancelled.emit()
                return True
            ctrl = bool(event.modifiers() & Qt.KeyboardModifier.ControlModifier)
            if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and ctrl:
                self._save()
                return True
        return super().eventFilter(obj, event)


class MessageWidget(QFrame):
    """One message row.

    Signals:
        copy_requested(str): text to put on the clipboard (the message, or one code block).
        regenerate_requested(): answer again (assistant messages).
        edit_submitted(str): the edited text of a user message, to send as a new branch.
        branch_requested(int): -1 / +1 to show the previous / next sibling version.
    """

    copy_requested = Signal(str)
    regenerate_requested = Signal()
    edit_submitted = Signal(str)
    branch_requested = Signal(int)

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
        self._raw_tokens: list[tuple[str, bool]] | None = None
        self.edit_box: EditBox | None = None

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
        self.raw_view = RichText()
        self.raw_view.setAccessibleName("Raw tokens")
        self.raw_view.hide()
        bubble_lay.addWidget(self.raw_view)
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

        self.prev_btn = widgets.flat_button("chevron-left", "Previous version")
        self.branch_label = QLabel()
        self.branch_label.setObjectName("Muted")
        self.next_btn = widgets.flat_button("chevron-right", "Next version")
        self.prev_btn.clicked.connect(lambda: self.branch_requested.emit(-1))
        self.next_btn.clicked.connect(lambda: self.branch_requested.emit(1))
        for w in (self.prev_btn, self.branch_label, self.next_btn):
            header.addWidget(w)

        self.action_bar = QWidget()
        actions = QHBoxLayout(self.action_bar)
        actions.setContentsMargins(6, 0, 0, 0)
        actions.setSpacing(2)
        self.raw_btn = widgets.flat_button("tokens", "Show raw tokens", checkable=True)
        self.raw_btn.toggled.connect(self._show_raw)
        self.raw_btn.hide()
        self.copy_btn = widgets.flat_button("copy", "Copy message")
        self.copy_btn.clicked.connect(self._copy)
        actions.addWidget(self.raw_btn)
        actions.addWidget(self.copy_btn)
        self.regenerate_btn: QToolButton | None = None
        self.edit_btn: QToolButton | None = None
        if role == "assistant":
            self.regenerate_btn = widgets.flat_button("refresh", "Regenerate (keeps this version)")
            self.regenerate_btn.clicked.connect(self.regenerate_requested)
            actions.addWidget(self.regenerate_btn)
        elif role == "user":
            self.edit_btn = widgets.flat_button("edit", "Edit and resend (keeps this version)")
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
        self.flush()
        self.set_stats(message.meta.get("stats") or {})

    def append_event(self, ev: TokenEvent) -> None:
        """The shown reply grew by ``ev`` (already added to ``self.message`` by its owner); the
        display catches up within RENDER_INTERVAL_MS."""
        if self._raw_tokens is not None and not ev.continues:
            self._raw_tokens.append((ev.special or ev.text, ev.forced))
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
        segments = group_parts(self.message)
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
        raw_on = self._raw_tokens is not None and self.raw_btn.isChecked()
        if raw_on:
            self.raw_view.set_content(render_raw_tokens(self._raw_tokens or [], dark=dark))
        self.raw_view.setVisible(raw_on)
        for slot in self._segments:
            slot.widget.setVisible(not raw_on and self.edit_box is None and not slot.blank)
        self.pending.setVisible(self.streaming and all(slot.blank for slot in self._segments))

    def _drop_segments(self, start: int) -> None:
        for slot in self._segments[start:]:
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
                widget.set_content(rendered.html, rendered.code_blocks)
            else:
                widget.set_content(render_plain(segment.body))
        else:
            assert isinstance(widget, ToolCallBlock | FoldBlock)
            widget.update_segment(segment, self.streaming)
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
        self.footer.setText(text)
        self.footer.setToolTip(tip)
        self.footer.setVisible(bool(text))

    # ----- raw tokens ------------------------------------------------------------------------

    def set_raw_tokens(self, tokens: list[tuple[str, bool]] | None) -> None:
        """Show the raw token stream ((text, forced) pairs, special tokens by name), or, with
        None, the rendered message again. An empty list shows tokens as they stream in."""
        self._raw_tokens = list(tokens) if tokens is not None else None
        self.raw_btn.setVisible(tokens is not None)
        self.raw_btn.setChecked(tokens is not None)  # a change re-renders through _show_raw
        self.flush()

    def _show_raw(self, on: bool) -> None:
        self.raw_btn.setToolTip("Show the rendered message" if on else "Show raw tokens")
        self.flush()

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
        self.edit_box.deleteLater()
        self.edit_box = None
        self.flush()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and theme.is_dark() != self._dark_rendered:
            self.avatar.setPixmap(icons.avatar(self.message.role, theme.is_dark(), AVATAR))
            widgets.retint_flat_buttons(self)
            self.flush()
