"""One chat message: role, rendered parts (text, calculator tool calls, fork blocks), actions, stats.

Streaming is cheap: ``append_event`` only grows the model Message; a coalescing timer re-renders
the last part at most every 50 ms, so hundreds of tokens a second never stall the GUI thread.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..engine.messages import (
    PYTHON,
    PYTHON_OUTPUT,
    TEXT,
    THOUGHT,
    TOOL_QUERY,
    TOOL_RESULT,
    Message,
    TokenEvent,
)
from . import theme
from .markdown_render import code_html, to_html

RENDER_INTERVAL_MS = 50
ROLE_NAMES = {"user": "You", "assistant": "Model", "system": "System"}
COLLAPSIBLE = {TOOL_QUERY: "Tool query", TOOL_RESULT: "Tool result", THOUGHT: "Thought"}


def _label(rich: bool = True) -> QLabel:
    label = QLabel()
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.RichText if rich else Qt.TextFormat.PlainText)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setOpenExternalLinks(False)
    label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    return label


class ToolCallBlock(QFrame):
    """A calculator call with its forced result, drawn apart from model text."""

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("ToolBlock")
        self.setAccessibleName("Calculator tool call")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        lay.setSpacing(4)
        self.title = QLabel("TOOL CALL  ·  calculator")
        self.title.setObjectName("ToolTitle")
        row = QHBoxLayout()
        self.code = _label()
        self.code.setObjectName("ToolCode")
        self.result = QLabel()
        self.result.setObjectName("ToolResult")
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result.hide()
        row.addWidget(self.code, 1)
        row.addWidget(self.result, 0, Qt.AlignmentFlag.AlignRight)
        lay.addWidget(self.title)
        lay.addLayout(row)
        self.expression = ""
        self.output = ""

    def set_expression(self, text: str) -> None:
        self.expression = text
        self.code.setText(code_html(text.strip()))

    def set_output(self, text: str) -> None:
        self.output = text
        self.result.setText("= " + html.escape(text.strip()))
        self.result.setVisible(bool(text))


class CollapsibleBlock(QFrame):
    """Fork blocks (<QUERY_TOOL>, <THOUGHT_START>) that users fold away."""

    def __init__(self, title: str) -> None:
        super().__init__()
        self.setObjectName("Collapsible")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 4)
        self.toggle = QToolButton()
        self.toggle.setText(title)
        self.toggle.setCheckable(True)
        self.toggle.setChecked(True)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setAutoRaise(True)
        self.body = _label()
        self.toggle.toggled.connect(self._on_toggled)
        lay.addWidget(self.toggle)
        lay.addWidget(self.body)

    def _on_toggled(self, open_: bool) -> None:
        self.body.setVisible(open_)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if open_ else Qt.ArrowType.RightArrow)

    def set_text(self, text: str) -> None:
        self.body.setText(code_html(text))


class MessageWidget(QFrame):
    """Signals: copy_requested(str), regenerate_requested(), edit_submitted(str), branch_requested(int)."""

    copy_requested = Signal(str)
    regenerate_requested = Signal()
    edit_submitted = Signal(str)
    branch_requested = Signal(int)

    def __init__(self, message: Message, sibling: tuple[int, int] = (0, 1)) -> None:
        super().__init__()
        self.message = message
        self.setObjectName("Bubble")
        self.setProperty("role", message.role)
        self.setAccessibleName(f"{ROLE_NAMES.get(message.role, message.role)} message")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(14, 10, 14, 10)
        outer.setSpacing(6)

        header = QHBoxLayout()
        self.role_label = QLabel(ROLE_NAMES.get(message.role, message.role))
        self.role_label.setObjectName("RoleLabel")
        header.addWidget(self.role_label)
        header.addStretch(1)
        self.branch_label = QLabel()
        self.branch_label.setObjectName("Muted")
        self.prev_btn = self._tool_button("‹", "Previous version", lambda: self.branch_requested.emit(-1))
        self.next_btn = self._tool_button("›", "Next version", lambda: self.branch_requested.emit(1))
        for w in (self.prev_btn, self.branch_label, self.next_btn):
            header.addWidget(w)
        self.set_sibling(*sibling)
        self.copy_btn = self._tool_button("Copy", "Copy this message", self._copy)
        header.addWidget(self.copy_btn)
        if message.role == "assistant":
            header.addWidget(
                self._tool_button(
                    "Regenerate", "Answer again (keeps this version)", self.regenerate_requested.emit
                )
            )
        elif message.role == "user":
            header.addWidget(
                self._tool_button("Edit", "Edit and resend (keeps this version)", self._start_edit)
            )
        outer.addLayout(header)

        self.parts_box = QVBoxLayout()
        self.parts_box.setSpacing(6)
        outer.addLayout(self.parts_box)
        self.editor: QPlainTextEdit | None = None
        self.raw_view = _label()
        self.raw_view.hide()
        outer.addWidget(self.raw_view)
        self.footer = QLabel()
        self.footer.setObjectName("Footer")
        self.footer.setWordWrap(True)
        self.footer.hide()
        outer.addWidget(self.footer)

        self._part_widgets: list[QWidget] = []
        self._dirty = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self.render_parts)
        self.render_parts()
        if message.meta.get("stats"):
            self.set_stats(message.meta["stats"])

    def _tool_button(self, text: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAccessibleName(tip)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    # ----- content -----------------------------------------------------------------------

    def set_sibling(self, index: int, count: int) -> None:
        show = count > 1
        self.branch_label.setText(f"{index + 1}/{count}")
        for w in (self.prev_btn, self.branch_label, self.next_btn):
            w.setVisible(show)
        self.prev_btn.setEnabled(index > 0)
        self.next_btn.setEnabled(index < count - 1)

    def _groups(self) -> list[tuple[str, str, str]]:
        """Parts grouped for display: (kind, text, attached output); a python part absorbs its output."""
        groups: list[tuple[str, str, str]] = []
        for part in self.message.parts:
            if part.kind == PYTHON_OUTPUT and groups and groups[-1][0] == PYTHON:
                kind, text, _ = groups[-1]
                groups[-1] = (kind, text, part.text)
            else:
                groups.append((part.kind, part.text, ""))
        return groups

    def render_parts(self) -> None:
        """(Re)build the part widgets; existing widgets of the same kind are updated in place."""
        self._dirty = False
        dark = theme.is_dark()
        groups = self._groups()
        for i, (kind, text, output) in enumerate(groups):
            widget = self._part_widgets[i] if i < len(self._part_widgets) else None
            wanted = {PYTHON: ToolCallBlock, TEXT: QLabel}.get(kind, CollapsibleBlock)
            if kind == PYTHON_OUTPUT:
                wanted = ToolCallBlock
            if not isinstance(widget, wanted):
                if widget is not None:
                    widget.deleteLater()
                widget = (
                    wanted()
                    if wanted is not CollapsibleBlock
                    else CollapsibleBlock(COLLAPSIBLE.get(kind, kind))
                )
                if isinstance(widget, QLabel):
                    widget.setWordWrap(True)
                    widget.setTextFormat(Qt.TextFormat.RichText)
                    widget.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
                    widget.setOpenExternalLinks(False)
                if i < len(self._part_widgets):
                    self._part_widgets[i] = widget
                else:
                    self._part_widgets.append(widget)
                self.parts_box.insertWidget(i, widget)
            if isinstance(widget, ToolCallBlock):
                widget.set_expression(text if kind == PYTHON else "")
                widget.set_output(output if kind == PYTHON else text)
            elif isinstance(widget, CollapsibleBlock):
                widget.set_text(text)
            else:
                widget.setText(
                    to_html(text, dark)
                    if self.message.role == "assistant"
                    else html.escape(text).replace("\n", "<br>")
                )
        for widget in self._part_widgets[len(groups) :]:
            widget.deleteLater()
        del self._part_widgets[len(groups) :]

    def append_event(self, ev: TokenEvent) -> None:
        if ev.text and (ev.special is None or ev.kind != TEXT):
            self.message.append(ev.kind, ev.text)
        elif ev.special is not None and ev.kind in (PYTHON, PYTHON_OUTPUT) and not self._has_open(ev.kind):
            self.message.append(ev.kind, "")  # show the tool block as soon as it opens
        if not self._timer.isActive():
            self._timer.start()

    def _has_open(self, kind: str) -> bool:
        return bool(self.message.parts) and self.message.parts[-1].kind == kind

    def flush(self) -> None:
        self._timer.stop()
        self.render_parts()

    def set_stats(self, stats: dict) -> None:
        bits = []
        if "error" in stats:
            bits.append(f"⚠ {stats['error']}")
        if stats.get("new_tokens"):
            bits.append(f"{stats['new_tokens']} tokens")
        if stats.get("decode_tok_s"):
            bits.append(f"{stats['decode_tok_s']:.1f} tok/s")
        if stats.get("ttft_ms"):
            bits.append(f"TTFT {stats['ttft_ms']:.0f} ms")
        if stats.get("stopped") == "cancelled":
            bits.append("stopped")
        meta = self.message.meta
        sampling = meta.get("sampling") or {}
        if sampling:
            t = sampling.get("temperature")
            bits.append(
                "greedy" if t == 0 else f"T={t} top-k={sampling.get('top_k')} seed={sampling.get('seed')}"
            )
        if meta.get("tag"):
            bits.append(f"{meta['tag']} @ {meta.get('step')}")
        self.footer.setText("  ·  ".join(bits))
        self.footer.setVisible(bool(bits))

    def set_raw_tokens(self, tokens: list[tuple[str, bool]] | None) -> None:
        """Show the raw token stream (special tokens included, forced ones marked) or hide it."""
        if not tokens:
            self.raw_view.hide()
            return
        c = theme.colors()
        pieces = [
            f'<span style="background:{c.output_bg if forced else c.surface}">{html.escape(text)}</span>'
            for text, forced in tokens
        ]
        self.raw_view.setText(
            f'<span style="font-family: monospace">{"&#8203;".join(pieces)}</span>'
            f'<br><span style="color:{c.muted}">{len(tokens)} tokens</span>'
        )
        self.raw_view.show()

    # ----- actions -----------------------------------------------------------------------

    def _copy(self) -> None:
        self.copy_requested.emit(
            self.message.plain_text()
            if self.message.role != "assistant"
            else "".join(p.text for p in self.message.parts)
        )

    def _start_edit(self) -> None:
        if self.editor is not None:
            return
        self.editor = QPlainTextEdit(self.message.plain_text())
        self.editor.setAccessibleName("Edit message")
        save = QPushButton("Send")
        save.setObjectName("Primary")
        cancel = QPushButton("Cancel")
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(cancel)
        row.addWidget(save)
        box = QWidget()
        lay = QVBoxLayout(box)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.editor)
        lay.addLayout(row)
        self.parts_box.addWidget(box)

        def close() -> None:
            box.deleteLater()
            self.editor = None

        save.clicked.connect(lambda: (self.edit_submitted.emit(self.editor.toPlainText()), close()))
        cancel.clicked.connect(close)
