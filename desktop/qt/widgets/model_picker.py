"""The checkpoint picker (Ctrl+K): every step of every checkpoint in one searchable list.

Keyboard first, as in LM Studio: the search box has the focus, typing filters (every word must
match somewhere in the row), the arrow keys move, Enter loads the highlighted step and Esc
closes. A row shows where the checkpoint comes from, its step, family and era, parameters,
context, stored dtype, the memory it needs, and when it was last used. The shape columns come
from ``engine.discovery.summarize``, which the window runs off the GUI thread (the picker only
asks for them with ``summaries_wanted`` and fills them in as they arrive). Opened folders and
served models are entries like any other.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from PySide6.QtCore import QEvent, QModelIndex, QObject, QRegularExpression, QSortFilterProxyModel, Qt, Signal
from PySide6.QtGui import QFont, QKeyEvent, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from desktop.qt.chat.history_sidebar import relative_time
from desktop.qt.widgets.checkpoint_picker import SOURCE_NAMES, entry_name, human_bytes, human_params

COLUMNS = ("Checkpoint", "Step", "Family", "Parameters", "Context", "Stored", "Memory", "Last used")
KEY_ROLE = Qt.ItemDataRole.UserRole  # (dir, step) on the first column
TEXT_ROLE = Qt.ItemDataRole.UserRole + 1  # the words a search matches (name, source, step, era, dtype)
SEARCHED = (0, 1, 2, 5)  # columns whose words a search looks at (not sizes: "10" is a step)
SOURCE_ROLE = Qt.ItemDataRole.UserRole + 2  # "SFT", "Folder", "Demo"…: searchable, not shown
NAV_KEYS = (Qt.Key.Key_Up, Qt.Key.Key_Down, Qt.Key.Key_PageUp, Qt.Key.Key_PageDown)
NUMERIC = (1, 3, 4, 6)  # step, parameters, context, memory: right-aligned
RIGHT = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
UNSUMMARIZED = ("remote",)  # sources with no files to read shapes from (served models)


def words_of(text: str) -> list[str]:
    """ "sft/d20 · step 1,500" -> ["sft", "d20", "step", "1500"]."""
    return re.findall(r"\w+", text.lower().replace(",", ""))


def query_pattern(query: str) -> QRegularExpression:
    """Every word typed must start a word of the row ("d2" finds d20), in any order."""
    ahead = "".join(rf"(?=.*\b{re.escape(word)})" for word in words_of(query))
    return QRegularExpression(f"^{ahead}")


class ModelPicker(QDialog):
    """Signals:
    load_requested(Path, int): Enter or a double-click on a step.
    summaries_wanted(list): (dir, step) pairs whose shape columns are still empty.
    open_folder_requested(): the "Open folder…" button.
    """

    load_requested = Signal(Path, int)
    summaries_wanted = Signal(list)
    open_folder_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Pick a checkpoint")
        self.setObjectName("ModelPicker")
        self.setAccessibleName("Checkpoint picker")
        self.entries: list = []
        self._loaded: tuple[Path, int] | None = None
        self._recent: dict[tuple[Path, int], float] = {}
        self._rows: dict[tuple[Path, int], int] = {}
        self._summarized: set[tuple[Path, int]] = set()

        self.search = QLineEdit()
        self.search.setObjectName("Field")
        self.search.setPlaceholderText("Search checkpoints: name, step, era, dtype…")
        self.search.setAccessibleName("Search checkpoints")
        self.search.setClearButtonEnabled(True)
        self.search.installEventFilter(self)

        self.model = QStandardItemModel(0, len(COLUMNS), self)
        self.model.setHorizontalHeaderLabels(list(COLUMNS))
        for column in NUMERIC:
            self.model.horizontalHeaderItem(column).setTextAlignment(RIGHT)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setFilterKeyColumn(0)
        self.proxy.setFilterRole(TEXT_ROLE)
        self.view = QTreeView()
        self.view.setObjectName("PickerList")
        self.view.setAccessibleName("Checkpoints")
        self.view.setModel(self.proxy)
        self.view.setRootIsDecorated(False)
        self.view.setUniformRowHeights(True)
        self.view.setAlternatingRowColors(True)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the search box keeps the keyboard
        self.view.setStyleSheet("QTreeView#PickerList::item { padding: 5px 6px; }")
        header = self.view.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.view.activated.connect(self._load_index)
        self.view.doubleClicked.connect(self._load_index)

        self.count = QLabel()
        self.count.setObjectName("Muted")
        hint = QLabel("↑↓ move  ·  Enter loads  ·  Esc closes")
        hint.setObjectName("Muted")
        self.open_btn = QPushButton("Open folder…")
        self.open_btn.setToolTip("Add any folder holding model_<step>.pt and meta_<step>.json")
        self.open_btn.setAutoDefault(False)
        self.open_btn.clicked.connect(self._open_folder)

        bottom = QHBoxLayout()
        bottom.addWidget(self.count)
        bottom.addStretch(1)
        bottom.addWidget(hint)
        bottom.addSpacing(12)
        bottom.addWidget(self.open_btn)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 12, 12, 10)
        lay.setSpacing(8)
        lay.addWidget(self.search)
        lay.addWidget(self.view, 1)
        lay.addLayout(bottom)

        self.search.textChanged.connect(self._on_query)
        self.resize(900, 460)

    # ----- content ---------------------------------------------------------------------------

    def set_entries(self, entries: list) -> None:
        """The CheckpointEntry list of the latest scan: one row per step, newest step first."""
        self.entries = list(entries)
        current = self.current()
        self.model.removeRows(0, self.model.rowCount())
        self._rows.clear()
        self._summarized.clear()
        for entry in self.entries:
            for step in reversed(list(entry.steps)):
                self._add_row(entry, int(step))
        self._refresh_marks()
        if current is not None:
            self.highlight(*current)
        self._after_filter()

    def _add_row(self, entry, step: int) -> None:
        key = (Path(entry.path), step)
        name = entry_name(entry)
        source = SOURCE_NAMES.get(entry.source, entry.source)
        remote = entry.source in UNSUMMARIZED
        cells = [name, "" if remote else f"{step:,}", "served" if remote else "…", "", "", "", "", ""]
        items = [QStandardItem(text) for text in cells]
        items[0].setData(key, KEY_ROLE)
        items[0].setToolTip(f"{source} · {entry.path}")
        for column in NUMERIC:
            items[column].setData(RIGHT, Qt.ItemDataRole.TextAlignmentRole)
        self.model.appendRow(items)
        self._rows[key] = self.model.rowCount() - 1
        items[0].setData(source, SOURCE_ROLE)
        if remote:
            self._summarized.add(key)
        self._index_words(key)

    def _index_words(self, key: tuple[Path, int]) -> None:
        row = self._rows[key]
        first = self.model.item(row, 0)
        text = " ".join([first.data(SOURCE_ROLE) or "", *(self.model.item(row, c).text() for c in SEARCHED)])
        first.setData(" ".join(words_of(text)), TEXT_ROLE)

    def set_summary(self, summary) -> None:
        """Fill in a row's shape columns from a CheckpointSummary (or its error)."""
        key = (Path(summary.path), int(summary.step))
        row = self._rows.get(key)
        if row is None:
            return
        self._summarized.add(key)
        item = self.model.item
        if summary.error:
            item(row, 2).setText("⚠ unreadable")
            item(row, 2).setToolTip(summary.error)
        else:
            family = "nanochat fork" if summary.era.startswith("fork") else f"nanochat {summary.era}"
            item(row, 2).setText(family)
            item(row, 3).setText(human_params(summary.params))
            item(row, 4).setText(f"{summary.sequence_len:,}")
            item(row, 5).setText(summary.stored_dtype)
            item(row, 6).setText(f"≈{human_bytes(summary.memory_estimate())}")
            item(row, 6).setToolTip("The weights in float32 plus a full-context KV cache")
        self._index_words(key)

    def set_recent(self, recent: list[dict]) -> None:
        """When each checkpoint was last loaded (the settings' recent_checkpoints)."""
        self._recent = {(Path(r["dir"]), int(r["step"])): float(r["used"]) for r in recent}
        self._refresh_marks()

    def set_loaded(self, key: tuple[Path, int] | None) -> None:
        """The checkpoint loaded now: marked, and highlighted when the picker opens."""
        self._loaded = (Path(key[0]), int(key[1])) if key is not None else None
        self._refresh_marks()

    def _refresh_marks(self) -> None:
        now = time.time()
        for key, row in self._rows.items():
            first = self.model.item(row, 0)
            font = QFont(first.font())
            font.setBold(key == self._loaded)
            first.setFont(font)
            used = self._recent.get(key)
            last = "loaded now" if key == self._loaded else relative_time(used, now) if used else ""
            self.model.item(row, 7).setText(last)

    # ----- opening, moving, choosing ----------------------------------------------------------

    def open_picker(self) -> None:
        """Show with an empty search, the loaded checkpoint highlighted, the keyboard in the box."""
        self.search.clear()
        if self._loaded is None or not self.highlight(*self._loaded):
            self._after_filter()
        missing = [key for key in self._rows if key not in self._summarized]
        if missing:
            self.summaries_wanted.emit(missing)
        parent = self.parentWidget()
        if parent is not None:  # never wider or taller than the window it belongs to
            self.resize(min(900, parent.width() - 40), min(460, parent.height() - 60))
        self.show()
        self.activateWindow()
        self.search.setFocus()

    def current(self) -> tuple[Path, int] | None:
        index = self.view.currentIndex()
        if not index.isValid():
            return None
        return self.proxy.index(index.row(), 0).data(KEY_ROLE)

    def visible_keys(self) -> list[tuple[Path, int]]:
        """The rows the search keeps, top to bottom."""
        return [self.proxy.index(r, 0).data(KEY_ROLE) for r in range(self.proxy.rowCount())]

    def row_texts(self, key: tuple[Path, int]) -> list[str]:
        row = self._rows[(Path(key[0]), int(key[1]))]
        return [self.model.item(row, c).text() for c in range(len(COLUMNS))]

    def highlight(self, path: Path, step: int) -> bool:
        row = self._rows.get((Path(path), int(step)))
        if row is None:
            return False
        index = self.proxy.mapFromSource(self.model.index(row, 0))
        if not index.isValid():
            return False
        self.view.setCurrentIndex(index)
        self.view.scrollTo(index)
        return True

    def _on_query(self, text: str) -> None:
        self.proxy.setFilterRegularExpression(query_pattern(text))
        self._after_filter()

    def _after_filter(self) -> None:
        """Keep a highlighted row among those shown (the first one when it was filtered away)."""
        shown = self.proxy.rowCount()
        if shown and not self.view.currentIndex().isValid():
            self.view.setCurrentIndex(self.proxy.index(0, 0))
        total = self.model.rowCount()
        self.count.setText(f"{shown} of {total} checkpoints" if shown != total else f"{total} checkpoints")

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        """The search box keeps the focus; arrows move in the list, Enter loads."""
        if obj is self.search and isinstance(event, QKeyEvent) and event.type() == QEvent.Type.KeyPress:
            key = event.key()
            if key in NAV_KEYS:
                QApplication.sendEvent(self.view, event)
                return True
            if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
                self._load_index(self.view.currentIndex())
                return True
        return super().eventFilter(obj, event)

    def _load_index(self, index: QModelIndex) -> None:
        if not index.isValid():
            return
        key = self.proxy.index(index.row(), 0).data(KEY_ROLE)
        self.accept()
        self.load_requested.emit(Path(key[0]), int(key[1]))

    def _open_folder(self) -> None:
        self.reject()
        self.open_folder_requested.emit()
