"""The Inside view across steps (issue #45): one token position, one column per Compare pane,
each headed by the pane's letter and step ("A · step 300") and showing that pane's own Inside
view there, or one line saying why it has none. A view only: the state is a
:class:`~desktop.session.compare.inside.CompareInside`.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QTableWidget, QVBoxLayout, QWidget

from desktop.qt.widgets.inside_view import InsideView


class _ColumnInside(InsideView):
    """An InsideView in a narrow column: its tables scroll sideways, and are tall enough that
    the scroll bar hides no row."""

    def _fill_lens(self) -> None:
        super()._fill_lens()
        _room_for_bar(self.lens)

    def _fill_attribution(self) -> None:
        super()._fill_attribution()
        _room_for_bar(self.attribution)


def _room_for_bar(table: QTableWidget) -> None:
    table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
    table.setFixedHeight(table.height() + table.horizontalScrollBar().sizeHint().height())


class InsideColumnView(QFrame):
    """One pane's column: its heading, then its Inside view or its one line.

    Signals:
        position_changed(int): a token clicked in this column's view moved it to that position.
    """

    position_changed = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("InsideColumn")
        self.setMinimumWidth(460)
        self.lay = QVBoxLayout(self)
        self.lay.setContentsMargins(0, 0, 0, 0)
        self.lay.setSpacing(4)
        self.heading = QLabel()
        font = self.heading.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.15)
        self.heading.setFont(font)
        self.lay.addWidget(self.heading)
        self.line = QLabel()
        self.line.setObjectName("Muted")
        self.line.setWordWrap(True)
        self.lay.addWidget(self.line)
        self.view: _ColumnInside | None = None
        self._source: Any = None
        self.stretch = QWidget()
        self.lay.addWidget(self.stretch, 1)

    def show_column(self, col: Any) -> None:
        self.heading.setText(col.heading)
        self.setAccessibleName(f"Inside view of pane {col.letter}")
        self.line.setText(col.line)
        self.line.setVisible(bool(col.line))
        if col.source is not None and not col.line:
            if self.view is None or self._source is not col.source:
                if self.view is not None:
                    self.view.deleteLater()
                self.view = _ColumnInside(col.source, col.position)
                self.view.position_changed.connect(self.position_changed)
                self.lay.insertWidget(2, self.view, 1)
                self._source = col.source
            self.view.show_position(col.position)
        self.stretch.setVisible(self.view is None)


class InsideCompareWindow(QWidget):
    """The columns side by side (a horizontal scroll where they do not fit)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("InsideCompare")
        self.setWindowTitle("Inside the model, across steps")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(12, 10, 12, 12)
        outer.setSpacing(6)
        self.title = QLabel()
        self.title.setWordWrap(True)
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        font = self.title.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.25)
        self.title.setFont(font)
        outer.addWidget(self.title)
        hint = QLabel(
            "Each pane's own reply at this token, under its own step: where the lens first puts "
            "the token on top moves earlier as training goes on."
        )
        hint.setObjectName("Muted")
        hint.setWordWrap(True)
        outer.addWidget(hint)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        body = QWidget()
        self.row = QHBoxLayout(body)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(12)
        scroll.setWidget(body)
        outer.addWidget(scroll, 1)
        self.columns: list[InsideColumnView] = []
        self.state: Any = None
        self.resize(1480, 900)

    def show_state(self, state: Any) -> None:
        """Show a CompareInside (again, as its passes answer)."""
        if state is not self.state:
            for column in self.columns:
                self.row.removeWidget(column)
                column.deleteLater()
            self.columns = []
            self.state = state
        self.title.setText(f"Inside the model at reply token {state.token + 1}, in every pane")
        while len(self.columns) < len(state.columns):
            column = InsideColumnView()
            column.position_changed.connect(self.move_to)
            self.row.addWidget(column, 1)
            self.columns.append(column)
        for view, col in zip(self.columns, state.columns, strict=False):
            view.show_column(col)

    def move_to(self, position: int) -> None:
        """A token clicked in one column: every column shows that position of its own sequence
        (the panes share the prompt, so an earlier position is the same token in each)."""
        for column in self.columns:
            view = column.view
            if view is not None and view.position != position and 0 <= position < len(view.source.ids):
                view.show_position(position)
