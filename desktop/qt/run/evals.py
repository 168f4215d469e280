"""The Run tab's evaluation results: each step's score per task in a table (steps down, tasks
across), and "what flipped" between two steps: the questions the later step got wrong that the
earlier one got right, and the reverse. Clicking one sends the two steps and that question to
Compare, side by side.

The scores and flips are computed by the sweep (off this thread, by the engine's rules) and
kept in the Run session (for the report card too); this widget only shows them.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.session.run import RunSession

MAX_SHOWN = 500  # flips listed; a count says how many more


def shown_score(task: str, value: float) -> str:
    """A score as the table shows it: bits per byte and CORE as numbers (CORE as nanochat prints
    it), the shares of questions answered right as percentages."""
    if task.startswith(("bits per byte", "CORE")):
        return f"{value:.4f}"
    return f"{value:.1%}"


class EvalResults(QWidget):
    """A view over ``session``'s evaluations. Signals: flip_chosen(line) when a flip is clicked."""

    flip_chosen = Signal(int)

    def __init__(self, session: RunSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.flips_title = QLabel("What flipped")
        self.flips_title.setTextFormat(Qt.TextFormat.PlainText)
        self.flips = QListWidget()
        self.flips.setWordWrap(True)
        self.flips.itemActivated.connect(self._on_flip)
        self.flips.itemClicked.connect(self._on_flip)
        flips_box = QWidget()
        box = QVBoxLayout(flips_box)
        box.setContentsMargins(0, 0, 0, 0)
        box.addWidget(self.flips_title)
        box.addWidget(self.flips, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.table)
        split.addWidget(flips_box)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)
        session.events.questions_changed.connect(self._show_flips)
        session.events.scores_changed.connect(self._show_scores)
        session.events.flips_changed.connect(self._show_flips)

    def _show_scores(self, _task: str) -> None:
        scores = self.session.scores
        tasks = list(scores)
        steps = sorted({k for s in scores.values() for k in s}, key=lambda k: (k[0] != "base", k[1]))
        self.table.setRowCount(len(steps))
        self.table.setColumnCount(len(tasks))
        self.table.setHorizontalHeaderLabels(tasks)
        self.table.setVerticalHeaderLabels([f"{stage} {step:,}" for stage, step in steps])
        for r, key in enumerate(steps):
            for c, name in enumerate(tasks):
                value = scores[name].get(key)
                self.table.setItem(r, c, QTableWidgetItem("" if value is None else shown_score(name, value)))

    def _show_flips(self) -> None:
        """The questions that changed between two steps, each a click away from Compare (until a
        sweep ends, a line saying they come then)."""
        self.flips.clear()
        flips = self.session.flips
        if flips is None:
            self.flips_title.setText("What flipped: when the sweep ends")
            return
        earlier, later, lost, gained = flips.earlier, flips.later, flips.lost, flips.gained
        e, l_ = f"{earlier[0]} {earlier[1]:,}", f"{later[0]} {later[1]:,}"
        self.flips_title.setText(f"What flipped from {e} to {l_}: {len(lost)} lost, {len(gained)} gained")
        rows = [(line, f"✗ lost at {l_}") for line in lost] + [(line, f"✓ gained at {l_}") for line in gained]
        for line, what in rows[:MAX_SHOWN]:
            question = self.session.questions.get(line, ("", ""))[0]
            item = QListWidgetItem(f"{what} · line {line}: {' '.join(question.split())[:200]}")
            item.setToolTip("Click: ask both steps this question side by side in Compare")
            item.setData(Qt.ItemDataRole.UserRole, line)
            self.flips.addItem(item)
        if len(rows) > MAX_SHOWN:
            self.flips.addItem(f"… and {len(rows) - MAX_SHOWN} more")

    def _on_flip(self, item: QListWidgetItem) -> None:
        line = item.data(Qt.ItemDataRole.UserRole)
        if line is not None:  # not the "… and N more" row
            self.flip_chosen.emit(line)
