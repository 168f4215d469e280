"""Eval results kept by what was evaluated, so asking a step again costs nothing.

A result is keyed by the sha256 of the step's weights (so a copied or renamed checkpoint is still
known, and one rewritten in place is not mistaken for the old one), the task, the sha256 of its
data file and the settings that change answers; it holds every example's answer, as the sweep
gave it. Hashing reads every byte of the weights, so a file's hash is itself kept by (path, size,
modification time) and computed once.

It is a cache: a damaged, locked or unwritable file gives one log line and the sweep simply
runs (nothing here raises into a sweep).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from desktop.config import paths
from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import FileRefused
from desktop.engine.files.content_hash import sha256_of_files
from desktop.engine.files.safe_json import JsonRefused, loads_bounded
from desktop.engine.runs.bits_per_byte import MAX_TOKENS, BitsPerByte, bpb_sweep
from desktop.engine.runs.checked_answers import REPLY_TOKENS, Checked, Problem, answer_sweep
from desktop.engine.runs.multiple_choice import Answer, Question, mc_sweep
from desktop.engine.runs.report import weights_files
from desktop.engine.runs.timeline import Point

logger = logging.getLogger(__name__)
T = TypeVar("T")
SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    weights TEXT NOT NULL, task TEXT NOT NULL, data TEXT NOT NULL, settings TEXT NOT NULL,
    answers TEXT NOT NULL, saved REAL NOT NULL,
    PRIMARY KEY (weights, task, data, settings));
CREATE TABLE IF NOT EXISTS file_hashes (
    path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, sha256 TEXT NOT NULL);
"""
MAX_ANSWERS_BYTES = 64 << 20  # one stored result read back at most


class EvalResults:
    """One per process; safe to share between threads (one connection behind a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.executescript(SCHEMA)
            self._conn = conn
        except sqlite3.Error as exc:
            logger.warning("eval results are not kept: %s: %s", self.path, exc)

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
        if row is not None and (row[0], row[1]) == shape:
            return str(row[2])
        try:
            digest = sha256_of_files(files, cancel)
        except FileRefused as exc:
            logger.info("not hashed: %s", exc)
            return None
        if digest is not None:
            self._write("INSERT OR REPLACE INTO file_hashes VALUES (?, ?, ?, ?)", (key, *shape, digest))
        return digest

    def get(self, key: tuple[str, str, str, str]) -> list[dict[str, Any]] | None:
        row = self._query(
            "SELECT answers FROM results WHERE weights=? AND task=? AND data=? AND settings=?", key
        )
        if row is None or len(row[0]) > MAX_ANSWERS_BYTES:
            return None
        try:
            answers = loads_bounded(row[0], 8)
        except JsonRefused:
            return None
        return answers if isinstance(answers, list) and all(isinstance(a, dict) for a in answers) else None

    def put(self, key: tuple[str, str, str, str], answers: list[dict[str, Any]]) -> None:
        self._write(
            "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?)",
            (*key, json.dumps(answers), time.time()),
        )

    def _query(self, sql: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with self._lock:
            if self._conn is None:
                return None
            try:
                with closing(self._conn.execute(sql, args)) as cur:
                    return cur.fetchone()
            except sqlite3.Error as exc:
                logger.warning("eval results not read: %s: %s", self.path, exc)
                return None

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.execute(sql, args)
            except sqlite3.Error as exc:
                logger.warning("eval results not kept: %s: %s", self.path, exc)


def kept_sweep(
    store: EvalResults | None,
    points: Sequence[Point],
    task: str,
    data_hash: str,
    settings: str,
    run: Callable[[list[Point]], Iterator[T]],
    to_dict: Callable[[T], dict[str, Any]],
    from_dict: Callable[[dict[str, Any]], T],
    cancel: threading.Event | None = None,
) -> Iterator[tuple[T, bool]]:
    """``run`` 's results step by step, each step's taken from ``store`` when it was kept
    (``(result, True)``) and kept after it ran to its end (``(result, False)``)."""
    for point in points:
        if cancel is not None and cancel.is_set():
            return
        weights = None
        if store is not None:
            try:
                weights = store.weights_hash(weights_files(point), cancel)
            except (OSError, ValueError, NanoscopeError) as exc:
                logger.info("step %s not hashed: %s", point.step, exc)
        key = (weights or "", task, data_hash, settings)
        kept = store.get(key) if store is not None and weights else None
        if kept is not None:
            try:
                results = [from_dict(d) for d in kept]
            except (TypeError, KeyError, ValueError):
                results = []
            if results:
                yield from ((r, True) for r in results)
                continue
        fresh: list[T] = []
        for result in run([point]):
            fresh.append(result)
            yield result, False
        if store is not None and weights and fresh and not (cancel is not None and cancel.is_set()):
            store.put(key, [to_dict(r) for r in fresh])


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


# ----- the sweeps, each with its key ---------------------------------------------------------


def kept_choices(
    store: EvalResults | None,
    points: Sequence[Point],
    questions: Sequence[Question],
    options: LoadOptions,
    cancel: threading.Event,
) -> Iterator[tuple[Answer, bool]]:
    asked = data_hash([(q.question, q.choices, q.answer) for q in questions])
    return kept_sweep(
        store,
        points,
        "mc",
        asked,
        "categorical",
        lambda some: mc_sweep(some, questions, options=options, cancel=cancel),
        asdict,
        lambda d: Answer(**{**d, "logprobs": tuple(d["logprobs"])}),
        cancel,
    )


def kept_answers(
    store: EvalResults | None,
    points: Sequence[Point],
    problems: Sequence[Problem],
    options: LoadOptions,
    cancel: threading.Event,
) -> Iterator[tuple[Checked, bool]]:
    asked = data_hash([(p.question, p.answer) for p in problems])
    return kept_sweep(
        store,
        points,
        "answers",
        asked,
        f"greedy {REPLY_TOKENS}",
        lambda some: answer_sweep(some, problems, options=options, cancel=cancel),
        asdict,
        lambda d: Checked(**d),
        cancel,
    )


def kept_bits(
    store: EvalResults | None,
    points: Sequence[Point],
    text: str,
    cut: bool,
    options: LoadOptions,
    cancel: threading.Event,
) -> Iterator[tuple[BitsPerByte, bool]]:
    return kept_sweep(
        store,
        points,
        "bpb",
        data_hash(text),
        f"max {MAX_TOKENS} tokens",
        lambda some: bpb_sweep(some, text, cut, options=options, cancel=cancel),
        asdict,
        lambda d: BitsPerByte(**d),
        cancel,
    )
