"""The message the user sent before the model was ready, at the end of the conversation: shown as
their message at once, with a reply line saying what it waits for and the load's progress (the
session's :class:`~desktop.session.waiting.ModelWait` says what; this only draws it)."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar, QVBoxLayout, QWidget

from desktop.engine.messages import Message
from desktop.qt.chat.message_widget import AVATAR, MessageWidget


class WaitingBlock(QWidget):
    """The waiting message and its pending reply; ``show_waiting`` fills it, ``text`` is what it shows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("WaitingBlock")
        self.setAccessibleName("Message waiting for the model")
        self.text = ""
        self.user: MessageWidget | None = None
        self.reply = MessageWidget(Message("assistant", [], {}), streaming=True)
        self.reply.action_bar.setEnabled(False)  # nothing to copy or regenerate yet
        self.progress = QProgressBar()
        self.progress.setObjectName("WaitingProgress")
        self.progress.setRange(0, 100)
        self.progress.setTextVisible(False)
        self.progress.setAccessibleName("Model load progress")
        self._box = QVBoxLayout(self)
        self._box.setContentsMargins(0, 0, 0, 0)
        self._box.setSpacing(4)
        self._box.addWidget(self.reply)
        bar = QVBoxLayout()
        bar.setContentsMargins(AVATAR + 10, 0, 0, 0)
        bar.addWidget(self.progress)
        self._box.addLayout(bar)

    @property
    def line(self) -> str:
        """What the pending reply says it waits for."""
        return self.reply.pending.text()

    def show_waiting(self, text: str, line: str, percent: int) -> None:
        if text != self.text:
            if self.user is not None:
                self.user.hide()
                self._box.removeWidget(self.user)
                self.user.deleteLater()
            self.user = MessageWidget(Message.of_text("user", text))
            self.user.action_bar.setEnabled(False)  # it is not in the conversation yet
            self._box.insertWidget(0, self.user)
            self.text = text
        self.reply.pending.setText(line)
        self.progress.setValue(percent)
