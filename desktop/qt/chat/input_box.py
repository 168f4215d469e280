"""The message input: a rounded box that grows with its text, Send / Stop, and a hint line.

Enter sends and Shift+Enter starts a new line (``set_enter_sends(False)`` swaps to Ctrl+Enter
to send); Esc stops a reply being generated. The text stays in the box after ``send_requested``
until the caller accepts it with ``clear()``, so a refused send (no model loaded) loses nothing.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from desktop.qt.widgets import common, icons, theme

MAX_VISIBLE_LINES = 8
COLUMN_MAX_WIDTH = 860  # the chat column's width, so the box lines up with the messages
PLACEHOLDER = "Message the model…"
STOP_TIP = "Stop generating (Esc); the partial reply is kept"
STOP_WAITING_TIP = "Stop waiting for the model (Esc); your message goes back to the box"


class _Editor(QPlainTextEdit):
    """Turns Enter / Ctrl+Enter / Esc into ``submit`` and ``stop``; everything else is typing."""

    submit = Signal()
    stop = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.enter_sends = True
        self.generating = False

    def keyPressEvent(self, event: QKeyEvent) -> None:
        key, mods = event.key(), event.modifiers()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            shift = bool(mods & Qt.KeyboardModifier.ShiftModifier)
            ctrl = bool(mods & Qt.KeyboardModifier.ControlModifier)
            if (self.enter_sends and not shift and not ctrl) or (not self.enter_sends and ctrl):
                self.submit.emit()
                return
            if self.enter_sends and ctrl:
                return  # Ctrl+Enter neither sends nor adds a line in this mode
            self.insertPlainText("\n")  # a real newline: Qt would insert U+2028 for Shift+Enter
            return
        if key == Qt.Key.Key_Escape and self.generating:
            self.stop.emit()
            return
        super().keyPressEvent(event)


class InputBox(QFrame):
    """Signals: send_requested(str), stop_requested(), text_changed() (e.g. to count tokens),
    refused() (the user tried to send while a reply comes; the text stays in the box)."""

    send_requested = Signal(str)
    refused = Signal()
    stop_requested = Signal()
    text_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("InputBar")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.generating = False

        self.editor = _Editor()
        self.editor.setObjectName("Input")
        self.editor.setAccessibleName("Message input")
        self.editor.setPlaceholderText(PLACEHOLDER)
        self.editor.setTabChangesFocus(True)
        self.editor.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.editor.document().setDocumentMargin(2)
        self.editor.installEventFilter(self)

        self.send_btn = QPushButton("Send")
        self.send_btn.setObjectName("Primary")
        self.send_btn.setIconSize(QSize(16, 16))
        self.send_btn.setAccessibleName("Send message")
        self.send_btn.setCursor(Qt.CursorShape.PointingHandCursor)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setObjectName("Danger")
        self.stop_btn.setIconSize(QSize(16, 16))
        self.stop_btn.setAccessibleName("Stop generating")
        self.stop_btn.setToolTip(STOP_TIP)
        self.stop_btn.setCursor(Qt.CursorShape.PointingHandCursor)
        self.stop_btn.hide()

        # "Prefill": the start of the model's reply, written by the user; the model continues it.
        self.prefill_btn = common.flat_button(
            "fork", "Write the start of the reply (the model continues it)", checkable=True
        )
        self.prefill_btn.setAccessibleName("Start the reply yourself")
        self.prefill_edit = QLineEdit()
        self.prefill_edit.setFrame(False)
        self.prefill_edit.setAccessibleName("The reply starts with")
        self.prefill_edit.setPlaceholderText("the model goes on from your words")
        self.prefill_label = QLabel("Reply starts with:")
        self.prefill_label.setObjectName("Hint")
        self.prefill_row = QWidget()
        prefill_lay = QHBoxLayout(self.prefill_row)
        prefill_lay.setContentsMargins(0, 0, 0, 0)
        prefill_lay.addWidget(self.prefill_label)
        prefill_lay.addWidget(self.prefill_edit, 1)
        self.prefill_row.hide()
        self.prefill_btn.toggled.connect(self._show_prefill)

        self.frame = QFrame()
        self.frame.setObjectName("InputFrame")
        framed = QVBoxLayout(self.frame)
        framed.setContentsMargins(12, 8, 8, 8)
        framed.setSpacing(4)
        row = QHBoxLayout()
        row.setSpacing(8)
        framed.addLayout(row)
        framed.addWidget(self.prefill_row)  # after the message, as the reply comes after it
        row.addWidget(self.editor, 1)
        row.addWidget(self.prefill_btn, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.send_btn, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.stop_btn, 0, Qt.AlignmentFlag.AlignBottom)

        self.hint = QLabel()
        self.hint.setObjectName("Hint")
        self.hint.setAccessibleName("Token count")
        self.keys_hint = common.ElidedLabel()  # the first thing to give way on a narrow window
        self.keys_hint.setObjectName("Hint")
        self.keys_hint.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.keys_hint.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        hints = QHBoxLayout()
        hints.setContentsMargins(6, 0, 6, 0)
        hints.addWidget(self.hint)
        hints.addWidget(self.keys_hint, 1)

        column = QWidget()
        column.setMaximumWidth(COLUMN_MAX_WIDTH - 40)
        col = QVBoxLayout(column)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(4)
        col.addWidget(self.frame)
        col.addLayout(hints)
        outer = QHBoxLayout(self)
        outer.setContentsMargins(20, 6, 20, 8)
        outer.addWidget(column)

        self.editor.submit.connect(self._submit)
        self.editor.stop.connect(self.stop_requested)
        self.editor.textChanged.connect(self._on_text_changed)
        self.editor.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.send_btn.clicked.connect(self._submit)
        self.prefill_edit.returnPressed.connect(self._submit)  # "Enter to send" there too
        self.stop_btn.clicked.connect(self.stop_requested)
        self._refresh_icons()
        self.set_enter_sends(True)
        self._fit_height()
        self._on_text_changed()

    # ----- API -------------------------------------------------------------------------------

    def text(self) -> str:
        return self.editor.toPlainText()

    def set_text(self, text: str) -> None:
        self.editor.setPlainText(text)

    def clear(self) -> None:
        self.editor.clear()
        self.prefill_edit.clear()

    def prefill(self) -> str:
        """The start of the reply the user wrote ("" when none)."""
        return self.prefill_edit.text() if self.prefill_btn.isChecked() else ""

    def _show_prefill(self, on: bool) -> None:
        self.prefill_row.setVisible(on)
        if on:
            self.prefill_edit.setFocus()

    def set_enter_sends(self, on: bool) -> None:
        self.editor.enter_sends = on
        keys = (
            "Enter to send · Shift+Enter for a new line"
            if on
            else "Ctrl+Enter to send · Enter for a new line"
        )
        self.keys_hint.setText(keys)
        self.send_btn.setToolTip(f"Send ({'Enter' if on else 'Ctrl+Enter'})")

    def set_hint(self, text: str) -> None:
        """The left hint, e.g. "412 / 2048 tokens"."""
        self.hint.setText(text)

    def set_generating(self, on: bool) -> None:
        """While a reply streams: Stop replaces Send, and Enter does not send."""
        self.generating = on
        self.editor.generating = on
        self.send_btn.setVisible(not on)
        self.stop_btn.setVisible(on)
        self._on_text_changed()

    # ----- internals -------------------------------------------------------------------------

    def _submit(self) -> None:
        text = self.editor.toPlainText()
        if not text.strip():
            return
        if self.generating:
            self.refused.emit()
            return
        self.send_requested.emit(text)

    def _on_text_changed(self) -> None:
        has_text = bool(self.editor.toPlainText().strip())
        self.send_btn.setEnabled(has_text and not self.generating)
        self.text_changed.emit()

    def _fit_height(self) -> None:
        """One line when empty, growing to MAX_VISIBLE_LINES, then the editor scrolls."""
        lines = max(
            1, min(MAX_VISIBLE_LINES, int(self.editor.document().documentLayout().documentSize().height()))
        )
        margins = self.editor.contentsMargins()
        doc_margin = 2 * self.editor.document().documentMargin()
        height = (
            lines * self.editor.fontMetrics().lineSpacing() + doc_margin + margins.top() + margins.bottom()
        )
        self.editor.setFixedHeight(int(height) + 2)

    def _refresh_icons(self) -> None:
        c = theme.colors()
        self.send_btn.setIcon(icons.icon("send", c.on_accent))
        self.stop_btn.setIcon(icons.icon("stop", c.on_accent))

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self.editor and event.type() in (QEvent.Type.FocusIn, QEvent.Type.FocusOut):
            self.frame.setProperty("focused", event.type() == QEvent.Type.FocusIn)
            theme.repolish(self.frame)
        return super().eventFilter(obj, event)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._refresh_icons()
