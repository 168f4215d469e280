"""The history sidebar: New chat, search, the conversation list (rename/delete/export) and Undo.

Rows show the title and, under it, how long ago the chat changed (or, while searching, the
matching snippet with the matches highlighted). Deleting hides the row at once and offers Undo
for a few seconds; the store only marks the chat deleted, so Undo is cheap.
"""

from __future__ import annotations

import time
from functools import partial

from PySide6.QtCore import QEvent, QModelIndex, QPersistentModelIndex, QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QAction, QColor, QFont, QKeySequence, QPainter, QPainterPath
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)
from superqt.utils import qdebounced

from desktop.qt.widgets import icons, theme

UNDO_MS = 8000
MARK_START, MARK_END = "\x02", "\x03"  # the store wraps search matches in these
ID_ROLE = Qt.ItemDataRole.UserRole
SUBTITLE_ROLE = Qt.ItemDataRole.UserRole + 1
TITLE_ROLE = Qt.ItemDataRole.UserRole + 2  # the stored title, to tell a rename from a no-op edit
EXPORT_FORMATS = (("md", "Markdown…"), ("json", "JSON…"))


def relative_time(epoch: float, now: float | None = None) -> str:
    """ "just now", "5 min ago", "3 h ago", "yesterday", "4 days ago", then the date."""
    now = time.time() if now is None else now
    delta = max(0.0, now - epoch)
    if delta < 60:
        return "just now"
    if delta < 3600:
        return f"{int(delta // 60)} min ago"
    if delta < 86400:
        return f"{int(delta // 3600)} h ago"
    if delta < 2 * 86400:
        return "yesterday"
    if delta < 7 * 86400:
        return f"{int(delta // 86400)} days ago"
    then, today = time.localtime(epoch), time.localtime(now)
    return time.strftime("%d %b" if then.tm_year == today.tm_year else "%d %b %Y", then).lstrip("0")


