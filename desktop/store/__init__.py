"""Qt-free persistence of conversations: SQLite history, streaming saves, search and export.

Nothing here imports PySide6; the UI calls it from the GUI thread (or one executor).
"""

from __future__ import annotations

from desktop.store.history import ConversationRow, HistoryStore, SearchHit, StreamingWriter
from desktop.store.schema import HistoryError

__all__ = ["ConversationRow", "HistoryError", "HistoryStore", "SearchHit", "StreamingWriter"]
