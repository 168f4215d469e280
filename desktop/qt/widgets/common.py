"""Small widgets and helpers shared by the panels: the flat icon button, the eliding label and
combo box, setting a spin box of either kind, and a layout that wraps."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QLayout,
    QLayoutItem,
    QSpinBox,
    QStyle,
    QStyleOptionComboBox,
    QStylePainter,
    QToolButton,
    QWidget,
)
from superqt import QElidingLabel

from desktop.engine.text_lines import one_line
from desktop.qt.widgets.icons import icon
from desktop.qt.widgets.theme import colors


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
    (never read as HTML) and cleaned to one line (:func:`~desktop.engine.text_lines.one_line`),
    long text is also the tooltip, and the size hint is the *whole* text's
    width: superqt's is the width of the elided text shown now, so a label elided once in a
    narrow layout would never ask for its room back.
    """

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def setText(self, text: str) -> None:
        text = one_line(text)  # one line, whatever a file or a server named
        super().setText(text)
        self.setToolTip(text if len(text) > 40 else "")
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self.text()) + 4, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(40, super().sizeHint().height())


class StatusLine(QLabel):
    """A status message: plain text, one cleaned line (it names runs, files and their problems),
    wrapped onto more rows only by the width of the window."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setWordWrap(True)
        self.setText(text)

    def setText(self, text: str) -> None:
        super().setText(one_line(text))


class ElidedCombo(QComboBox):
    """A combo box whose closed face ends in "…" when narrow (Qt's cuts the text off); the list
    that drops down shows the whole names, and the tooltip the current one."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.currentIndexChanged.connect(lambda _i: self.setToolTip(self.currentText()))

    def shown_text(self) -> str:
        """What the closed combo box shows at its current width."""
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        room = (
            self.style()
            .subControlRect(
                QStyle.ComplexControl.CC_ComboBox, option, QStyle.SubControl.SC_ComboBoxEditField, self
            )
            .width()
        )
        return self.fontMetrics().elidedText(self.currentText(), Qt.TextElideMode.ElideRight, room)

    def paintEvent(self, _event) -> None:
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        option.currentText = self.shown_text()
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, option)
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, option)


def group(*members: QWidget) -> QWidget:
    """Widgets that stay together on one row (a toolbar wraps between groups, never inside)."""
    box = QWidget()
    lay = QHBoxLayout(box)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(6)
    for member in members:
        lay.addWidget(member)
    return box


class FlowLayout(QLayout):
    """Lays its items out left to right and starts a new row where the next one would not fit
    (a toolbar that wraps instead of clipping on a narrow window). Items keep their size hint;
    an item wider than the whole width gets the width."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 8, row_spacing: int = 6) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._spacing = spacing
        self._row_spacing = row_spacing

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:
        """One row of everything."""
        shown = [i for i in self._items if not i.isEmpty()]
        width = sum(i.sizeHint().width() for i in shown) + self._spacing * max(0, len(shown) - 1)
        height = max((i.sizeHint().height() for i in shown), default=0)
        m = self.contentsMargins()
        return QSize(width + m.left() + m.right(), height + m.top() + m.bottom())

    def minimumSize(self) -> QSize:
        """The widest item: everything else can wrap."""
        size = QSize()
        for item in self._items:
            if not item.isEmpty():
                size = size.expandedTo(item.minimumSize())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _place(self, rect: QRect, move: bool) -> int:
        """Lay the items out in ``rect`` (or only measure); the height used. Each row's items are
        centred on the row's height."""
        m = self.contentsMargins()
        area = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        rows: list[list[tuple[QLayoutItem, int, QSize]]] = [[]]
        x = area.x()
        for item in self._items:
            if item.isEmpty():
                continue
            hint = item.sizeHint()
            width = min(hint.width(), area.width())
            if rows[-1] and x + width > area.right() + 1:  # does not fit: a new row
                rows.append([])
                x = area.x()
            rows[-1].append((item, x, hint))
            x += width + self._spacing
        y = area.y()
        for row in rows:
            height = max((hint.height() for _, _, hint in row), default=0)
            if move:
                for item, left, hint in row:
                    top = y + (height - hint.height()) // 2
                    item.setGeometry(QRect(left, top, min(hint.width(), area.width()), hint.height()))
            y += height + self._row_spacing
        return max(0, y - self._row_spacing) - rect.y() + m.bottom()
