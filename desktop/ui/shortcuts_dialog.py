"""F1: the keyboard shortcuts."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QGridLayout, QLabel, QVBoxLayout, QWidget

SHORTCUTS = (
    ("Enter", "Send the message"),
    ("Shift+Enter", "New line"),
    ("Esc", "Stop generating"),
    ("Ctrl+N", "New chat"),
    ("Ctrl+F", "Search history"),
    ("Ctrl+K", "Pick a checkpoint"),
    ("Ctrl+R", "Regenerate the last reply"),
    ("Ctrl+Shift+C", "Copy the last reply"),
    ("Ctrl+Shift+S", "Show or hide the sampling panel"),
    ("Ctrl+Shift+R", "Show raw tokens"),
    ("F1", "This list"),
)


class ShortcutsDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        grid = QGridLayout()
        for row, (keys, what) in enumerate(SHORTCUTS):
            key_label = QLabel(f"<b>{keys}</b>")
            grid.addWidget(key_label, row, 0)
            grid.addWidget(QLabel(what), row, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(grid)
        layout.addWidget(buttons)
