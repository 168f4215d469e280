"""Qt-free persistence of conversations: SQLite history, streaming saves, search and export.

Nothing here imports PySide6; the UI calls it from the GUI thread (or one executor).
"""

from __future__ import annotations

from desktop.store.history import ConversationRow, HistoryStore
from desktop.store.schema import HistoryError
from desktop.store.search import SearchHit
from desktop.store.streaming import StreamingWriter

__all__ = ["ConversationRow", "HistoryError", "HistoryStore", "SearchHit", "StreamingWriter"]
