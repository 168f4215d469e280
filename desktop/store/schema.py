"""The history database's schema, its migrations, and the optional full-text index.

``PRAGMA user_version`` is the schema version: ``MIGRATIONS[i]`` takes the database from
version ``i`` to ``i + 1``, each in its own ``BEGIN IMMEDIATE`` transaction that re-reads the
version first, so two app instances opening an old file at the same time migrate it once.

The FTS5 index is kept out of the numbered migrations because it depends on the SQLite
build, not on the app version: ``ensure_search_index`` creates it when FTS5 is available.
Its sync triggers are the marker that the index is current. Where FTS5 is missing, the
triggers are dropped (a trigger that names an fts5 table would make every write fail), and
when FTS5 is back the index is rebuilt from the content tables before the triggers return.
"""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import FileMissing, FileRefused, open_regular
from desktop.engine.files.safe_json import JsonRefused, loads_bounded
from desktop.store.guard import GuardedConnection, Schema, Untrusted, made_by, schema_of
from desktop.store.guard import connect as guarded_connect


class HistoryError(NanoscopeError):
    """The history database cannot be opened or used (one readable line naming the file)."""


# Compare replies of schema 1 kept their tokens as parallel meta lists under these names.
_V1_TOKEN_COLUMNS = {
    "token_ids": "ids",
    "token_texts": "texts",
    "token_kinds": "kinds",
    "token_specials": "specials",
    "token_forced": "forced",
    "token_logprobs": "logprobs",
    "top_logprobs": "top",
}


