"""The job runner: a result, an error, a Stop, progress in order, latest-wins and quitting, each
as the GUI thread sees it. The work and the test meet through events, never sleeps."""

from __future__ import annotations

import logging
import threading

import pytest
import shiboken6
from PySide6.QtCore import QObject

from desktop.qt.jobs.runner import Job, Run, stop_all

pytestmark = pytest.mark.gui
WAIT = 10000  # ms
WAIT_S = WAIT / 1000


def flush(qtbot) -> None:
    """Wait until everything posted so far has been delivered: the relay delivers in order, so a
    fresh run's result arriving means all earlier posts have been handled."""
    seen: list[object] = []
    Job("flush").start(lambda _run: "flushed", done=seen.append)
    qtbot.waitUntil(lambda: seen == ["flushed"], timeout=WAIT)


def test_the_result_arrives_on_the_gui_thread(qtbot):
    job = Job("answer")
    got: list[tuple[object, threading.Thread]] = []
    worked_on: list[threading.Thread] = []

    def work(_run: Run) -> int:
        worked_on.append(threading.current_thread())
        return 6 * 7

    assert job.start(work, done=lambda r: got.append((r, threading.current_thread())))
    qtbot.waitUntil(lambda: bool(got), timeout=WAIT)
    assert got == [(42, threading.main_thread())]
    assert worked_on[0] is not threading.main_thread() and not worked_on[0].daemon
    assert worked_on[0].name == "answer"


def test_an_error_arrives_as_one_logged_line_and_the_job_runs_again(qtbot, caplog):
    job = Job("broken")
    failures: list[str] = []

    def work(_run: Run) -> None:
        raise ValueError("the input is bad\nand here is \x1b[2Jmore detail")

    with caplog.at_level(logging.ERROR, logger="desktop.qt.jobs.runner"):
        job.start(work, done=lambda _r: failures.append("done?"), failed=failures.append)
        qtbot.waitUntil(lambda: bool(failures), timeout=WAIT)
    assert failures == ["ValueError: the input is bad and here is \\x1b[2Jmore detail"]  # one clean line
    (record,) = [r for r in caplog.records if r.name == "desktop.qt.jobs.runner"]
    assert "broken failed" in record.getMessage() and record.exc_info is not None
    assert record.exc_info[0] is ValueError  # the traceback is in the log, not lost
    got: list[object] = []
    qtbot.waitUntil(lambda: not job.running(), timeout=WAIT)
    assert job.start(lambda _run: "again", done=got.append)
    qtbot.waitUntil(lambda: got == ["again"], timeout=WAIT)


def test_stop_ends_a_run_mid_job_and_a_second_start_is_refused_meanwhile(qtbot):
    job = Job("long")
    started = threading.Event()
    got: list[object] = []

    def work(run: Run) -> str:
        started.set()
        run.cancel.wait(60)  # longer than the test: only Stop ends it
        return "stopped" if run.stopped() else "ran out"

    assert job.start(work, done=got.append)
    assert started.wait(WAIT_S) and job.running()
    assert not job.start(lambda _run: "second", done=got.append)  # one at a time
    job.stop(wait=WAIT_S)
    assert not job.running()
    qtbot.waitUntil(lambda: bool(got), timeout=WAIT)
    assert got == ["stopped"]  # what a stopped run says still arrives


def test_progress_arrives_in_order_and_before_the_result(qtbot):
    job = Job("steps")
    seen: list[tuple[str, object, bool]] = []

    def note(kind: str, value: object) -> None:
        seen.append((kind, value, threading.current_thread() is threading.main_thread()))

    def work(run: Run) -> int:
        for i in range(300):
            run.post(note, "progress", i)
        return 300

    job.start(work, done=lambda total: note("done", total))
    qtbot.waitUntil(lambda: len(seen) == 301, timeout=WAIT)
    assert seen == [("progress", i, True) for i in range(300)] + [("done", 300, True)]


def test_a_superseded_lookup_delivers_nothing_stale(qtbot):
    job = Job("lookup", latest_wins=True)
    release = threading.Event()
    runs: list[Run] = []
    got: list[str] = []

    def old(run: Run) -> str:
        runs.append(run)
        release.wait(WAIT_S)
        run.post(got.append, "old progress")
        return "old"

    assert job.start(old, done=got.append)
    qtbot.waitUntil(lambda: bool(runs), timeout=WAIT)
    assert job.start(lambda _run: "new", done=got.append)  # a newer request never waits
    qtbot.waitUntil(lambda: got == ["new"], timeout=WAIT)
    assert runs[0].stopped()  # the old run was asked to stop
    release.set()
    runs[0].thread.join(WAIT_S)
    flush(qtbot)
    assert got == ["new"]


def test_quitting_stops_every_run_and_waits_for_it(qtbot):
    jobs = [Job(f"quit-{i}") for i in range(3)]
    started = [threading.Event() for _ in jobs]
    runs: list[Run] = []

    def work(run: Run, i: int) -> None:
        runs.append(run)
        started[i].set()
        run.cancel.wait(60)  # longer than the test: only Stop ends it

    for i, job in enumerate(jobs):
        job.start(lambda run, i=i: work(run, i))
    assert all(e.wait(WAIT_S) for e in started)
    stop_all(WAIT_S)
    assert not any(job.running() for job in jobs)
    assert all(not run.thread.is_alive() for run in runs)


def test_nothing_is_delivered_once_the_owner_is_gone(qtbot):
    owner = QObject()
    job = Job("orphan", owner)
    release = threading.Event()
    thread: list[threading.Thread] = []
    got: list[object] = []

    def work(run: Run) -> str:
        thread.append(threading.current_thread())
        release.wait(WAIT_S)
        run.post(got.append, "progress")
        return "result"

    job.start(work, done=got.append)
    qtbot.waitUntil(lambda: bool(thread), timeout=WAIT)
    shiboken6.delete(owner)  # the dialog or window that owned the job closed
    release.set()
    thread[0].join(WAIT_S)
    flush(qtbot)
    assert got == []


def test_a_closed_job_delivers_nothing_and_starts_no_more(qtbot):
    job = Job("closing")
    release = threading.Event()
    got: list[object] = []

    def work(_run: Run) -> str:
        release.wait(WAIT_S)
        return "late"

    job.start(work, done=got.append)
    job.close()
    release.set()
    qtbot.waitUntil(lambda: not job.running(), timeout=WAIT)
    flush(qtbot)
    assert got == [] and not job.start(lambda _run: "more", done=got.append)


def test_the_outcome_may_start_the_job_again_at_once(qtbot):
    """A single-instance job whose work has returned takes a new start from its own ``done``
    (the memory check reads what was picked meanwhile that way), however long its thread takes to
    end: the thread is held past its work here until the second run has started."""
    job = Job("again")
    release = threading.Event()
    results: list[object] = []

    def first(_run: Run) -> str:
        return "first"

    def then(result: object) -> None:
        results.append(result)
        if result == "first":
            results.append(job.start(lambda _run: "second", done=then))
            release.set()

    original = job._main

    def held_main(run, work, done, failed):  # the first run's thread lingers after its work
        original(run, work, done, failed)
        if work is first:
            release.wait(WAIT_S)

    job._main = held_main  # type: ignore[method-assign]
    assert job.start(first, done=then)
    qtbot.waitUntil(lambda: "second" in results, timeout=WAIT)
    assert results == ["first", True, "second"]
