"""Conversation history in SQLite: conversations, branching messages, search, safe writes.

One ``HistoryStore`` per app instance, used from one thread at a time (the GUI thread or
a single executor); calls are synchronous and short. Two instances may share a file:
WAL lets readers run beside a writer, every write takes the lock up front
(``BEGIN IMMEDIATE``) and ``busy_timeout`` makes the other side wait instead of failing.

Branches: a message's ``parent_id`` is the message it follows. Editing a prompt or
regenerating a reply adds a *sibling*, so the old branch stays reachable. Each message
has a ``rank``; a new or selected message gets its conversation's highest rank + 1, and
the active path follows the highest-ranked child at every level.

Failed writes never raise into the UI: when SQLite reports a full disk, an I/O error or
a lock held too long, the write is kept in memory (``pending_count``, ``last_error``) and
replayed in order before the next write or on ``retry_pending()``. Ids handed out for
writes that are still pending are negative placeholders; later calls may use them, and
they are mapped to the real ids once the write lands.
"""

from __future__ import annotations

import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from desktop.config import paths
from desktop.engine.files.safe_json import JsonRefused, loads_bounded
from desktop.engine.messages import Message, Role
from desktop.store.message_rows import dumps, message_columns, restore_message
from desktop.store.schema import (
    HistoryError,
    connect,
    ensure_search_index,
    immediate,
    migrate,
    refuse_foreign,
)
from desktop.store.search import SearchHit, search_conversations

KINDS = ("chat", "compare")


@dataclass(frozen=True)
class ConversationRow:
    id: int
    title: str
    kind: str
    created: float
    updated: float
    message_count: int  # all stored messages, every branch included
    deleted_at: float | None


@dataclass
class _PendingWrite:
    description: str
    run: Callable[[sqlite3.Connection], int]
    placeholder: int | None  # the negative id handed out for a row this write creates
    coalesce_key: tuple[str, int] | None  # a newer write with the same key replaces this one
    result: int = 0


