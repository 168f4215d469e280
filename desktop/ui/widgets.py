"""Small widgets and helpers shared by the panels: the flat icon button, the eliding label and
setting a spin box of either kind."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox, QToolButton, QWidget
from superqt import QElidingLabel

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


def set_spin_value(box: QSpinBox | QDoubleSpinBox, value: float) -> None:
    """Set ``box`` to ``value``; an integer box truncates a float, as Qt does when given one."""
    if isinstance(box, QSpinBox):
        box.setValue(int(value))
    else:
        box.setValue(value)


class ElidedLabel(QElidingLabel):
    """A one-line label that ends in "…" when narrow instead of clipping or widening the layout.

    superqt elides and keeps the whole text in ``text()``; on top of that the text is plain
    (never read as HTML), long text is also the tooltip, and the size hint is the *whole* text's
    width: superqt's is the width of the elided text shown now, so a label elided once in a
    narrow layout would never ask for its room back.
    """

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text if len(text) > 40 else "")
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self.text()) + 4, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(40, super().sizeHint().height())
