"""Searching the history: every word must match, the last one as a prefix while it is typed.

With FTS5 the words go to SQLite's full-text index; a build without it falls back to LIKE scans.
Each hit carries a snippet around its first match, the matches marked for the view.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass

# Snippets mark each match with these control characters (never present in chat text),
# so the view can turn them into bold without parsing or escaping guesses.
MARK_START = "\x02"
MARK_END = "\x03"

_SNIPPET_CHARS = 80  # snippet width around the first match
_MIN_PREFIX = 3  # shorter last words match whole words only (see _fts_queries)


@dataclass(frozen=True)
class SearchHit:
    conversation_id: int
    title: str
    snippet: str  # matches wrapped in MARK_START … MARK_END
    message_id: int | None  # None when the title matched


def search_conversations(conn: sqlite3.Connection, fts: bool, query: str, limit: int) -> list[SearchHit]:
    """Live conversations matching every word of ``query``: title matches first, then newest messages."""
    words = re.findall(r"\w+", query)
    if not words or limit <= 0:
        return []
    titles_sql, messages_sql, params = _fts_queries(words) if fts else _like_queries(words)
    found: dict[int, SearchHit] = {}
    # Cursors are read lazily and closed as soon as enough conversations are found, so a
    # common word costs a few rows, and no read snapshot outlives the call (it would hold
    # back WAL checkpoints).
    with closing(conn.execute(titles_sql, params)) as titles:
        for conv_id, title in titles:
            found.setdefault(conv_id, SearchHit(conv_id, title, _mark(title, words, len(title)), None))
            if len(found) == limit:
                return list(found.values())
    with closing(conn.execute(messages_sql, params)) as messages:
        for conv_id, title, msg_id, text in messages:
            if conv_id not in found:
                # Cut here, only for the hits kept: FTS5's snippet() would cost a lookup per row.
                found[conv_id] = SearchHit(conv_id, title, _mark(text, words, _SNIPPET_CHARS), msg_id)
                if len(found) == limit:
                    break
    return list(found.values())


def _fts_queries(words: list[str]) -> tuple[str, str, tuple[str]]:
    # Every word must match; the last one as a prefix (search while typing) once it is long
    # enough: one- or two-letter prefixes expand to thousands of terms and would be slow.
    terms = ['"' + w.replace('"', '""') + '"' for w in words]
    if len(words[-1]) >= _MIN_PREFIX:
        terms[-1] += "*"
    # ORDER BY the FTS rowid lets FTS5 walk its doclists newest first, with no sort to wait for.
    titles = (
        "SELECT c.id, c.title FROM titles_fts JOIN conversations c ON c.id = titles_fts.rowid "
        "WHERE titles_fts MATCH ? AND c.deleted_at IS NULL ORDER BY titles_fts.rowid DESC"
    )
    messages = (
        "SELECT c.id, c.title, m.id, m.text FROM messages_fts "
        "JOIN messages m ON m.id = messages_fts.rowid JOIN conversations c ON c.id = m.conversation_id "
        "WHERE messages_fts MATCH ? AND c.deleted_at IS NULL ORDER BY messages_fts.rowid DESC"
    )
    return titles, messages, (" ".join(terms),)


def _like_queries(words: list[str]) -> tuple[str, str, tuple[str, ...]]:
    """The slow path for SQLite builds without FTS5: scans, newest first."""
    patterns = tuple("%" + re.sub(r"([\\%_])", r"\\\1", w) + "%" for w in words)

    def where(column: str) -> str:
        return " AND ".join(f"{column} LIKE ? ESCAPE '\\'" for _ in patterns)

    titles = (
        f"SELECT id, title FROM conversations WHERE deleted_at IS NULL AND {where('title')} ORDER BY id DESC"
    )
    messages = (
        "SELECT c.id, c.title, m.id, m.text FROM messages m JOIN conversations c ON c.id = m.conversation_id "
        f"WHERE c.deleted_at IS NULL AND {where('m.text')} ORDER BY m.id DESC"
    )
    return titles, messages, patterns


def _mark(text: str, words: list[str], width: int) -> str:
    """A window of about ``width`` characters around the first match, each match marked.

    Matching is case-insensitive and, like the search, treats the last word as a prefix.
    """
    alternatives = [
        re.escape(w) + (r"\w*" if i == len(words) - 1 and len(w) >= _MIN_PREFIX else "")
        for i, w in enumerate(words)
    ]
    pattern = re.compile(r"\b(?:" + "|".join(alternatives) + ")", re.IGNORECASE)
    first = pattern.search(text)
    start = 0 if first is None else max(0, min(first.start() - width // 3, len(text) - width))
    window = text[start : start + width]
    marked = pattern.sub(lambda m: MARK_START + m.group(0) + MARK_END, window)
    return ("…" if start > 0 else "") + marked + ("…" if start + width < len(text) else "")
