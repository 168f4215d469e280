"""An inline banner above the conversation: error (red), warning (amber) or info (blue).

One line of title and message (elided, full text in the tooltip), the technical details behind
a "Details" toggle (selectable, for bug reports), and a close button. A newer notice replaces
the current one.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QToolButton, QVBoxLayout, QWidget

from desktop.engine.text_lines import one_line
from desktop.qt.widgets import common, icons, theme

DETAILS_MAX_LINES = 8  # then the details scroll
SEVERITY_ICONS = {"error": "error", "warning": "warning", "info": "info"}


class ErrorBanner(QFrame):
    """Signals: dismissed() when the user closes it. ``level`` is the severity shown last."""

    dismissed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Banner")
        self.setAccessibleName("Notification")
        self.level = ""

        self.icon = QLabel()
        self.icon.setFixedSize(18, 18)
        self.title = common.ElidedLabel()
        self.title.setObjectName("BannerTitle")
        self.message = common.ElidedLabel()
        self.message.setAccessibleName("Message")
        self.more = QToolButton()
        self.more.setObjectName("Flat")
        self.more.setText("Details")
        self.more.setCheckable(True)
        self.more.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.more.setIconSize(QSize(14, 14))
        self.more.setToolTip("Show the technical details")
        self.more.setAccessibleName("Show details")
        self.close_btn = common.flat_button("close", "Dismiss")
        self.details = QPlainTextEdit()
        self.details.setObjectName("BannerDetails")
        self.details.setReadOnly(True)
        self.details.setAccessibleName("Details")
        self.details.hide()

        row = QHBoxLayout()
        row.setSpacing(8)
        row.addWidget(self.icon)
        row.addWidget(self.title)
        row.addWidget(self.message, 1)
        row.addWidget(self.more)
        row.addWidget(self.close_btn)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 7, 6, 7)
        lay.setSpacing(6)
        lay.addLayout(row)
        lay.addWidget(self.details)

        self.more.toggled.connect(self._on_more)
        self.close_btn.clicked.connect(self._dismiss)
        self.hide()

    def show_error(self, title: str, message: str, details: str | None = None) -> None:
        self._show("error", title, message, details)

    def show_warning(self, title: str, message: str, details: str | None = None) -> None:
        self._show("warning", title, message, details)

    def show_info(self, title: str, message: str, details: str | None = None) -> None:
        self._show("info", title, message, details)

    def _show(self, level: str, title: str, message: str, details: str | None) -> None:
        self.level = level
        self.setProperty("severity", level)
        theme.repolish(self)
        # One line each, through the cleaner of every line shown: a name from a file may hold a
        # line break or a bidi override. The details are the technical text, shown as they are.
        title, message = one_line(title), one_line(message)
        self.title.setText(title)
        self.message.setText(message)
        self.message.setToolTip(f"{title}\n{message}")
        self.details.setPlainText(details or "")
        lines = min(DETAILS_MAX_LINES, (details or "").count("\n") + 1)
        self.details.setFixedHeight(lines * self.details.fontMetrics().lineSpacing() + 16)
        self.more.setVisible(bool(details))
        self.more.setChecked(False)
        self._refresh_icons()
        self.show()

    def withdraw(self, title: str) -> None:
        """Hide the notice titled ``title`` if it is the one shown (it is no longer true)."""
        if not self.isHidden() and self.title.text() == one_line(title):
            self.hide()

    def _on_more(self, open_: bool) -> None:
        self.details.setVisible(open_)
        self.more.setToolTip("Hide the technical details" if open_ else "Show the technical details")
        self._refresh_icons()

    def _dismiss(self) -> None:
        self.hide()
        self.dismissed.emit()

    def _refresh_icons(self) -> None:
        c = theme.colors()
        color = {"error": c.error, "warning": c.warning}.get(self.level, c.info)
        self.icon.setPixmap(icons.icon(SEVERITY_ICONS.get(self.level, "info"), color, 18).pixmap(18, 18))
        self.more.setIcon(icons.icon("chevron-up" if self.more.isChecked() else "chevron-down", c.muted))
        common.retint_flat_buttons(self)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._refresh_icons()