class _RowDelegate(QStyledItemDelegate):
    """Paints a row as a rounded card: title on top, the muted subtitle (or snippet) below."""

    PAD_X, PAD_Y, GAP = 10, 7, 2

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        fm = option.fontMetrics
        return QSize(120, 2 * self.PAD_Y + fm.height() * 2 + self.GAP)

    def paint(
        self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        c = theme.colors()
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = option.rect.adjusted(2, 1, -2, -1)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        hovered = bool(option.state & QStyle.StateFlag.State_MouseOver)
        if selected or hovered:
            path = QPainterPath()
            path.addRoundedRect(rect, 8, 8)
            painter.fillPath(path, QColor(c.selection if selected else c.hover))
        fm = option.fontMetrics
        text_rect = rect.adjusted(self.PAD_X, self.PAD_Y, -self.PAD_X, -self.PAD_Y)
        title_font = QFont(option.font)
        title_font.setWeight(QFont.Weight.DemiBold if selected else QFont.Weight.Medium)
        painter.setFont(title_font)
        painter.setPen(QColor(c.text))
        title = index.data(Qt.ItemDataRole.DisplayRole) or "Untitled"
        title_rect = QRect(text_rect.left(), text_rect.top(), text_rect.width(), fm.height())
        painter.drawText(
            title_rect,
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            painter.fontMetrics().elidedText(title, Qt.TextElideMode.ElideRight, title_rect.width()),
        )
        painter.setFont(option.font)
        sub_top = title_rect.bottom() + 1 + self.GAP
        self._draw_marked(
            painter, index.data(SUBTITLE_ROLE) or "", QPoint(text_rect.left(), sub_top), text_rect.width(), fm
        )
        painter.restore()

    @staticmethod
    def _draw_marked(painter: QPainter, text: str, origin: QPoint, width: int, fm) -> None:
        """Draw ``text`` in one line; runs between MARK_START/MARK_END in the accent colour."""
        c = theme.colors()
        x, baseline = origin.x(), origin.y() + fm.ascent()
        marked = False
        for chunk in text.replace(MARK_END, MARK_START).split(MARK_START):
            room = origin.x() + width - x
            if room <= 0:
                break
            shown = fm.elidedText(chunk, Qt.TextElideMode.ElideRight, room)
            painter.setPen(QColor(c.accent if marked else c.muted))
            painter.drawText(QPoint(x, baseline), shown)
            x += fm.horizontalAdvance(shown)
            if shown != chunk:
                break
            marked = not marked

    def updateEditorGeometry(
        self, editor: QWidget, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        rect = option.rect.adjusted(self.PAD_X - 4, self.PAD_Y - 3, -self.PAD_X + 2, 0)
        rect.setHeight(option.fontMetrics.height() + 8)
        editor.setGeometry(rect)


class HistorySidebar(QFrame):
    """Signals: conversation_selected(int), new_requested(), rename_requested(int, str),
    delete_requested(int), undo_delete_requested(int), export_requested(int, str "md"|"json"),
    search_changed(str) (every keystroke: the receiver debounces).

    The highlighted row is the conversation on screen, which the window sets with ``select``
    (None for a new chat). A click, a double-click, Enter or an arrow key on a row asks for that
    conversation (conversation_selected), also when it is the highlighted one: the window may be
    showing another tab, and opening the conversation shown does nothing anyway.
    """

    conversation_selected = Signal(int)
    new_requested = Signal()
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    undo_delete_requested = Signal(int)
    export_requested = Signal(int, str)
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.setMinimumWidth(170)
        self.setAccessibleName("Conversation history")
        self._rows: list = []
        self._deleted: int | None = None
        self._filling = False
        self._shown: int | None = None  # the conversation on screen, highlighted when listed

        self.new_btn = QPushButton("New chat")
        self.new_btn.setObjectName("Primary")
        self.new_btn.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_btn.setAccessibleName("New chat")
        self.new_btn.setCursor(Qt.CursorShape.PointingHandCursor)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setToolTip("Search titles and messages (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search conversations")
        self.search_icon = QAction(self.search)
        self.search.addAction(self.search_icon, QLineEdit.ActionPosition.LeadingPosition)

        self.list = QListWidget()
        self.list.setObjectName("HistoryList")
        self.list.setAccessibleName("Conversations")
        self.list.setItemDelegate(_RowDelegate(self.list))
        self.list.setMouseTracking(True)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setEditTriggers(QListWidget.EditTrigger.EditKeyPressed)
        self.list.setUniformItemSizes(True)
        self.empty = QLabel("No chats yet")
        self.empty.setObjectName("Muted")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)

        self.undo_bar = QFrame()
        self.undo_bar.setObjectName("UndoBar")
        self.undo_label = QLabel("Chat deleted")
        self.undo_btn = QPushButton("Undo")
        self.undo_btn.setAccessibleName("Undo delete")
        self.undo_btn.setCursor(Qt.CursorShape.PointingHandCursor)
        undo_row = QHBoxLayout(self.undo_bar)
        undo_row.setContentsMargins(12, 6, 6, 6)
        undo_row.addWidget(self.undo_label, 1)
        undo_row.addWidget(self.undo_btn)
        self.undo_bar.hide()

        col = QVBoxLayout(self)
        col.setContentsMargins(10, 12, 10, 10)
        col.setSpacing(8)
        col.addWidget(self.new_btn)
        col.addWidget(self.search)
        col.addWidget(self.empty)
        col.addWidget(self.list, 1)
        col.addWidget(self.undo_bar)

        # UNDO_MS after the last delete (each delete starts the wait again).
        self._hide_undo_later = qdebounced(self.undo_bar.hide, timeout=UNDO_MS, parent=self)

        self.new_btn.clicked.connect(self.new_requested)
        self.search.textChanged.connect(self.search_changed)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemClicked.connect(self._on_item_chosen)
        self.list.itemActivated.connect(self._on_item_chosen)  # double-click, Enter
        self.list.itemChanged.connect(self._on_item_edited)
        self.list.customContextMenuRequested.connect(self._menu)
        self.undo_btn.clicked.connect(self._undo)
        for keys, slot in (
            (QKeySequence.StandardKey.Delete, self._delete_current),
            ("F2", self._rename_current),
        ):
            action = QAction(self.list)
            action.setShortcut(QKeySequence(keys))
            action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
            action.triggered.connect(slot)
            self.list.addAction(action)
        self._refresh_icons()
        self._update_empty()

    # ----- content ---------------------------------------------------------------------------

    def kind_of(self, conv_id: int) -> str:
        """ "chat" or "compare" for a listed conversation."""
        return next((r.kind for r in self._rows if r.id == conv_id), "chat")

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def set_conversations(self, rows: list) -> None:
        """Rows with .id .title .updated (epoch) .kind; ignored while a search is shown."""
        self._rows = list(rows)
        if not self.search.text().strip():
            self._show_rows()

    def set_search_results(self, hits: list) -> None:
        """Hits with .conversation_id .title .snippet (matches between MARK_START/MARK_END)."""
        if not self.search.text().strip():
            self._show_rows()
            return
        # One line: the parts of a message (text, a tool call, its result) are apart by newlines.
        self._fill([(h.conversation_id, h.title, " ".join(h.snippet.split())) for h in hits])

    def _show_rows(self) -> None:
        self._fill([(r.id, r.title, _subtitle(r)) for r in self._rows])

    def _fill(self, rows: list[tuple[int, str, str]]) -> None:
        self._filling = True
        self.list.clear()
        for conv_id, title, subtitle in rows:
            item = QListWidgetItem(title or "Untitled")
            item.setData(ID_ROLE, conv_id)
            item.setData(TITLE_ROLE, title)
            item.setData(SUBTITLE_ROLE, subtitle)
            item.setToolTip(title)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if conv_id == self._shown:
                self.list.setCurrentItem(item)
        self._filling = False
        self._update_empty()

    def _update_empty(self) -> None:
        searching = bool(self.search.text().strip())
        self.empty.setText("No chats match your search" if searching else "No chats yet")
        self.empty.setVisible(self.list.count() == 0)

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(ID_ROLE) if item is not None else None

    def select(self, conv_id: int | None) -> None:
        """Highlight the conversation on screen (None: none is, e.g. a new chat) without emitting
        conversation_selected; it stays highlighted when the list is refilled."""
        self._shown = conv_id
        self._filling = True
        item = self._item(conv_id) if conv_id is not None else None
        if item is not None:
            self.list.setCurrentItem(item)
        else:
            self.list.setCurrentRow(-1)
            self.list.clearSelection()
        self._filling = False

    def _item(self, conv_id: int) -> QListWidgetItem | None:
        for i in range(self.list.count()):
            if self.list.item(i).data(ID_ROLE) == conv_id:
                return self.list.item(i)
        return None

    # ----- user actions ----------------------------------------------------------------------

    def _on_current_changed(self, item: QListWidgetItem | None, _previous) -> None:
        if item is not None and not self._filling:
            self.conversation_selected.emit(item.data(ID_ROLE))

    def _on_item_chosen(self, item: QListWidgetItem) -> None:
        if not self._filling:
            self.conversation_selected.emit(item.data(ID_ROLE))

    def rename(self, conv_id: int) -> None:
        """Edit the title in place; Enter commits (rename_requested), Esc cancels."""
        item = self._item(conv_id)
        if item is not None:
            self.list.setCurrentItem(item)
            self.list.editItem(item)

    def _on_item_edited(self, item: QListWidgetItem) -> None:
        if self._filling:
            return
        new, old = item.text().strip(), item.data(TITLE_ROLE)
        if new and new != old:
            item.setData(TITLE_ROLE, new)
            self.rename_requested.emit(item.data(ID_ROLE), new)
        elif not new:
            item.setText(old)  # an emptied title is a cancel

    def delete(self, conv_id: int) -> None:
        """Delete (the row goes at once) and offer Undo for UNDO_MS."""
        item = self._item(conv_id)
        if item is not None:
            self._filling = True
            self.list.takeItem(self.list.row(item))
            self._filling = False
        self._rows = [r for r in self._rows if r.id != conv_id]
        self._deleted = conv_id
        self.delete_requested.emit(conv_id)
        self.undo_bar.show()
        self._hide_undo_later()
        self._update_empty()

    def _undo(self) -> None:
        if self._deleted is not None:
            self.undo_delete_requested.emit(self._deleted)
            self._deleted = None
        self._hide_undo_later.cancel()
        self.undo_bar.hide()

    def _delete_current(self) -> None:
        if (conv_id := self.current_id()) is not None:
            self.delete(conv_id)

    def _rename_current(self) -> None:
        if (conv_id := self.current_id()) is not None:
            self.rename(conv_id)

    def _menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        conv_id = item.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.rename(conv_id)).setShortcut(QKeySequence("F2"))
        export = menu.addMenu("Export as")
        for fmt, label in EXPORT_FORMATS:
            export.addAction(label, partial(self.export_requested.emit, conv_id, fmt))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete(conv_id)).setShortcut(QKeySequence.StandardKey.Delete)
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def _refresh_icons(self) -> None:
        c = theme.colors()
        self.new_btn.setIcon(icons.icon("plus", c.on_accent))
        self.search_icon.setIcon(icons.icon("search", c.muted))

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._refresh_icons()


def _subtitle(row) -> str:
    when = relative_time(row.updated)
    return when if row.kind in ("chat", "", None) else f"{when} · {row.kind}"
