"""Small widgets and helpers shared by the panels: the flat icon button and the eliding label."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QLabel, QToolButton, QWidget

from .icons import icon
from .theme import colors


def flat_button(icon_name: str, tip: str, checkable: bool = False) -> QToolButton:
    """A small borderless icon button (message actions, panel toggles)."""
    button = QToolButton()
    button.setObjectName("Flat")
    button.setProperty("icon_name", icon_name)  # lets a theme switch re-tint it
    button.setIcon(icon(icon_name, colors().muted))
    button.setIconSize(QSize(16, 16))
    button.setToolTip(tip)
    button.setAccessibleName(tip)
    button.setCheckable(checkable)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    return button


def retint_flat_buttons(root: QWidget) -> None:
    """After a theme switch: repaint the icons of ``root``'s flat buttons in the new colours."""
    for button in root.findChildren(QToolButton, "Flat"):
        if button.property("icon_name"):
            button.setIcon(icon(button.property("icon_name"), colors().muted))


class ElidedLabel(QLabel):
    """A one-line label that ends in "…" when narrow instead of clipping or widening the layout.
    ``text()`` returns the full text; the tooltip shows it too."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self._full = ""
        self.setText(text)

    def setText(self, text: str) -> None:
        self._full = text
        self.setToolTip(text if len(text) > 40 else "")
        self._elide()
        self.updateGeometry()

    def text(self) -> str:
        return self._full

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + 4, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(40, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        super().setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, self.width()))
