"""The token popup: what the model weighed at one position, and a fork from any of it.

A click on a token (Chat's token view, a Compare pane) opens this small popup. It lists the
alternatives the model considered, with their probabilities; clicking one forks the reply there
with that token. A line takes the user's own words instead ("continue from here with …"). With
"Race in Compare" ticked, the fork goes to Compare and runs on several checkpoints. Where a fork
cannot be made (a token the calculator forced, a reply still streaming, a model without ids),
the popup says why instead of offering it.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop.engine.messages import FORCED_FORK
from desktop.qt.widgets.token_records import TokenRecord, token_label, visible_text

NO_ALTERNATIVES = (
    "No alternatives were recorded for this token (a server that gives no token probabilities, "
    "or a reply saved before they were kept). Write your own:"
)


class ForkPopup(QFrame):
    """One token's alternatives, each a fork.

    Signals:
        chosen(int, str, bool): the alternative's token id (-1 when the user wrote ``text``),
            its text (or the text written), and whether to race the fork in Compare.
    """

    chosen = Signal(int, str, bool)
    inside_requested = Signal()

    def __init__(
        self,
        index: int,
        record: TokenRecord,
        refusal: str = "",
        race: bool = False,
        parent: QWidget | None = None,
        inside: bool = False,
    ) -> None:
        """``refusal``: why no fork can be made here ("" when it can); ``race``: offer "Race in
        Compare" (Chat does; a Compare pane races in place); ``inside``: offer the "Inside"
        button (what each layer and head did at this token, issue #45)."""
        super().__init__(parent, Qt.WindowType.Popup)
        self.setObjectName("ForkPopup")
        self.setAccessibleName(f"Token {index} alternatives")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        refusal = FORCED_FORK.capitalize() + "." if record.forced else refusal
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 8, 10, 10)
        lay.setSpacing(4)
        p = record.probability
        title = f"Token {index}  ·  {token_label(record)}" + (f"  ·  p {p:.3f}" if p is not None else "")
        heading = QLabel(title)
        heading.setObjectName("PopupTitle")
        heading.setTextFormat(Qt.TextFormat.PlainText)
        top = QHBoxLayout()
        top.addWidget(heading, 1)
        self.inside_btn = QPushButton("Inside")
        self.inside_btn.setToolTip("What each layer predicted and each head looked at, at this token")
        self.inside_btn.setAccessibleName("Inside the model at this token")
        self.inside_btn.setVisible(inside)
        self.inside_btn.clicked.connect(self._ask_inside)
        top.addWidget(self.inside_btn)
        lay.addLayout(top)
        self.inside_note = QLabel()
        self.inside_note.setObjectName("Muted")
        self.inside_note.setWordWrap(True)
        self.inside_note.setMaximumWidth(360)
        self.inside_note.setVisible(False)
        lay.addWidget(self.inside_note)
        self.note = QLabel(refusal or "Fork the reply here with:")
        self.note.setObjectName("Muted")
        self.note.setWordWrap(True)
        self.note.setMaximumWidth(360)
        lay.addWidget(self.note)

        self.buttons: list[QPushButton] = []
        alternatives = list(record.logprobs[1]) if record.logprobs is not None else []
        said = record.special or record.text
        for rank, (token_id, label, logprob) in enumerate(alternatives, start=1):
            mine = str(label) == said
            button = QPushButton(f"{rank}.  {visible_text(str(label))}    {math.exp(float(logprob)):.3f}")
            button.setObjectName("Alternative")
            button.setFlat(True)
            button.setStyleSheet("text-align: left; padding: 3px 8px;")
            button.setEnabled(not refusal and not mine)
            button.setToolTip("what the reply said here" if mine else f"fork with token {int(token_id)}")
            button.clicked.connect(lambda _=False, t=int(token_id), text=str(label): self._choose(t, text))
            self.buttons.append(button)
            lay.addWidget(button)
        if record.logprobs is None and not refusal:
            none = QLabel(NO_ALTERNATIVES)
            none.setWordWrap(True)
            none.setMaximumWidth(360)
            none.setObjectName("Muted")
            lay.addWidget(none)

        row = QHBoxLayout()
        self.own = QLineEdit()
        self.own.setPlaceholderText("Continue from here with…")
        self.own.setAccessibleName("Your own continuation")
        self.own.setEnabled(not refusal)
        self.own.returnPressed.connect(self._write)
        self.write_btn = QPushButton("Fork")
        self.write_btn.setEnabled(not refusal)
        self.write_btn.clicked.connect(self._write)
        row.addWidget(self.own, 1)
        row.addWidget(self.write_btn)
        lay.addLayout(row)
        self.race = QCheckBox("Race the fork on checkpoints in Compare")
        self.race.setVisible(race)
        self.race.setEnabled(not refusal)
        lay.addWidget(self.race)

    def _ask_inside(self) -> None:
        self.say_inside("Looking inside the model…")
        self.inside_btn.setEnabled(False)
        self.inside_requested.emit()

    def say_inside(self, line: str) -> None:
        """One line about the Inside view here (computing, or why there is none)."""
        self.inside_note.setText(line)
        self.inside_note.setVisible(bool(line))
        self.inside_btn.setEnabled(True)
        self.adjustSize()

    def _write(self) -> None:
        text = self.own.text()
        if text.strip():
            self._choose(-1, text)

    def _choose(self, token_id: int, text: str) -> None:
        race = self.race.isVisible() and self.race.isChecked()
        self.close()
        self.chosen.emit(token_id, text, race)

    def show_at(self, where: QPoint) -> None:
        """Open below ``where`` (global), kept on its screen."""
        self.adjustSize()
        screen = self.screen().availableGeometry() if self.screen() is not None else None
        x, y = where.x(), where.y() + 12
        if screen is not None:
            x = max(screen.left(), min(x, screen.right() - self.width()))
            if y + self.height() > screen.bottom():
                y = where.y() - self.height() - 12
        self.move(x, y)
        self.show()
