"""An inline, dismissable banner for errors, warnings and notes (one line, details on demand)."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout

from . import theme


class ErrorBanner(QFrame):
    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("Banner")
        self.setAccessibleName("Notification")
        self.title = QLabel()
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextFormat(Qt.TextFormat.RichText)
        self.details = QLabel()
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setWordWrap(True)
        self.details.hide()
        self.more = QToolButton()
        self.more.setText("Details")
        self.more.setAutoRaise(True)
        self.more.hide()
        self.close_btn = QToolButton()
        self.close_btn.setText("✕")
        self.close_btn.setAutoRaise(True)
        self.close_btn.setAccessibleName("Dismiss")
        text = QVBoxLayout()
        text.addWidget(self.title)
        text.addWidget(self.message)
        text.addWidget(self.details)
        row = QHBoxLayout(self)
        row.setContentsMargins(14, 8, 8, 8)
        row.addLayout(text, 1)
        row.addWidget(self.more)
        row.addWidget(self.close_btn)
        self.more.clicked.connect(lambda: self.details.setVisible(not self.details.isVisible()))
        self.close_btn.clicked.connect(self.hide)
        self.level = ""
        self.hide()

    def _show(self, level: str, title: str, message: str, details: str | None) -> None:
        c = theme.colors()
        color = {"error": c.error, "warning": c.warning}.get(level, c.info)
        self.level = level
        self.setStyleSheet(
            f"QFrame#Banner {{ border: 1px solid {color}; border-left: 5px solid {color};"
            f" border-radius: 8px; margin: 8px 24px 0 24px; background: {c.base}; }}"
        )
        icon = {"error": "✖", "warning": "⚠"}.get(level, "ℹ")
        self.title.setText(f'<b style="color:{color}">{icon} {html.escape(title)}</b>')
        self.message.setText(html.escape(message))
        self.details.setText(html.escape(details or ""))
        self.details.hide()
        self.more.setVisible(bool(details))
        self.show()

    def show_error(self, title: str, message: str, details: str | None = None) -> None:
        self._show("error", title, message, details)

    def show_warning(self, title: str, message: str, details: str | None = None) -> None:
        self._show("warning", title, message, details)

    def show_info(self, title: str, message: str, details: str | None = None) -> None:
        self._show("info", title, message, details)
