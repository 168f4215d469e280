"""The history sidebar: new chat, search, the conversation list, rename/delete/export, undo."""

from __future__ import annotations

import html
import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QVBoxLayout,
)

UNDO_MS = 8000
MARK_START, MARK_END = "\x02", "\x03"


def relative_time(epoch: float, now: float | None = None) -> str:
    delta = max(0.0, (now or time.time()) - epoch)
    if delta < 60:
        return "just now"
    for size, unit in ((86400 * 7, "w"), (86400, "d"), (3600, "h"), (60, "min")):
        if delta >= size:
            return f"{int(delta // size)} {unit} ago"
    return ""


class HistorySidebar(QFrame):
    """Signals: conversation_selected(int), new_requested(), rename_requested(int, str),
    delete_requested(int), undo_delete_requested(int), export_requested(int, str), search_changed(str)."""

    conversation_selected = Signal(int)
    new_requested = Signal()
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    undo_delete_requested = Signal(int)
    export_requested = Signal(int, str)
    search_changed = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("Sidebar")
        self.setMinimumWidth(200)
        self.setAccessibleName("Conversation history")
        col = QVBoxLayout(self)
        col.setContentsMargins(10, 12, 10, 10)
        self.new_btn = QPushButton("+  New chat")
        self.new_btn.setObjectName("Primary")
        self.new_btn.setToolTip("Start a new conversation (Ctrl+N)")
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats  (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search conversations")
        self.list = QListWidget()
        self.list.setAccessibleName("Conversations")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setWordWrap(True)
        self.undo_bar = QFrame()
        undo_row = QHBoxLayout(self.undo_bar)
        undo_row.setContentsMargins(4, 2, 4, 2)
        self.undo_label = QLabel("Chat deleted")
        self.undo_btn = QPushButton("Undo")
        undo_row.addWidget(self.undo_label, 1)
        undo_row.addWidget(self.undo_btn)
        self.undo_bar.hide()
        col.addWidget(self.new_btn)
        col.addWidget(self.search)
        col.addWidget(self.list, 1)
        col.addWidget(self.undo_bar)
        self._deleted: int | None = None
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.setInterval(UNDO_MS)
        self._undo_timer.timeout.connect(self.undo_bar.hide)
        self._rows: list = []
        self.new_btn.clicked.connect(self.new_requested)
        self.search.textChanged.connect(self.search_changed)
        self.list.itemClicked.connect(self._on_clicked)
        self.list.customContextMenuRequested.connect(self._menu)
        self.undo_btn.clicked.connect(self._undo)

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def set_conversations(self, rows: list) -> None:
        self._rows = list(rows)
        if not self.search.text().strip():
            self._fill([(r.id, r.title, relative_time(r.updated), r.kind) for r in rows])

    def set_search_results(self, hits: list) -> None:
        if not self.search.text().strip():
            self._fill([(r.id, r.title, relative_time(r.updated), r.kind) for r in self._rows])
            return
        self._fill([(h.conversation_id, h.title, h.snippet, "chat") for h in hits], rich=True)

    def _fill(self, rows: list[tuple[int, str, str, str]], rich: bool = False) -> None:
        current = self.current_id()
        self.list.clear()
        for conv_id, title, sub, kind in rows:
            prefix = "⇆ " if kind == "compare" else ""
            sub_text = sub.replace(MARK_START, "«").replace(MARK_END, "»") if rich else sub
            item = QListWidgetItem(f"{prefix}{title}\n{sub_text}")
            item.setData(Qt.ItemDataRole.UserRole, conv_id)
            item.setToolTip(html.escape(title))
            self.list.addItem(item)
            if conv_id == current:
                item.setSelected(True)

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item is not None else None

    def select(self, conv_id: int) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.ItemDataRole.UserRole) == conv_id:
                self.list.setCurrentRow(i)
                return

    def _on_clicked(self, item: QListWidgetItem) -> None:
        self.conversation_selected.emit(item.data(Qt.ItemDataRole.UserRole))

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        conv_id = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self._rename(conv_id, item.text().split("\n")[0]))
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(conv_id, "md"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(conv_id, "json"))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete(conv_id))
        menu.exec(self.list.mapToGlobal(pos))

    def _rename(self, conv_id: int, old: str) -> None:
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=old.removeprefix("⇆ "))
        if ok and title.strip():
            self.rename_requested.emit(conv_id, title.strip())

    def delete(self, conv_id: int) -> None:
        """Delete with an undo bar (the store only marks the chat deleted)."""
        self._deleted = conv_id
        self.delete_requested.emit(conv_id)
        self.undo_bar.show()
        self._undo_timer.start()

    def _undo(self) -> None:
        if self._deleted is not None:
            self.undo_delete_requested.emit(self._deleted)
            self._deleted = None
        self.undo_bar.hide()
