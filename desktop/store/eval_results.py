"""Eval results kept by what was evaluated, so asking a step again costs nothing.

A result is keyed by the sha256 of the step's weights (so a copied or renamed checkpoint is still
known, and one rewritten in place is not mistaken for the old one), the task, the sha256 of its
data file and the settings that change answers; it holds every example's answer, as the sweep
gave it. Hashing reads every byte of the weights, so a file's hash is itself kept by (path, size,
modification time) and computed once.

It is a cache: a damaged, locked or unwritable file gives one log line and the sweep simply
runs (nothing here raises into a sweep). So does a row whose answers are not what a sweep gives
(a field of another type, an index out of range: :mod:`desktop.store.result_rows`); its step is
asked again.

The engine's sweep (``engine/runs/sweep.py`` ``tasks_sweep``) asks a Keeper for a step's kept
answers before it opens the step; :class:`StoreKeeper` is that Keeper over this store, given a
:class:`TaskKey` per task (``choices_key``, ``answers_key``, ``bits_key``, ``samples_key``,
``core_key``)::

    keeper = StoreKeeper(shared_results(), {"mc": choices_key(questions)}, cancel)
    for r in tasks_sweep(points, [mc_task(questions)], cancel=cancel, keeper=keeper): ...
    keeper.read_back  # {(stage, step, task)} served from the store
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, suppress
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
from desktop.store.result_rows import checked_result

logger = logging.getLogger(__name__)
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

    def get(self, key: tuple[str, str, str, str]) -> list[dict[str, Any]] | None:
        row = self._query(
            "SELECT answers FROM results WHERE weights=? AND task=? AND data=? AND settings=?", key
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
    (None: nothing is kept): a step's answers to a task by the sha256 of its weights, computed
    once per step (and once per file, ever). ``read_back`` names the (stage, step, task) served
    from the store."""

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

    def _key(self, point: Point, task: str) -> tuple[str, str, str, str] | None:
        key, weights = self.keys.get(task), self.weights(point)
        return (weights, task, key.data, key.settings) if key is not None and weights else None

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
