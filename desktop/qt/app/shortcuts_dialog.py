"""F1: the keyboard shortcuts, grouped, with keys drawn as key caps in the platform's notation."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

SHORTCUTS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "Chat",
        (
            ("Return", "Send the message"),
            ("Shift+Return", "New line"),
            ("Esc", "Stop generating"),
            ("Ctrl+R", "Regenerate the last reply"),
            ("Ctrl+Shift+C", "Copy the last reply"),
            ("Ctrl+Shift+R", "Show raw tokens"),
            ("Ctrl+Shift+D", "Colour speculative decoding's kept and corrected tokens"),
        ),
    ),
    (
        "Window",
        (
            ("Ctrl+N", "New chat"),
            ("Ctrl+F", "Search chats"),
            ("Ctrl+K", "Pick a checkpoint"),
            ("Ctrl+Shift+S", "Show or hide the parameters panel"),
            ("F1", "This list"),
        ),
    ),
)
ENTER_SENDS_SWAP = {"Return": "Ctrl+Return", "Shift+Return": "Return"}


def key_caps(sequence: str) -> list[str]:
    """The caps to draw for a portable key sequence, e.g. "Ctrl+Shift+C" → ["Ctrl", "Shift", "C"]
    (on macOS a single cap like "⇧⌘C", as the system writes it)."""
    native = QKeySequence(sequence).toString(QKeySequence.SequenceFormat.NativeText)
    caps = native.split("+") if "+" in native[:-1] else [native]
    return [{"Return": "Enter"}.get(cap, cap) for cap in caps]


class ShortcutsDialog(QDialog):
    def __init__(self, parent: QWidget | None = None, enter_sends: bool = True) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.setAccessibleName("Keyboard shortcuts")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(22, 18, 22, 14)
        lay.setSpacing(6)
        for group, rows in SHORTCUTS:
            title = QLabel(group.upper())
            title.setObjectName("SectionTitle")
            lay.addSpacing(4)
            lay.addWidget(title)
            grid = QGridLayout()
            grid.setHorizontalSpacing(24)
            grid.setVerticalSpacing(6)
            for r, (keys, action) in enumerate(rows):
                if not enter_sends:
                    keys = ENTER_SENDS_SWAP.get(keys, keys)
                grid.addWidget(QLabel(action), r, 0)
                grid.addLayout(self._caps(keys), r, 1)
            grid.setColumnStretch(0, 1)
            lay.addLayout(grid)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay.addSpacing(10)
        lay.addWidget(buttons)

    @staticmethod
    def _caps(keys: str) -> QHBoxLayout:
        row = QHBoxLayout()
        row.setSpacing(4)
        row.addStretch(1)
        for cap in key_caps(keys):
            label = QLabel(cap)
            label.setObjectName("Kbd")
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            label.setAccessibleName(keys)
            row.addWidget(label)
        return row
