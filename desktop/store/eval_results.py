"""Eval results kept by what was evaluated, so asking a step again costs nothing.

A result is keyed by the step it answers (its folder and step number), the sha256 of its weights
(so a step rewritten in place is not mistaken for the old one), the task, the sha256 of its data
file and the settings that change answers; it holds every example's answer, as the sweep gave
it. The step is part of the key because a result is labelled with its step: two steps with the
same weights (a run saved twice without training between) each keep their own answers. Hashing
reads every byte of the weights, so a file's hash is itself kept by (path, size, modification
time) and computed once.

It is a cache: a locked or unwritable file gives one log line and the sweep simply runs (nothing
here raises into a sweep). So does a row whose answers are not what a sweep gives (a field of
another type, an index out of range: :mod:`desktop.store.result_rows`); its step is asked again.
A file that is not what this module makes (a view, a trigger or a table it did not create; a
query past its deadline or a row past its budget, see :mod:`desktop.store.guard`; a damaged
database) is renamed aside with one log line and a fresh store is made. ``PRAGMA user_version``
is the layout: 0 is the first one, keyed by the weights' hash alone, whose results are dropped
(they name no step) and whose file hashes are kept.

The engine's sweep (``engine/runs/sweep.py`` ``tasks_sweep``) asks a Keeper for a step's kept
answers before it opens the step; :class:`StoreKeeper` is that Keeper over this store, given a
:class:`TaskKey` per task (``choices_key``, ``answers_key``, ``bits_key``, ``samples_key``,
``core_key``)::

    keeper = StoreKeeper(shared_results(), {"mc": choices_key(questions)}, cancel)
    for r in tasks_sweep(points, [mc_task(questions)], cancel=cancel, keeper=keeper): ...
    keeper.read_back  # {(stage, step, task)} served from the store
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from desktop.config import paths
from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import FileRefused
from desktop.engine.files.content_hash import sha256_of_files
from desktop.engine.files.safe_json import JsonRefused, loads_bounded
from desktop.engine.runs.bits_per_byte import MAX_TOKENS, BitsPerByte, bpb_task
from desktop.engine.runs.checked_answers import REPLY_TOKENS, Checked, Problem, answers_task
from desktop.engine.runs.core_bundle import CoreAnswer, CoreExample, CoreTask
from desktop.engine.runs.evals import SAMPLE_TOKENS, Sample
from desktop.engine.runs.multiple_choice import Answer, Question, mc_task
from desktop.engine.runs.report import weights_files
from desktop.engine.runs.sweep import EvalTask, tasks_sweep
from desktop.engine.runs.timeline import Point
from desktop.store.guard import Deadline, Untrusted, made_by, rows, schema_of, set_aside, strangers
from desktop.store.guard import connect as guarded_connect
from desktop.store.result_rows import checked_result
from desktop.store.schema import immediate

logger = logging.getLogger(__name__)
SCHEMA_VERSION = 1  # PRAGMA user_version of the layout below
RESULTS = """
CREATE TABLE IF NOT EXISTS results (
    path TEXT NOT NULL, step INTEGER NOT NULL, weights TEXT NOT NULL, task TEXT NOT NULL,
    data TEXT NOT NULL, settings TEXT NOT NULL, answers TEXT NOT NULL, saved REAL NOT NULL,
    PRIMARY KEY (path, step, weights, task, data, settings))"""
# Both statements of layout 0 as they were written, to tell its file from a stranger's.
FIRST_RESULTS = """
CREATE TABLE IF NOT EXISTS results (
    weights TEXT NOT NULL, task TEXT NOT NULL, data TEXT NOT NULL, settings TEXT NOT NULL,
    answers TEXT NOT NULL, saved REAL NOT NULL,
    PRIMARY KEY (weights, task, data, settings))"""
FILE_HASHES = """
CREATE TABLE IF NOT EXISTS file_hashes (
    path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, sha256 TEXT NOT NULL)"""
Key = tuple[str, int, str, str, str, str]  # (folder, step, weights, task, data, settings)
MAX_ANSWERS_BYTES = 64 << 20  # one stored result read back at most
# A statement looks up or writes one row by its key: about a hundred instructions. A million is
# far past any honest one and a fraction of a second; the clock is for a slow disk.
MAX_STEPS = 1_000_000
DEADLINE_S = 10.0


@functools.cache
def _layout(*statements: str) -> frozenset[tuple[str, str, str, str | None]]:
    """The schema ``statements`` make (see :func:`desktop.store.guard.made_by`)."""

    def build(conn: sqlite3.Connection) -> None:
        for statement in statements:
            conn.execute(statement)

    return made_by(build)


class EvalResults:
    """One per process; safe to share between threads (one connection behind a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._deadline: Deadline | None = None  # the last connection's, kept past its close
        self._conn = self._open()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def weights_hash(self, files: Sequence[Path], cancel: threading.Event | None = None) -> str | None:
        """The sha256 of ``files`` together, from the kept hashes while no file changed."""
        try:
            stats = [f.stat() for f in files]
        except OSError:
            return None
        key = json.dumps([str(f) for f in files])
        shape = (sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats))
        row = self._query("SELECT size, mtime_ns, sha256 FROM file_hashes WHERE path = ?", (key,))
        if row is not None and (row[0], row[1]) == shape and _is_sha256(row[2]):
            return str(row[2])
        try:
            digest = sha256_of_files(files, cancel)
        except FileRefused as exc:
            logger.info("not hashed: %s", exc)
            return None
        if digest is not None:
            self._write("INSERT OR REPLACE INTO file_hashes VALUES (?, ?, ?, ?)", (key, *shape, digest))
        return digest

    def get(self, key: Key) -> list[dict[str, Any]] | None:
        row = self._query(
            "SELECT answers FROM results WHERE path=? AND step=? AND weights=? AND task=? AND data=? "
            "AND settings=?",
            key,
        )
        if row is None:
            return None
        answers: Any = None
        if isinstance(row[0], str) and len(row[0]) <= MAX_ANSWERS_BYTES:
            with suppress(JsonRefused):  # said below, with every other row that is no list of answers
                answers = loads_bounded(row[0], 8)
        if not isinstance(answers, list) or not all(isinstance(a, dict) for a in answers):
            logger.warning("eval results: a kept row of %s is not a list of answers; asked again", key[1])
            return None
        return answers

    def put(self, key: Key, answers: list[dict[str, Any]]) -> None:
        text = json.dumps(answers)
        if len(text) > MAX_ANSWERS_BYTES:  # past the row budget, a write would fail as a hostile read does
            logger.info("eval results not kept: %s answers of %d bytes", key[3], len(text))
            return
        row = (*key, text, time.time())
        self._write("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)

    # ----- the file: opened, checked, migrated; set aside when it cannot be trusted -------------

    def _open(self) -> sqlite3.Connection | None:
        """The store's connection, the file checked and brought to SCHEMA_VERSION; a file that
        cannot be trusted is set aside and a fresh one made; None: nothing is kept."""
        try:
            return self._connect()
        except (_Newer, Untrusted, sqlite3.Error) as exc:
            if not self._untrusted(exc) or not self._set_aside(exc):
                logger.warning("eval results are not kept: %s: %s", self.path, exc)
                return None
        try:
            return self._connect()  # the fresh file
        except (_Newer, Untrusted, sqlite3.Error) as exc:
            logger.warning("eval results are not kept: %s: %s", self.path, exc)
            return None

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = guarded_connect(
            self.path, MAX_STEPS, DEADLINE_S, MAX_ANSWERS_BYTES, isolation_level=None, check_same_thread=False
        )
        self._deadline = conn.deadline
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            with immediate(conn):  # the lock first: two processes opening an old store migrate it once
                _migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _untrusted(self, exc: Exception) -> bool:
        """Whether ``exc`` says the file is not to be trusted (rather than locked or unwritable):
        a stranger's schema, a query past its deadline, a value past its budget, a damaged file."""
        fired = self._deadline is not None and self._deadline.fired
        return isinstance(exc, Untrusted) or fired or type(exc) in (sqlite3.DatabaseError, sqlite3.DataError)

    def _set_aside(self, exc: Exception) -> bool:
        """The file renamed aside with one log line; False when it could not be."""
        fired = self._deadline is not None and self._deadline.fired
        reason = "a query ran past its deadline" if fired else exc
        try:
            aside = set_aside(self.path)
        except OSError as err:
            logger.warning("eval results are not kept: %s: %s; not set aside (%s)", self.path, reason, err)
            return False
        logger.warning("eval results: %s cannot be trusted (%s); set aside as %s, a new store is made",
                       self.path, reason, aside.name)  # fmt: skip
        return True

    def _failed(self, exc: Exception, what: str) -> None:
        """A call that failed: an untrusted store is set aside and made again (under the lock)."""
        if not self._untrusted(exc):
            logger.warning("eval results not %s: %s: %s", what, self.path, exc)
            return
        if self._conn is not None:
            self._conn.close()
        self._conn = self._open() if self._set_aside(exc) else None

    def _query(self, sql: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with self._lock:
            if self._conn is None:
                return None
            try:
                return next(rows(self._conn, sql, args, 1), None)  # looked up by key: one row
            except (Untrusted, sqlite3.Error) as exc:
                self._failed(exc, "read")
                return None

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.execute(sql, args)
            except sqlite3.Error as exc:
                self._failed(exc, "kept")


class _Newer(Exception):
    """A store written by a newer app: left as it is, and not used."""


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring the file to SCHEMA_VERSION, or say why it is not a store this app made."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise _Newer(f"written by a newer Nanoscope (layout {version}, this one knows {SCHEMA_VERSION})")
    found = schema_of(conn)
    if version == SCHEMA_VERSION and found == _layout(RESULTS, FILE_HASHES):
        return
    if version == 0 and found in (frozenset(), _layout(FIRST_RESULTS, FILE_HASHES)):
        conn.execute("DROP TABLE IF EXISTS results")  # keyed by weights alone: no step to name
        conn.execute(RESULTS)
        conn.execute(FILE_HASHES)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    odd = strangers(found, _layout(RESULTS, FILE_HASHES) | _layout(FIRST_RESULTS, FILE_HASHES))
    raise Untrusted(f"holds {', '.join(odd[:3])}" if odd else f"layout {version} with tables changed")


@dataclass(frozen=True)
class TaskKey:
    """How one task's answers are kept: the sha256 of what it asks, the settings that change its
    answers, and its results to and from JSON."""

    data: str
    settings: str
    to_dict: Callable[[Any], dict[str, Any]]
    from_dict: Callable[[dict[str, Any]], Any]


class StoreKeeper:
    """The engine's :class:`~desktop.engine.runs.sweep.Keeper` over an :class:`EvalResults`
    (None: nothing is kept): a step's answers to a task by the step (its folder and number) and
    the sha256 of its weights, computed once per step (and once per file, ever). ``read_back``
    names the (stage, step, task) served from the store."""

    def __init__(
        self, store: EvalResults | None, keys: Mapping[str, TaskKey], cancel: threading.Event | None = None
    ) -> None:
        self.store, self.keys, self.cancel = store, dict(keys), cancel
        self.read_back: set[tuple[str, int, str]] = set()
        self._weights: dict[tuple[str, str, int], str | None] = {}

    def weights(self, point: Point) -> str | None:
        """The sha256 of the step's weights (None: not hashed, so nothing is kept for it)."""
        at = (str(point.path), point.stage, point.step)
        if at not in self._weights:
            digest = None
            if self.store is not None:
                try:
                    digest = self.store.weights_hash(weights_files(point), self.cancel)
                except (OSError, ValueError, NanoscopeError) as exc:
                    logger.info("step %s not hashed: %s", point.step, exc)
            self._weights[at] = digest
        return self._weights[at]

    def _key(self, point: Point, task: str) -> Key | None:
        key, weights = self.keys.get(task), self.weights(point)
        if key is None or not weights:
            return None
        # abspath, not resolve(): the same folder named from elsewhere, and no file system call
        return (os.path.abspath(point.path), point.step, weights, task, key.data, key.settings)

    def kept(self, point: Point, task: str) -> list[Any] | None:
        key = self._key(point, task)
        kept = self.store.get(key) if self.store is not None and key is not None else None
        if not kept:
            return None
        try:
            results = [checked_result(self.keys[task].from_dict(d)) for d in kept]
        except (TypeError, KeyError, ValueError, OverflowError) as exc:  # RowRefused is a ValueError
            logger.warning(
                "eval results: the kept row of %s at %s step %s is refused (%s); asked again",
                task, point.stage, point.step, str(exc)[:200],
            )  # fmt: skip
            return None
        if any((r.stage, r.step) != (point.stage, point.step) for r in results):
            return None  # answers labelled with another step are never shown as this one's
        self.read_back.add((point.stage, point.step, task))
        return results

    def keep(self, point: Point, task: str, results: list[Any]) -> None:
        key = self._key(point, task)
        if self.store is not None and key is not None and results:
            self.store.put(key, [self.keys[task].to_dict(r) for r in results])


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


_shared: EvalResults | None = None
_shared_lock = threading.Lock()


def shared_results() -> EvalResults:
    """The process's store, at the app's cache path (opened on first use, and again when the
    app's home changes)."""
    global _shared
    path = paths.eval_results_path()
    with _shared_lock:
        if _shared is None or _shared.path != path:
            if _shared is not None:
                _shared.close()
            _shared = EvalResults(path)
        return _shared


def data_hash(value: object) -> str:
    """The sha256 of what an eval asked (its questions or text), as JSON."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()


# ----- each task's key, and one task kept ---------------------------------------------------


def choices_key(questions: Sequence[Question]) -> TaskKey:
    asked = data_hash([(q.question, q.choices, q.answer) for q in questions])
    return TaskKey(asked, "categorical", asdict, lambda d: Answer(**{**d, "logprobs": tuple(d["logprobs"])}))


def answers_key(problems: Sequence[Problem]) -> TaskKey:
    asked = data_hash([(p.question, p.answer) for p in problems])
    return TaskKey(asked, f"greedy {REPLY_TOKENS}", asdict, lambda d: Checked(**d))


def bits_key(text: str) -> TaskKey:
    return TaskKey(data_hash(text), f"max {MAX_TOKENS} tokens", asdict, lambda d: BitsPerByte(**d))


def samples_key(prompts: Sequence[str], max_tokens: int = SAMPLE_TOKENS) -> TaskKey:
    return TaskKey(
        data_hash(list(prompts)),
        f"greedy {max_tokens}",
        asdict,
        lambda d: Sample(**{**d, "ids": tuple(d["ids"])}),
    )


def core_key(task: CoreTask, examples: Sequence[CoreExample], lite: int | None) -> TaskKey:
    """A CORE task's answers, by what it asks (its kind, shots, delimiter and examples in order)."""
    asked = data_hash([task.kind, task.fewshot, task.delimiter, [dict(e.item) for e in examples]])
    settings = f"lite {lite}" if lite is not None else "all"
    return TaskKey(asked, settings, CoreAnswer.to_dict, CoreAnswer.from_dict)


def _kept_one(
    store: EvalResults | None,
    points: Sequence[Point],
    task: EvalTask,
    key: TaskKey,
    options: LoadOptions,
    cancel: threading.Event,
) -> Iterator[tuple[Any, bool]]:
    keeper = StoreKeeper(store, {task.name: key}, cancel)
    for r in tasks_sweep(points, [task], options=options, cancel=cancel, keeper=keeper):
        yield r.result, r.kept


def kept_choices(
    store: EvalResults | None,
    points: Sequence[Point],
    questions: Sequence[Question],
    options: LoadOptions,
    cancel: threading.Event,
) -> Iterator[tuple[Answer, bool]]:
    """Multiple choice at each step, (answer, read back from the store)."""
    return _kept_one(store, points, mc_task(questions), choices_key(questions), options, cancel)


def kept_answers(
    store: EvalResults | None,
    points: Sequence[Point],
    problems: Sequence[Problem],
    options: LoadOptions,
    cancel: threading.Event,
) -> Iterator[tuple[Checked, bool]]:
    """Checked answers at each step, (answer, read back from the store)."""
    return _kept_one(store, points, answers_task(problems, cancel), answers_key(problems), options, cancel)


def kept_bits(
    store: EvalResults | None,
    points: Sequence[Point],
    text: str,
    cut: bool,
    options: LoadOptions,
    cancel: threading.Event,
) -> Iterator[tuple[BitsPerByte, bool]]:
    """Bits per byte at each step, (result, read back from the store)."""
    return _kept_one(store, points, bpb_task(text, cut, cancel), bits_key(text), options, cancel)
