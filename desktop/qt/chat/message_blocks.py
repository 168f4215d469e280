"""The blocks a chat message is drawn with: rich text that is as tall as its content, a
calculator call with its forced result, a folding block for the fork's thoughts and tool
queries, and the box that edits a sent message (:mod:`.message_widget` lays them out)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from PySide6.QtCore import QEvent, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QKeyEvent, QTextOption
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QTextBrowser,
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
    Part,
)
from desktop.qt.widgets import common, icons, theme
from desktop.qt.widgets.markdown_render import COPY_CODE_SCHEME


@dataclass
class Segment:
    """What one part widget shows: a text run, or a tool call with its attached result."""

    kind: str  # TEXT, PYTHON, TOOL_QUERY or THOUGHT
    body: str
    result: str | None = None


# Stands in the text for a fork point until the HTML is made (a private-use character no model writes).
FORK_MARK = "\ue042"


def fork_point(message: Message) -> tuple[int, str] | None:
    """Where ``message`` forked (its meta's ``fork.at``, a token index), as (part index, the
    part's text before the fork): the reply up to the fork rebuilt from its own events says so.
    None for a reply that did not fork or whose trace does not reach. Computed once per message:
    what comes before a fork does not change while the rest streams."""
    fork = message.meta.get("fork")
    at = fork.get("at") if isinstance(fork, dict) else None
    if not isinstance(at, int) or not 0 < at <= len(message.tokens):
        return None
    before = Message(message.role)
    for ev in message.tokens.events(at):
        before.add_event(ev)
    return (len(before.parts) - 1, before.parts[-1].text) if before.parts else None


def fork_marked(message: Message, point: tuple[int, str] | None) -> Message:
    """``message`` with :data:`FORK_MARK` at its ``point`` (:func:`fork_point`), for display."""
    if point is None:
        return message
    index, head = point
    if not 0 <= index < len(message.parts) or not message.parts[index].text.startswith(head):
        return message
    parts = [Part(p.kind, p.text) for p in message.parts]
    parts[index].text = head + FORK_MARK + parts[index].text[len(head) :]
    return Message(message.role, parts, message.meta, message.tokens)


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
        self.toggle = common.flat_button("chevron-down", "Show or hide")
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