def _v1_tokens(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A schema-1 message meta with its tokens in the one encoding (``tokens``), or None when
    it has no tokens to convert. Chats kept ``raw`` ([id, forced] pairs); comparisons kept one
    list per field."""
    if isinstance(meta.get("raw"), list):
        pairs = [p for p in meta.pop("raw") if isinstance(p, list) and len(p) == 2]
        meta["tokens"] = {"ids": [p[0] for p in pairs], "forced": [p[1] for p in pairs]}
        return meta
    if "token_ids" in meta:
        meta["tokens"] = {new: meta.pop(old) for old, new in _V1_TOKEN_COLUMNS.items() if old in meta}
        if "seed" in meta and isinstance(meta.get("sampling"), dict):
            meta["sampling"].setdefault("seed", meta.pop("seed"))
        return meta
    return None


def _one_token_encoding(conn: sqlite3.Connection) -> None:
    """v1 -> v2: chats and comparisons store their tokens the same way (see ``_v1_tokens``)."""
    rows = conn.execute(
        "SELECT id, meta FROM messages WHERE meta LIKE '%\"raw\"%' OR meta LIKE '%\"token_ids\"%'"
    ).fetchall()
    for msg_id, text in rows:
        try:
            meta = loads_bounded(text)
        except JsonRefused:
            continue  # unreadable meta stays as it is; the reader shows what it can
        if isinstance(meta, dict) and (new := _v1_tokens(meta)) is not None:
            conn.execute("UPDATE messages SET meta = ? WHERE id = ?", (json.dumps(new, default=str), msg_id))


Migration = tuple[str, ...] | Callable[[sqlite3.Connection], None]

_TABLES = (
    # message_count is kept here, not counted, so the conversation list costs no scan of messages.
    """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            kind TEXT NOT NULL DEFAULT 'chat' CHECK (kind IN ('chat', 'compare')),
            created REAL NOT NULL,
            updated REAL NOT NULL,
            deleted_at REAL,
            meta TEXT NOT NULL DEFAULT '{}',
            message_count INTEGER NOT NULL DEFAULT 0
        )
        """,
    # The sidebar lists live conversations newest first: a partial index serves it without a sort.
    "CREATE INDEX conversations_live ON conversations (updated DESC, id DESC) WHERE deleted_at IS NULL",
    "CREATE INDEX conversations_deleted ON conversations (deleted_at) WHERE deleted_at IS NOT NULL",
    # parent_id links a reply to what it answers; an edit or a regeneration is a new sibling.
    # rank orders siblings for the active branch: a new message, or one the user selects, gets
    # the conversation's highest rank + 1, so "most recent or explicitly selected" is one rule.
    # text is the searchable plain text of parts (the FTS index reads it as external content).
    """
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            parent_id INTEGER REFERENCES messages (id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            parts TEXT NOT NULL,
            meta TEXT NOT NULL DEFAULT '{}',
            created REAL NOT NULL,
            complete INTEGER NOT NULL DEFAULT 1,
            rank INTEGER NOT NULL,
            text TEXT NOT NULL DEFAULT ''
        )
        """,
    "CREATE INDEX messages_by_conversation ON messages (conversation_id, parent_id)",
    # Needed by the parent_id foreign key: without it every cascaded delete scans the table.
    "CREATE INDEX messages_by_parent ON messages (parent_id)",
)
MIGRATIONS: list[Migration] = [_TABLES, _one_token_encoding]

SCHEMA_VERSION = len(MIGRATIONS)

_SEARCH_TABLES = {
    # External content: the index reads messages.text and conversations.title, storing no second copy.
    "messages_fts": "CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5 ("
    "text, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2')",
    "titles_fts": "CREATE VIRTUAL TABLE IF NOT EXISTS titles_fts USING fts5 ("
    "title, content='conversations', content_rowid='id', tokenize='unicode61 remove_diacritics 2')",
}

_SEARCH_TRIGGERS = {
    "messages_fts_ai": "AFTER INSERT ON messages BEGIN "
    "INSERT INTO messages_fts (rowid, text) VALUES (new.id, new.text); END",
    "messages_fts_ad": "AFTER DELETE ON messages BEGIN "
    "INSERT INTO messages_fts (messages_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "messages_fts_au": "AFTER UPDATE OF text ON messages BEGIN "
    "INSERT INTO messages_fts (messages_fts, rowid, text) VALUES ('delete', old.id, old.text); "
    "INSERT INTO messages_fts (rowid, text) VALUES (new.id, new.text); END",
    "titles_fts_ai": "AFTER INSERT ON conversations BEGIN "
    "INSERT INTO titles_fts (rowid, title) VALUES (new.id, new.title); END",
    "titles_fts_ad": "AFTER DELETE ON conversations BEGIN "
    "INSERT INTO titles_fts (titles_fts, rowid, title) VALUES ('delete', old.id, old.title); END",
    "titles_fts_au": "AFTER UPDATE OF title ON conversations BEGIN "
    "INSERT INTO titles_fts (titles_fts, rowid, title) VALUES ('delete', old.id, old.title); "
    "INSERT INTO titles_fts (rowid, title) VALUES (new.id, new.title); END",
}


def fts5_available(conn: sqlite3.Connection) -> bool:
    """Whether this SQLite build has FTS5 (most do; some system Pythons do not)."""
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.fts5_probe USING fts5 (x)")
    except sqlite3.OperationalError:
        return False
    conn.execute("DROP TABLE temp.fts5_probe")
    return True


SQLITE_HEADER = b"SQLite format 3\x00"
OUR_TABLES = frozenset({"conversations", "messages"})
# Every statement runs under a deadline (store/guard.py). The history's honest statements scan at
# most the whole history (a search without FTS5, a migration, rebuilding the index): two billion
# instructions is far past that, and the clock is for a slow disk. One row holds one message.
MAX_STEPS = 2_000_000_000
DEADLINE_S = 60.0
MAX_VALUE_BYTES = 256 << 20


def connect(path: Path | str, **options: Any) -> GuardedConnection:
    """A connection to a history file whose every statement runs under the limits above."""
    return guarded_connect(path, MAX_STEPS, DEADLINE_S, MAX_VALUE_BYTES, **options)


def _core_tables(conn: sqlite3.Connection) -> None:
    for statement in _TABLES:
        conn.execute(statement)


def strangers(found: Schema) -> list[str]:
    """The objects of a history's schema that Nanoscope does not make (a view, a trigger, an index),
    compared by their statements; the FTS5 index's own tables are whatever this SQLite's FTS5 made
    them, and SQLite's statistics tables are its own."""
    ours = {(kind, name, sql) for kind, name, _, sql in made_by(_core_tables)}
    ours |= {("trigger", name, f"CREATE TRIGGER {name} {body}") for name, body in _SEARCH_TRIGGERS.items()}
    ours |= {("table", n, sql.replace(" IF NOT EXISTS", "", 1)) for n, sql in _SEARCH_TABLES.items()}
    shadows = (*(f"{name}_" for name in _SEARCH_TABLES), "sqlite_stat")
    return sorted(
        f"{kind} {name}"
        for kind, name, _, sql in found
        if (kind, name, sql) not in ours
        and not (kind == "table" and name.startswith(shadows))
        and not (kind == "index" and name.startswith("sqlite_autoindex_"))
    )


