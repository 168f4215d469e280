"""The scrolling conversation: message widgets, the streaming reply, and auto-scroll."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QVBoxLayout, QWidget

from ..engine.messages import Message, TokenEvent
from .message_widget import MessageWidget


class ChatView(QScrollArea):
    """Signals: regenerate_requested(int), edit_requested(int, str), branch_requested(int, int),
    copy_requested(str). Indices are positions in the displayed conversation."""

    regenerate_requested = Signal(int)
    edit_requested = Signal(int, str)
    branch_requested = Signal(int, int)
    copy_requested = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setAccessibleName("Conversation")
        self.container = QWidget()
        self.container.setObjectName("ChatContainer")
        self.column = QVBoxLayout(self.container)
        self.column.setContentsMargins(24, 16, 24, 16)
        self.column.setSpacing(12)
        self.notice = QLabel()
        self.notice.setObjectName("Muted")
        self.notice.setWordWrap(True)
        self.notice.hide()
        self.placeholder = QLabel("Pick a checkpoint and say hello.")
        self.placeholder.setObjectName("Muted")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.column.addWidget(self.notice)
        self.column.addWidget(self.placeholder, 1)
        self.column.addStretch(0)
        self.setWidget(self.container)
        self.widgets: list[MessageWidget] = []
        self.streaming: MessageWidget | None = None
        self._stick_to_bottom = True
        self.raw_mode = False
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range_changed)

    # ----- content -----------------------------------------------------------------------

    def clear(self) -> None:
        for w in self.widgets:
            w.deleteLater()
        self.widgets = []
        self.streaming = None
        self.placeholder.show()

    def set_mode_notice(self, text: str | None) -> None:
        self.notice.setText(text or "")
        self.notice.setVisible(bool(text))

    def set_messages(self, messages: list[Message], siblings: list | None = None) -> None:
        self.clear()
        for i, message in enumerate(messages):
            sib = tuple(siblings[i]) if siblings and i < len(siblings) else (0, 1)
            self._add(message, sib)
        self._stick_to_bottom = True
        QTimer.singleShot(0, self._scroll_to_bottom)

    def _add(self, message: Message, sibling: tuple[int, int] = (0, 1)) -> MessageWidget:
        w = MessageWidget(message, sibling)
        index = len(self.widgets)
        w.copy_requested.connect(self.copy_requested)
        w.regenerate_requested.connect(lambda i=index: self.regenerate_requested.emit(i))
        w.edit_submitted.connect(lambda text, i=index: self.edit_requested.emit(i, text))
        w.branch_requested.connect(lambda d, i=index: self.branch_requested.emit(i, d))
        self.column.insertWidget(self.column.count() - 2, w)
        self.widgets.append(w)
        self.placeholder.hide()
        if self.raw_mode:
            w.set_raw_tokens(self._raw_of(message))
        return w

    def begin_assistant(self, meta: dict) -> None:
        self.streaming = self._add(Message("assistant", [], dict(meta)))
        self._stick_to_bottom = True

    def append_event(self, ev: TokenEvent) -> None:
        if self.streaming is not None:
            self.streaming.append_event(ev)

    def end_assistant(self, stats: dict) -> None:
        if self.streaming is None:
            return
        self.streaming.flush()
        self.streaming.set_stats(stats)
        self.streaming = None

    # ----- raw tokens ----------------------------------------------------------------------

    def set_raw_mode(self, on: bool, detokenize=None) -> None:
        """Show each message's raw token stream; ``detokenize(id) -> str`` names the tokens."""
        self.raw_mode = on
        self._detokenize = detokenize
        for w in self.widgets:
            w.set_raw_tokens(self._raw_of(w.message) if on else None)

    def _raw_of(self, message: Message) -> list[tuple[str, bool]] | None:
        raw = message.meta.get("raw")
        fn = getattr(self, "_detokenize", None)
        if not raw or fn is None:
            return None
        return [(fn(tok_id), bool(forced)) for tok_id, forced in raw]

    # ----- scrolling -----------------------------------------------------------------------

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._stick_to_bottom = value >= bar.maximum() - 24

    def _on_range_changed(self, _lo: int, _hi: int) -> None:
        if self._stick_to_bottom:
            self._scroll_to_bottom()

    def _scroll_to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
