"""The message input: Enter sends, Shift+Enter adds a line (configurable), Esc stops."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout


class _Editor(QPlainTextEdit):
    submit = Signal()
    stop = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.enter_sends = True

    def keyPressEvent(self, event: QKeyEvent) -> None:
        key, mods = event.key(), event.modifiers()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            shift = bool(mods & Qt.KeyboardModifier.ShiftModifier)
            ctrl = bool(mods & Qt.KeyboardModifier.ControlModifier)
            if (self.enter_sends and not shift) or (not self.enter_sends and ctrl):
                self.submit.emit()
                return
        if key == Qt.Key.Key_Escape:
            self.stop.emit()
            return
        super().keyPressEvent(event)


class InputBox(QFrame):
    """Signals: send_requested(str), stop_requested()."""

    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("InputBar")
        self.editor = _Editor()
        self.editor.setObjectName("Input")
        self.editor.setAccessibleName("Message input")
        self.editor.setPlaceholderText("Message the model…  (Enter to send, Shift+Enter for a new line)")
        self.editor.setMaximumHeight(96)
        self.editor.setMinimumHeight(56)
        self.send_btn = QPushButton("Send")
        self.send_btn.setObjectName("Primary")
        self.send_btn.setAccessibleName("Send message")
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setObjectName("Danger")
        self.stop_btn.setAccessibleName("Stop generating")
        self.stop_btn.setToolTip("Stop generating (Esc)")
        self.stop_btn.hide()
        self.hint = QLabel()
        self.hint.setObjectName("Muted")
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_btn)
        buttons.addWidget(self.stop_btn)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(self.editor, 1)
        row.addLayout(buttons)
        col = QVBoxLayout(self)
        col.setContentsMargins(24, 8, 24, 10)
        col.addLayout(row)
        col.addWidget(self.hint)
        self.editor.submit.connect(self._submit)
        self.editor.stop.connect(self.stop_requested)
        self.send_btn.clicked.connect(self._submit)
        self.stop_btn.clicked.connect(self.stop_requested)
        self.generating = False

    def set_enter_sends(self, on: bool) -> None:
        self.editor.enter_sends = on
        self.editor.setPlaceholderText(
            "Message the model…  (Enter to send, Shift+Enter for a new line)"
            if on
            else "Message the model…  (Ctrl+Enter to send)"
        )

    def set_hint(self, text: str) -> None:
        self.hint.setText(text)

    def set_generating(self, on: bool) -> None:
        self.generating = on
        self.send_btn.setVisible(not on)
        self.stop_btn.setVisible(on)

    def _submit(self) -> None:
        text = self.editor.toPlainText()
        if self.generating or not text.strip():
            return
        # The text stays until the caller accepts it (clear()): a refused send loses nothing.
        self.send_requested.emit(text)

    def clear(self) -> None:
        self.editor.clear()