def refuse_foreign(path: Path) -> None:
    """Refuse a file that is not Nanoscope's history, before anything opens it for writing.

    Opening a database normally already changes it (the journal mode, a migration's tables), so
    the file is first read as bytes and then through a read-only, immutable connection. Accepted:
    no file, an empty one, or a database with Nanoscope's tables and schema version, and nothing in
    its schema that Nanoscope does not make (:func:`strangers`: a view where a table belongs, a
    trigger that would run inside every write); anything else (another program's SQLite file,
    something that is not SQLite) is left untouched.
    """
    try:
        with open_regular(path) as f:
            header = f.read(len(SQLITE_HEADER))
    except FileMissing:
        return
    except FileRefused as e:
        raise HistoryError(f"{path}: not a history database ({e.reason})") from None
    except OSError as e:
        raise HistoryError(f"{path}: cannot read the history database ({e.strerror or e})") from None
    if not header:
        return
    if header != SQLITE_HEADER:
        raise HistoryError(
            f"{path}: not a SQLite database; Nanoscope leaves it alone (move it or choose another home)"
        )
    uri = "file:" + urllib.parse.quote(os.fsencode(Path(path).resolve())) + "?mode=ro&immutable=1"
    try:
        conn = connect(uri, uri=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            found = schema_of(conn)
        finally:
            conn.close()
    except (sqlite3.Error, Untrusted) as e:
        raise HistoryError(f"{path}: cannot read the history database ({e})") from None
    tables = {name for kind, name, _, _ in found if kind == "table"}
    odd = strangers(found)
    if tables >= OUR_TABLES and odd:
        raise HistoryError(
            f"{path}: holds {', '.join(odd[:3])}{' …' if len(odd) > 3 else ''}, which Nanoscope does not "
            "make; Nanoscope leaves it alone (move it or choose another home)"
        )
    if (version == 0 and not found) or (version >= 1 and tables >= OUR_TABLES):
        return
    listed = ", ".join(sorted(tables)[:5]) or "none"
    raise HistoryError(
        f"{path}: a SQLite database of another program (schema version {version}, tables: {listed}); "
        "Nanoscope leaves it alone (move it or choose another home)"
    )


def migrate(conn: sqlite3.Connection, name: str) -> None:
    """Bring the database to SCHEMA_VERSION; refuse one written by a newer app. ``name`` is for errors."""
    while True:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"{name}: written by a newer Nanoscope (history schema {version}, "
                f"this version knows {SCHEMA_VERSION}); update Nanoscope to open it"
            )
        if version == SCHEMA_VERSION:
            return
        with immediate(conn):
            # Another instance may have migrated between our read and our lock.
            if conn.execute("PRAGMA user_version").fetchone()[0] != version:
                continue
            step = MIGRATIONS[version]
            if callable(step):
                step(conn)
            else:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")


def ensure_search_index(conn: sqlite3.Connection) -> bool:
    """Create, rebuild or disable the FTS index to match this SQLite build; True when it is usable."""
    available = fts5_available(conn)
    with immediate(conn):
        present = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        } & set(_SEARCH_TRIGGERS)
        if not available:
            for trigger in present:
                conn.execute(f"DROP TRIGGER {trigger}")
            return False
        if present == set(_SEARCH_TRIGGERS):
            return True
        for statement in _SEARCH_TABLES.values():
            conn.execute(statement)
        conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')")
        conn.execute("INSERT INTO titles_fts (titles_fts) VALUES ('rebuild')")
        for trigger, body in _SEARCH_TRIGGERS.items():
            conn.execute(f"CREATE TRIGGER IF NOT EXISTS {trigger} {body}")
        return True


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection.

    IMMEDIATE takes the write lock up front, so a second instance waits in busy_timeout
    instead of failing later with an unresolvable read-to-write upgrade deadlock.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")  # inside the try: with WAL, a full disk often shows up only here
    except BaseException:
        if conn.in_transaction:
            # The original error says what went wrong; a failing rollback would only hide it.
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
