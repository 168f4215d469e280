"""Fixtures of the window tests: the windows a test opens (shut down as the app does it), an
asyncio loop run by Qt as in the app, a tiny nanochat base dir, and the clean-up every window test
needs on the GUI thread. ``support.window`` has the helpers that drive the window."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import qasync
import shiboken6
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication
from support.checkpoint_factory import write_checkpoint
from support.fake_backend import FakeBackend
from support.window import WAIT, open_window

from desktop.qt.app.app import shutdown
from desktop.qt.app.main_window import MainWindow


@pytest.fixture
def loop(qapp, qtbot) -> Iterator[asyncio.AbstractEventLoop]:
    """An asyncio loop that runs whenever Qt runs events (qtbot's waits included), as in the app."""
    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    yield loop
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:  # a scan or summary still under way when the test ended
        task.cancel()
    qtbot.waitUntil(lambda: all(task.done() for task in pending), timeout=WAIT)
    # qasync's stop() also quits the application, which would end every later event loop (and
    # qtbot's waits) at once: here the loop stops, Qt goes on.
    qapp.exit = lambda *_args: None
    try:
        loop.stop()
    finally:
        del qapp.exit
    qapp.aboutToQuit.disconnect(loop._after_run_forever)
    asyncio.events._set_running_loop(None)
    asyncio.set_event_loop(None)
    loop.close()


@pytest.fixture(autouse=True)
def _collected_on_the_gui_thread(qapp) -> Iterator[None]:
    """After everything else of a test is torn down: the windows, controllers and the asyncio
    loop hold Qt timers, which must be freed here, on the GUI thread, and not whenever a later
    test's worker thread happens to run the garbage collector."""
    yield
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()


@pytest.fixture(autouse=True)
def _fake_replies_flow():
    FakeBackend.gate.set()
    yield
    FakeBackend.gate.set()


@pytest.fixture
def windows(qtbot) -> Iterator[list[MainWindow]]:
    """Every window a test opens is shut down as the app does it, however the test ends."""
    opened: list[MainWindow] = []
    yield opened
    for win in opened:
        if not shiboken6.isValid(win):
            continue
        if not getattr(win, "_shut_down", False):
            shutdown(win)
        # Freed now, on the GUI thread: the test's own references outlive this teardown, and
        # the garbage collector could free these timer-holding objects on any thread later.
        for obj in (win, win.controller, win.compare, win.background):
            shiboken6.delete(obj)


@pytest.fixture
def win(qtbot, windows) -> MainWindow:
    windows.append(open_window(qtbot))
    return windows[0]


@pytest.fixture(scope="module")
def nanochat_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A nanochat base dir holding one tiny SFT run with two steps."""
    base = tmp_path_factory.mktemp("nanochat")
    write_checkpoint(base, "E7", phase="chatsft", tag="d4", step=10, tokenizer="pkl")
    write_checkpoint(base, "E7", phase="chatsft", tag="d4", step=20, tokenizer="pkl")
    return base
