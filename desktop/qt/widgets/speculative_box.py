"""The Parameters panel's speed section: speculative decoding on or off, and with which draft.

A draft proposes a few tokens and the model checks them in one pass; the reply keeps the
model's own distribution (engine/decode/speculative.py), but not nanochat's seeded stream, so
this is a named choice, off by default. The drafts offered: the model's own int8 or 16-bit
copy, its multi-token-prediction head where the checkpoint has one (the nanochat fork's, one token
a round), and the other saved steps of its run (same tokenizer). The draft length is adaptive
unless the user fixes it.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

MAX_K = 8  # engine/decode/speculative.py's K_MAX
SELF_DRAFTS = (
    ("Off", ""),
    ("Own copy, fastest (auto)", "auto"),
    ("Own int8 copy", "int8"),
    ("Own 16-bit copy", "fast"),
)
HEAD_DRAFT = ("Own MTP head", "mtp")
HEAD_TIP = (
    "The checkpoint's multi-token-prediction head (the nanochat fork's): it reads the model's own\n"
    "last hidden state and proposes one token a round, whatever k says."
)


class SpeculativeBox(QWidget):
    """Signals: changed(str draft, int k): the draft named as ``StreamOptions.draft`` ("" off)
    and the draft length (0: adaptive)."""

    changed = Signal(str, int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.draft = QComboBox()
        self.draft.setAccessibleName("Speculative decoding draft")
        self.draft.setToolTip(
            "A draft proposes tokens, the model checks them in one pass: faster, with the model's own\n"
            "distribution. Not nanochat's seeded stream: a seed repeats Nanoscope's own."
        )
        self.k = QSpinBox()
        self.k.setRange(0, MAX_K)
        self.k.setSpecialValueText("auto")
        self.k.setAccessibleName("Draft length")
        self.k.setToolTip("Tokens drafted per step (auto: raised while the model keeps them)")
        self.note = QLabel()
        self.note.setObjectName("Muted")
        self.note.setWordWrap(True)
        self.note.hide()
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.draft, 1)
        row.addWidget(QLabel("k"))
        row.addWidget(self.k)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        lay.addLayout(row)
        lay.addWidget(self.note)
        self._steps: list[tuple[str, str]] = []
        self._head = False
        self._fill("")
        self.draft.currentIndexChanged.connect(self._emit)
        self.k.valueChanged.connect(self._emit)

    def _fill(self, current: str) -> None:
        self.draft.blockSignals(True)
        self.draft.clear()
        for label, spec in (*SELF_DRAFTS, *([HEAD_DRAFT] if self._head else []), *self._steps):
            self.draft.addItem(label, spec)
        if self._head:
            self.draft.setItemData(len(SELF_DRAFTS), HEAD_TIP, Qt.ItemDataRole.ToolTipRole)
        if current and self.draft.findData(current) < 0:
            self.draft.addItem(current, current)  # a draft named elsewhere (settings, CLI)
        self.draft.setCurrentIndex(max(0, self.draft.findData(current)))
        self.draft.blockSignals(False)

    def set_steps(self, steps: list[tuple[str, str]]) -> None:
        """Other checkpoints of the loaded model's run, as (label, draft name)."""
        self._steps = list(steps)
        self._fill(self.value()[0])

    def set_head(self, available: bool) -> None:
        """Whether the loaded model's own MTP head is offered (``Capabilities.draft_head``)."""
        self._head = available
        self._fill(self.value()[0])

    def set_value(self, draft: str, k: int) -> None:
        self.k.blockSignals(True)
        self.k.setValue(max(0, min(MAX_K, k)))
        self.k.blockSignals(False)
        self._fill(draft)

    def value(self) -> tuple[str, int]:
        return str(self.draft.currentData() or ""), self.k.value()

    def set_unavailable(self, why: str) -> None:
        """The loaded model cannot be drafted for (a served one): say why, keep the choice."""
        self.note.setText(why)
        self.note.setVisible(bool(why))
        self.draft.setEnabled(not why)
        self.k.setEnabled(not why)

    def _emit(self) -> None:
        self.changed.emit(*self.value())
