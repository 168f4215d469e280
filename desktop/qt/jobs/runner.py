"""The one way the app runs work off the GUI thread, apart from a model's own QThread
(``qt/model/worker.py``): a :class:`Job` runs a callable on a Python thread of its own and hands
everything it reports back to the GUI thread.

    job = Job("hf-export", parent=self)               # one per kind of work, owned by a QObject
    job.start(work, done=on_result, failed=on_error)  # False while a run is going (single-instance)
    job.stop(wait=30.0)                               # cooperative: the work reads run.cancel

``work(run)`` runs on the job's thread. It reads ``run.cancel`` (a ``threading.Event``) between
its items and returns early once it is set; ``run.post(fn, *args)`` calls ``fn(*args)`` on the GUI
thread (progress, partial results), in the order posted. Its return value goes to ``done``; an
exception is logged with its traceback and goes to ``failed`` as one line (``error_text``). Work
that expects an error (a refused checkpoint) catches it and returns what to say instead. ``done``,
``failed`` and every posted call run on the GUI thread, and only while the job's owner exists: a
widget is never touched from the job's thread, nor after it is gone.

A ``latest_wins`` job never refuses: a new start stops the run under way and drops whatever it
would still deliver, so a lookup superseded by a newer request (a summary, a folder's timeline)
never shows a stale answer.

Why a Python thread and not a QThread or Qt's thread pool: the thread is never a daemon and Python
knows it. A daemon thread (or a Qt pool thread, which Python does not join) still in torch code
when the interpreter exits aborts the process ("terminate called without an active exception",
measured with a matmul loop: five exits of five). Quitting stops every run and waits for it
(``stop_all``, hooked to ``aboutToQuit``); one that outlives the wait is joined by the interpreter
before it exits, so it ends cleanly (and cleans up after itself) rather than taking the process
down. Stop is only ever asked, never forced: an exception raised into a thread can land between a
lock's acquire and its release (docs/ARCHITECTURE.md, CallStop).

Deliveries travel through one relay QObject that lives as long as the process on the GUI thread,
so the job's thread never signals an object that may have been deleted meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import shiboken6
from PySide6.QtCore import QCoreApplication, QObject, Signal, Slot

from desktop.engine.text_lines import error_text

logger = logging.getLogger(__name__)

R = TypeVar("R")

# How long quitting waits, in all, for the runs still going (each stops at its next item).
QUIT_WAIT_S = 30.0


class Run:
    """One run of a job's work, as the work sees it: its Stop and its way back to the GUI thread."""

    def __init__(self, job: Job, main: Callable[[Run], None]) -> None:
        self.job = job
        self.cancel = threading.Event()
        # Set once the work has returned or raised, before its outcome is posted: the thread lives
        # a moment longer, and a start asked by the outcome's own callback must not be refused.
        self.ended = threading.Event()
        self.thread = threading.Thread(target=main, args=(self,), name=job.name, daemon=False)

    def stopped(self) -> bool:
        return self.cancel.is_set()

    def post(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the GUI thread, after everything this run posted before."""
        _relay().posted.emit(self, fn, args)


class _Relay(QObject):
    """Carries calls from the jobs' threads to the GUI thread (a queued signal to itself)."""

    posted = Signal(object, object, object)  # the Run, the function, its arguments

    def __init__(self) -> None:
        super().__init__()
        self.posted.connect(self._deliver)

    @Slot(object, object, object)
    def _deliver(self, run: Run, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        if shiboken6.isValid(run.job) and run.job._delivers(run):
            fn(*args)


_lock = threading.Lock()
_the_relay: _Relay | None = None
_live: set[Run] = set()  # runs whose thread has started and not yet ended


def _relay() -> _Relay:
    """The relay, made on first use by the GUI thread (a Job is made there), and ``stop_all``
    hooked to the application's quit."""
    global _the_relay
    with _lock:
        if _the_relay is None:
            _the_relay = _Relay()
            app = QCoreApplication.instance()
            if app is not None:
                _the_relay.moveToThread(app.thread())
                app.aboutToQuit.connect(_stop_all_at_quit)
        return _the_relay


def _stop_all_at_quit() -> None:
    stop_all(QUIT_WAIT_S)


def stop_all(wait: float) -> None:
    """Ask every run still going to stop, and wait up to ``wait`` seconds in all for them."""
    with _lock:
        runs = list(_live)
    for run in runs:
        run.cancel.set()
    deadline = time.monotonic() + wait
    for run in runs:
        run.thread.join(max(0.0, deadline - time.monotonic()))
    if left := [r.thread.name for r in runs if r.thread.is_alive()]:
        logger.warning("still running after %.0f s, left to end on their own: %s", wait, ", ".join(left))


class Job(QObject):
    """One kind of work run off the GUI thread, one run at a time (unless ``latest_wins``).

    ``name`` names its thread (and its log lines); ``parent`` owns it: once the parent is deleted
    nothing more is delivered.
    """

    def __init__(self, name: str, parent: QObject | None = None, *, latest_wins: bool = False) -> None:
        super().__init__(parent)
        _relay()  # made here, on the GUI thread
        self.name = name
        self.latest_wins = latest_wins
        self._run: Run | None = None
        self._closed = False

    def running(self) -> bool:
        """Whether the latest run's work is still going."""
        return self._run is not None and not self._run.ended.is_set()

    def start(
        self,
        work: Callable[[Run], R],
        done: Callable[[R], object] | None = None,
        failed: Callable[[str], object] | None = None,
    ) -> bool:
        """Run ``work(run)`` on a new thread; ``done(result)`` or ``failed(line)`` follow on the
        GUI thread. False, doing nothing, while a run is going, unless the job is ``latest_wins``:
        then that run is stopped and superseded."""
        if self._closed:
            return False
        if self.running():
            if not self.latest_wins:
                return False
            self.stop()
        run = Run(self, lambda run: self._main(run, work, done, failed))
        self._run = run
        with _lock:
            _live.add(run)
        run.thread.start()
        return True

    def stop(self, wait: float = 0.0) -> None:
        """Ask the latest run to end; with ``wait``, wait up to that many seconds for it. What it
        still reports (a sweep's end) is delivered."""
        run = self._run
        if run is None:
            return
        run.cancel.set()
        if wait and run.thread.is_alive() and run.thread is not threading.current_thread():
            run.thread.join(wait)

    def close(self, wait: float = 0.0) -> None:
        """Stop, and deliver nothing more (the owner is going away); the job starts no more runs."""
        self._closed = True
        self.stop(wait)

    def _delivers(self, run: Run) -> bool:
        """On the GUI thread: whether what ``run`` posted is still wanted."""
        return not self._closed and (run is self._run or not self.latest_wins)

    def _main(
        self,
        run: Run,
        work: Callable[[Run], R],
        done: Callable[[R], object] | None,
        failed: Callable[[str], object] | None,
    ) -> None:
        """On the job's thread: the work, then its outcome posted to the GUI thread."""
        try:
            result = work(run)
        except Exception as exc:
            run.ended.set()
            logger.exception("%s failed", self.name)
            if failed is not None:
                run.post(failed, error_text(exc, named=True))
        else:
            run.ended.set()
            if done is not None:
                run.post(done, result)
        finally:
            with _lock:
                _live.discard(run)
