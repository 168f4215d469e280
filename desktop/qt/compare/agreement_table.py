"""Compare's agreement matrix: how alike the panes' checkpoints are, as speculative decoding sees it.

Cell (row r, column c) is how often pane r's checkpoint's most likely token is the one pane c's
reply has: the acceptance rate greedy speculative decoding would get with r drafting for c. It
comes from cross-scoring (one teacher-forced pass per pair), so it is cheap, and it reads as a
similarity: steps of one run that agree on 95% of tokens have stopped changing what they say.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QDialog, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from desktop.qt.widgets import theme
from desktop.qt.widgets.token_view import mix


class AgreementDialog(QDialog):
    """The matrix, filled in as the cross-scores come back."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Agreement between the panes")
        self.setAccessibleName("Agreement matrix")
        self.table = QTableWidget()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        note = QLabel(
            "Row drafts, column's reply: how often the row's checkpoint's most likely token is the\n"
            "token the column's reply has (greedy speculative decoding's acceptance rate)."
        )
        note.setObjectName("Muted")
        lay = QVBoxLayout(self)
        lay.addWidget(note)
        lay.addWidget(self.table, 1)
        self.resize(560, 300)

    def set_matrix(self, labels: list[str], matrix: list[list[float | None]]) -> None:
        c = theme.colors()
        self.table.setRowCount(len(labels))
        self.table.setColumnCount(len(labels))
        self.table.setVerticalHeaderLabels([f"{label} drafts" for label in labels])
        self.table.setHorizontalHeaderLabels([f"{label}'s reply" for label in labels])
        for r, row in enumerate(matrix):
            for col, value in enumerate(row):
                item = QTableWidgetItem("…" if value is None else f"{100 * value:.0f}%")
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                if value is not None:
                    item.setBackground(QColor(mix(c.surface, c.success, 0.55 * value)))
                self.table.setItem(r, col, item)
        self.table.resizeColumnsToContents()
        self.table.resizeRowsToContents()

    def cell(self, row: int, column: int) -> str:
        item = self.table.item(row, column)
        return item.text() if item is not None else ""