class HistoryStore:
    """The conversation history of one SQLite file (default ``paths.history_db_path()``)."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 5.0,
    ) -> None:
        self.path = Path(path) if path is not None else paths.history_db_path()
        self._clock = clock
        self._pending: deque[_PendingWrite] = deque()
        self._placeholders: dict[int, int] = {}
        self._next_placeholder = 0
        self.last_error: str | None = None
        refuse_foreign(self.path)  # before connecting: opening for writing changes the file
        try:
            self._conn = connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise HistoryError(f"{self.path}: cannot open the history database ({e})") from e
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is crash-safe in WAL mode; only a power cut can lose the last commits.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            migrate(self._conn, str(self.path))
            self._fts = ensure_search_index(self._conn)
        except HistoryError:
            self._conn.close()
            raise
        except sqlite3.Error as e:
            self._conn.close()
            raise HistoryError(f"{self.path}: cannot open the history database ({e})") from e

    # ----- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Try the pending writes once more, then close; writes that still fail are lost."""
        self.retry_pending()
        with suppress(sqlite3.Error):  # only a planner hint; the history itself is already committed
            self._conn.execute("PRAGMA optimize")
        self._conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def full_text_search(self) -> bool:
        """False when this SQLite has no FTS5 and search falls back to LIKE scans."""
        return self._fts

    # ----- conversations ---------------------------------------------------------------------

    def create_conversation(self, title: str, kind: str = "chat", meta: dict[str, Any] | None = None) -> int:
        if kind not in KINDS:
            raise ValueError(f"conversation kind must be one of {KINDS}, got {kind!r}")
        now, meta_json = self._clock(), dumps(meta or {})

        def run(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO conversations (title, kind, created, updated, meta) VALUES (?, ?, ?, ?, ?)",
                (title, kind, now, now, meta_json),
            )
            return int(cur.lastrowid or 0)

        return self._write(f"create conversation {title!r}", run, creates=True)

    def list_conversations(
        self, limit: int = 200, offset: int = 0, include_deleted: bool = False
    ) -> list[ConversationRow]:
        """Newest first. Live conversations come from a partial index: no table scan, no COUNT."""
        where = "" if include_deleted else "WHERE deleted_at IS NULL"
        rows = self._conn.execute(
            "SELECT id, title, kind, created, updated, message_count, deleted_at FROM conversations "
            f"{where} ORDER BY updated DESC, id DESC LIMIT ? OFFSET ?",
            (limit, offset),
        )
        return [ConversationRow(*row) for row in rows]

    def conversation_meta(self, conv_id: int) -> dict[str, Any]:
        row = self._conn.execute(
            "SELECT meta FROM conversations WHERE id = ?", (self._saved_id(conv_id),)
        ).fetchone()
        if row is None:
            raise KeyError(f"no conversation {conv_id}")
        try:
            meta = loads_bounded(row[0])
        except (JsonRefused, TypeError):
            return {}  # unreadable meta: the conversation still opens
        return meta if isinstance(meta, dict) else {}

    def rename(self, conv_id: int, title: str) -> None:
        def run(conn: sqlite3.Connection) -> int:
            return self._update_conversation(conn, conv_id, "title = ?", (title,))

        self._write(f"rename conversation {conv_id}", run)

    def delete(self, conv_id: int) -> None:
        """Soft delete: hidden from the list and from search until ``purge_deleted``."""
        now = self._clock()

        def run(conn: sqlite3.Connection) -> int:
            return self._update_conversation(conn, conv_id, "deleted_at = ?", (now,))

        self._write(f"delete conversation {conv_id}", run)

    def undelete(self, conv_id: int) -> None:
        def run(conn: sqlite3.Connection) -> int:
            return self._update_conversation(conn, conv_id, "deleted_at = NULL", ())

        self._write(f"restore conversation {conv_id}", run)

    def purge_deleted(self, older_than_s: float) -> int:
        """Remove for good the conversations deleted at least ``older_than_s`` ago; how many went."""
        cutoff = self._clock() - older_than_s

        def run(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "DELETE FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at <= ?", (cutoff,)
            )
            return cur.rowcount

        return self._write("purge deleted conversations", run)

    def import_conversation(
        self, title: str, messages: Iterable[Message], kind: str = "chat", meta: dict[str, Any] | None = None
    ) -> int:
        """Add a whole linear conversation in one transaction (an imported export, a benchmark)."""
        if kind not in KINDS:
            raise ValueError(f"conversation kind must be one of {KINDS}, got {kind!r}")
        now, meta_json = self._clock(), dumps(meta or {})
        columns = [message_columns(m) for m in messages]

        def run(conn: sqlite3.Connection) -> int:
            conv_id = int(
                conn.execute(
                    "INSERT INTO conversations (title, kind, created, updated, meta, message_count) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (title, kind, now, now, meta_json, len(columns)),
                ).lastrowid
                or 0
            )
            parent_id = None
            for rank, (role, parts, msg_meta, text) in enumerate(columns, start=1):
                parent_id = conn.execute(
                    "INSERT INTO messages"
                    " (conversation_id, parent_id, role, parts, meta, created, rank, text)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (conv_id, parent_id, role, parts, msg_meta, now, rank, text),
                ).lastrowid
            return conv_id

        return self._write(f"import conversation {title!r}", run, creates=True)

    # ----- messages --------------------------------------------------------------------------

    def add_message(
        self, conv_id: int, message: Message, parent_id: int | None = None, *, complete: bool = True
    ) -> int:
        """Store ``message`` after ``parent_id`` (None: a first message); it becomes the active branch.

        Pass ``complete=False`` for a reply that is about to stream (see ``StreamingWriter``).
        """
        role, parts, meta, text = message_columns(message)
        now = self._clock()

        def run(conn: sqlite3.Connection) -> int:
            cid = self._resolve(conv_id)
            pid = None if parent_id is None else self._resolve(parent_id)
            if pid is not None:
                owner = conn.execute("SELECT conversation_id FROM messages WHERE id = ?", (pid,)).fetchone()
                if owner is None or owner[0] != cid:
                    raise ValueError(f"message {parent_id} is not in conversation {conv_id}")
            cur = conn.execute(
                "INSERT INTO messages"
                " (conversation_id, parent_id, role, parts, meta, created, complete, rank, text)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (cid, pid, role, parts, meta, now, int(complete), self._next_rank(conn, cid), text),
            )
            conn.execute(
                "UPDATE conversations SET message_count = message_count + 1, updated = ? WHERE id = ?",
                (now, cid),
            )
            return int(cur.lastrowid or 0)

        return self._write(f"add a message to conversation {conv_id}", run, creates=True)

    def update_message(self, msg_id: int, message: Message, complete: bool) -> None:
        """Replace a message's content (a streamed reply growing, then finished)."""
        role, parts, meta, text = message_columns(message)
        now = self._clock()

        def run(conn: sqlite3.Connection) -> int:
            mid = self._resolve(msg_id)
            cur = conn.execute(
                "UPDATE messages SET role = ?, parts = ?, meta = ?, text = ?, complete = ? WHERE id = ?",
                (role, parts, meta, text, int(complete), mid),
            )
            if cur.rowcount == 0:
                raise ValueError(f"no message {msg_id}")
            conn.execute(
                "UPDATE conversations SET updated = ? "
                "WHERE id = (SELECT conversation_id FROM messages WHERE id = ?)",
                (now, mid),
            )
            return mid

        self._write(f"save message {msg_id}", run, coalesce_key=("update", msg_id))

    def select_branch(self, msg_id: int) -> None:
        """Make the path through ``msg_id`` the active one (the "‹ 2/3 ›" arrows call this)."""

        def run(conn: sqlite3.Connection) -> int:
            mid = self._resolve(msg_id)
            row = conn.execute("SELECT conversation_id FROM messages WHERE id = ?", (mid,)).fetchone()
            if row is None:
                raise ValueError(f"no message {msg_id}")
            conn.execute(
                # UNION, not UNION ALL: parents that loop (a hand edit) end the walk, not repeat it
                "WITH RECURSIVE up(id) AS (SELECT ? UNION "
                "SELECT m.parent_id FROM messages m JOIN up ON m.id = up.id WHERE m.parent_id IS NOT NULL) "
                "UPDATE messages SET rank = ? WHERE id IN (SELECT id FROM up)",
                (mid, self._next_rank(conn, row[0])),
            )
            return mid

        self._write(f"select branch {msg_id}", run)

    def active_path(self, conv_id: int) -> list[tuple[int, Message]]:
        """The current branch from the first message down, following the highest rank at each level."""
        children: dict[int | None, list[tuple[int, int, str, str, str]]] = {}
        rows = self._conn.execute(
            "SELECT id, parent_id, rank, role, parts, meta FROM messages WHERE conversation_id = ?",
            (self._saved_id(conv_id),),
        )
        for mid, parent, rank, role, parts, meta in rows:
            children.setdefault(parent, []).append((rank, mid, role, parts, meta))
        path: list[tuple[int, Message]] = []
        node: int | None = None
        while node in children:
            _, node, role, parts, meta = max(children[node])
            path.append((node, restore_message(cast(Role, role), parts, meta)))
        return path

    def siblings(self, msg_id: int) -> list[int]:
        """Ids of the alternatives at ``msg_id``'s place (itself included), oldest first."""
        rows = self._conn.execute(
            "SELECT s.id FROM messages m JOIN messages s "
            "ON s.conversation_id = m.conversation_id AND s.parent_id IS m.parent_id "
            "WHERE m.id = ? ORDER BY s.id",
            (self._saved_id(msg_id),),
        ).fetchall()
        return [r[0] for r in rows] or [msg_id]

    def is_complete(self, msg_id: int) -> bool:
        """False for a reply whose writing never finished (stopped by a crash or a kill)."""
        row = self._conn.execute(
            "SELECT complete FROM messages WHERE id = ?", (self._saved_id(msg_id),)
        ).fetchone()
        return bool(row and row[0])

    # ----- search ----------------------------------------------------------------------------

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Live conversations matching every word of ``query``: title matches first, then newest messages."""
        return search_conversations(self._conn, self._fts, query, limit)

    # ----- failed writes ---------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        """Writes that failed and wait in memory for the disk (or the lock) to come back."""
        return len(self._pending)

    def retry_pending(self) -> bool:
        """Replay the pending writes in order; True when none is left."""
        dropped: str | None = None
        while self._pending:
            write = self._pending[0]
            try:
                if not self._apply(write):
                    return False
            except (sqlite3.IntegrityError, ValueError) as e:
                # It can never succeed (say, its conversation was purged by another instance).
                dropped = f"{self.path}: gave up on a pending write ({write.description}): {e}"
            self._pending.popleft()
        self.last_error = dropped
        return True

    def _write(
        self,
        description: str,
        run: Callable[[sqlite3.Connection], int],
        *,
        creates: bool = False,
        coalesce_key: tuple[str, int] | None = None,
    ) -> int:
        """Apply ``run`` now, or queue it; the result of ``run``, or a placeholder id (or 0) if queued."""
        placeholder = None
        if creates:
            self._next_placeholder -= 1
            placeholder = self._next_placeholder
        write = _PendingWrite(description, run, placeholder, coalesce_key)
        # Order matters (an update follows its insert), so nothing jumps the queue.
        if (not self._pending or self.retry_pending()) and self._apply(write):
            return self._placeholders.pop(placeholder) if placeholder is not None else write.result
        last = self._pending[-1] if self._pending else None
        if coalesce_key is not None and last is not None and last.coalesce_key == coalesce_key:
            self._pending[-1] = write  # only the newest state of a streaming message matters
        else:
            self._pending.append(write)
        return placeholder if placeholder is not None else 0

    def _apply(self, write: _PendingWrite) -> bool:
        """Run one write in its own transaction; False when SQLite could not store it."""
        try:
            with immediate(self._conn) as conn:
                write.result = write.run(conn)
        except sqlite3.IntegrityError:
            raise  # a wrong id or value from the caller: retrying cannot help
        except sqlite3.DatabaseError as e:  # OperationalError included: disk full, I/O error, locked
            self.last_error = f"{self.path}: could not save ({write.description}): {e}"
            return False
        if write.placeholder is not None:
            self._placeholders[write.placeholder] = write.result
        return True

    def _resolve(self, any_id: int) -> int:
        """The real id for an id handed out earlier (placeholders are negative)."""
        if any_id >= 0:
            return any_id
        if any_id not in self._placeholders:
            raise ValueError(f"id {any_id} belongs to a write that was never saved")
        return self._placeholders[any_id]

    def _saved_id(self, any_id: int) -> int:
        # For reads: a placeholder whose write is still pending matches no row, which is the truth.
        return self._placeholders.get(any_id, any_id)

    @staticmethod
    def _next_rank(conn: sqlite3.Connection, conv_id: int) -> int:
        return int(
            conn.execute(
                "SELECT COALESCE(MAX(rank), 0) + 1 FROM messages WHERE conversation_id = ?", (conv_id,)
            ).fetchone()[0]
        )

    def _update_conversation(
        self, conn: sqlite3.Connection, conv_id: int, assignment: str, args: tuple[Any, ...]
    ) -> int:
        cid = self._resolve(conv_id)
        if conn.execute(f"UPDATE conversations SET {assignment} WHERE id = ?", (*args, cid)).rowcount == 0:
            raise ValueError(f"no conversation {conv_id}")
        return cid
