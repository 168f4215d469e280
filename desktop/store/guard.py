"""A deadline and a row budget for every query of the app's SQLite stores, and their schema
checked before anything is asked of them (Qt-free).

A store is a file in the app's home that any program running as the user can rewrite, and SQLite
runs whatever a file's schema holds: a view over an endless recursive query stands where a table
should be and the first SELECT never returns; a trigger runs its body inside the app's own INSERT.
So, for each store:

* its schema is compared with what the app creates (:func:`schema_of`, :func:`made_by`): a view,
  a trigger or a table the app did not make is a store not to be trusted;
* every statement runs under a :class:`Deadline` (:func:`connect`): SQLite's progress handler
  aborts it after ``steps`` virtual-machine instructions or ``seconds``, whichever comes first
  (the count is what a test can assert; the clock covers a slow disk);
* rows are read one at a time and at most a stated number (:func:`rows`), and on Python 3.11+
  one value is at most ``max_value`` bytes (SQLITE_LIMIT_LENGTH), so a row cannot be a gigabyte.

A cache whose file fails any of these is renamed aside for the user to look at
(:func:`set_aside`) and made again; the history, which is the user's own data, is refused.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

CHECK_EVERY = 1_000  # instructions between two looks at the budget: ~0.1 ms, unnoticeable
MAX_SCHEMA_ROWS = 1_000  # objects in a store's schema; the app's have under 30
SIDECARS = ("-journal", "-wal", "-shm")  # SQLite's files beside a database, moved with it
LIMIT_LENGTH = 0  # SQLITE_LIMIT_LENGTH in sqlite3.h (Python 3.10's sqlite3 does not name it)

Schema = frozenset[tuple[str, str, str, str | None]]  # (type, name, table, sql)


class Untrusted(Exception):
    """A store that failed its schema, its deadline or its row budget; ``str()`` says how."""


class Deadline:
    """The budget of the statement in hand: :meth:`arm` as it starts; past ``steps`` instructions
    or ``seconds`` since then it is aborted (SQLite raises ``OperationalError: interrupted``) and
    :attr:`fired` says it was this budget."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        steps: int,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.steps, self.seconds, self._clock = steps, seconds, clock
        self.used = 0  # instructions run since arm(), counted CHECK_EVERY at a time
        self.fired = False
        self._ends = 0.0
        self.arm()
        conn.set_progress_handler(self._check, CHECK_EVERY)

    def arm(self) -> None:
        self.used, self.fired = 0, False
        self._ends = self._clock() + self.seconds

    def _check(self) -> int:
        self.used += CHECK_EVERY
        if self.used > self.steps or self._clock() > self._ends:
            self.fired = True
            return 1  # nonzero: SQLite stops the statement
        return 0


class GuardedConnection(sqlite3.Connection):
    """A connection each of whose statements runs under its :attr:`deadline`, armed afresh by
    every ``execute`` (the stores run every statement through it), so no call site can forget."""

    deadline: Deadline

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.deadline.arm()
        return super().execute(sql, parameters)


def connect(
    path: Path | str, steps: int, seconds: float, max_value: int, **options: Any
) -> GuardedConnection:
    """A store's connection (``options`` as for ``sqlite3.connect``), its statements under a
    :class:`Deadline` of ``steps`` and ``seconds``, each string or blob at most ``max_value``
    bytes (SQLITE_LIMIT_LENGTH; Python 3.10 has no ``setlimit`` and keeps SQLite's gigabyte)."""
    conn = sqlite3.connect(path, factory=GuardedConnection, **options)
    conn.deadline = Deadline(conn, steps, seconds)
    setlimit = getattr(conn, "setlimit", None)
    if setlimit is not None:
        setlimit(LIMIT_LENGTH, max_value)
    return conn


def rows(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...], budget: int) -> Iterator[tuple[Any, ...]]:
    """The rows of ``sql``, read one at a time; :class:`Untrusted` past ``budget`` of them."""
    with closing(conn.execute(sql, args)) as cursor:
        for count, row in enumerate(cursor, 1):
            if count > budget:
                raise Untrusted(f"more than {budget:,} rows where the app keeps fewer")
            yield row


def schema_of(conn: sqlite3.Connection) -> Schema:
    """Every object of the database's schema (its tables, indexes, views and triggers)."""
    found = rows(conn, "SELECT type, name, tbl_name, sql FROM sqlite_master", (), MAX_SCHEMA_ROWS)
    return frozenset((str(t), str(n), str(tb), s if s is None else str(s)) for t, n, tb, s in found)


def made_by(build: Callable[[sqlite3.Connection], None]) -> Schema:
    """The schema ``build`` makes in an empty database: what a store's file must hold. SQLite keeps
    each object's statement as it was written (without IF NOT EXISTS), so the same code gives
    the same text."""
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        build(conn)
        return schema_of(conn)


def strangers(found: Schema, ours: Schema) -> list[str]:
    """The objects of ``found`` that the app did not make, as "view results", "trigger x" …"""
    return sorted(f"{kind} {name}" for kind, name, _, _ in found - ours)


def set_aside(path: Path) -> Path:
    """Rename a store that is not to be trusted (and its journal) out of the way, to
    ``<name>.unusable-<n>`` beside it: kept for the user, never opened again. Raises OSError."""
    for n in itertools.count(1):
        aside = path.with_name(f"{path.name}.unusable-{n}")
        if not aside.exists() and not any(aside.with_name(aside.name + s).exists() for s in SIDECARS):
            break
    for suffix in SIDECARS:  # first: a journal left under the old name would be replayed into the new store
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(aside.with_name(aside.name + suffix))
    path.rename(aside)
    return aside
