"""Start the GUI: logging, QApplication, the qasync event loop, the crash hook and the first checkpoint.

This module owns the app's lifetime: ``build`` makes the settings, the history store, the
controllers and the window; ``shutdown`` ends them in order (window and worker threads first,
then the settings still waiting to be written, then the store they were all using).
torch is not imported here; the worker thread imports it on the first load, so the window
shows at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from desktop.config import logfile
from desktop.engine.text_lines import one_line
from desktop.qt.app.screen import ensure_screen

if TYPE_CHECKING:
    from PySide6.QtWidgets import QMessageBox

    from desktop.qt.app.main_window import MainWindow

logger = logging.getLogger(__name__)

_error_boxes: set[QMessageBox] = set()  # the crash hook's message boxes still on screen


def show_error(text: str) -> None:
    """The crash hook's message box, non-modal: a modal one would run a nested event loop
    inside the hook. Only on the GUI thread; elsewhere the log has it."""
    from PySide6.QtCore import Qt, QThread
    from PySide6.QtWidgets import QApplication, QMessageBox

    app = QApplication.instance()
    if app is None or QThread.currentThread() is not app.thread():
        return
    box = QMessageBox(QMessageBox.Icon.Critical, "Nanoscope: unexpected error", text)
    box.setInformativeText(f"Details are in the log: {logfile.log_file()}")
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    _error_boxes.add(box)  # a parentless box has no other owner; Python would delete it at once
    box.finished.connect(lambda _result: _error_boxes.discard(box))
    box.open()


def build(args: argparse.Namespace | None = None) -> MainWindow:
    """Create the store, settings, controllers and window (used by run_app and by tests)."""
    from desktop.config.settings import Settings
    from desktop.qt.app.background import Background
    from desktop.qt.app.main_window import MainWindow
    from desktop.qt.app.settings_autosave import SettingsAutosave
    from desktop.qt.chat.controller import ChatController
    from desktop.qt.compare.controller import CompareController
    from desktop.store import HistoryStore

    settings = Settings()
    store = HistoryStore()
    controller = ChatController(store, settings)
    background = Background(store)
    window = MainWindow(controller, background, settings, CompareController(store, settings))
    SettingsAutosave(settings, parent=window)
    if args is not None and getattr(args, "open_path", None):
        background.extra_dirs.append(Path(args.open_path))
    return window


def shutdown(window: MainWindow) -> None:
    """Close the window (it stops and joins every worker thread, which may still write history),
    write the settings still pending, then close the history store, once."""
    from desktop.qt.app.settings_autosave import SettingsAutosave

    window.close()
    autosave = window.findChild(SettingsAutosave)
    if autosave is not None and autosave.pending:
        autosave.save_now()
    window.controller.store.close()


async def _run(window: MainWindow, smoke: bool) -> None:
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    assert app is not None  # run_app made it
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    window.show()
    if smoke:
        from desktop.qt.app.smoke import attach

        attach(window)
    else:
        window.start()
    await closed.wait()


def run_app(args: argparse.Namespace) -> int:
    if getattr(args, "install_desktop_entry", False):
        from desktop.qt.app.desktop_entry import install_desktop_entry

        for path in install_desktop_entry():
            print(one_line(f"wrote {path}"))
        return 0
    smoke = bool(getattr(args, "smoke_test", False))
    ensure_screen(smoke)
    if smoke and args.home is None:
        import tempfile

        from desktop.config import paths

        paths.set_home(tempfile.mkdtemp(prefix="nanoscope-smoke-"))
    log_path = logfile.setup_logging()
    logfile.log_startup(f"GUI starting; log {log_path}")
    import qasync
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from desktop.config.paths import resource_path

    app = cast(QApplication, QApplication.instance() or QApplication(sys.argv[:1]))
    app.setOrganizationName("Nanoscope")
    app.setApplicationName("Nanoscope")
    app.setDesktopFileName("nanoscope")
    app.setWindowIcon(QIcon(str(resource_path("icons/nanoscope-256.png"))))
    logfile.install_exception_hooks(show_error)
    window = build(args)
    app.aboutToQuit.connect(window.close)  # closeEvent shuts the workers down in order
    try:
        with contextlib.suppress(asyncio.CancelledError):
            qasync.run(_run(window, smoke))
    finally:
        shutdown(window)
        logger.info("GUI closed")
    return exit_code_after(int(getattr(window, "exit_code", 0)))


def exit_code_after(code: int) -> int:
    """``code``, once everything is saved. A model thread still busy past its shutdown's wait (a
    long load at quit) would make Qt abort the interpreter's exit ("QThread: Destroyed while
    thread is still running"); then the process ends here instead, without tearing anything
    down: the history store and the settings are closed by now and the log is flushed."""
    from desktop.qt.model.worker import threads_left_running

    busy = threads_left_running()
    if busy:
        logger.warning("%d model thread(s) still busy at quit; exiting without them", busy)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
