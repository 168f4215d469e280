"""Start the GUI: QApplication, the qasync event loop, the crash hook and the first checkpoint.

torch is not imported here; the worker thread imports it on the first load, so the window
shows at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import traceback
from pathlib import Path

DEMO_DIR = Path("demo") / "chatsft_checkpoints" / "demo"


def demo_checkpoint() -> Path | None:
    from .paths import resource_path

    path = resource_path(DEMO_DIR)
    return path if path.is_dir() else None


def _install_excepthook() -> None:
    """Unhandled exceptions are logged and shown, never silently kill the app."""

    def hook(exc_type, exc, tb) -> None:
        traceback.print_exception(exc_type, exc, tb)
        from PySide6.QtCore import QThread
        from PySide6.QtWidgets import QApplication, QMessageBox

        app = QApplication.instance()
        if app is not None and QThread.currentThread() is app.thread():
            QMessageBox.critical(None, "Nanoscope: unexpected error", f"{exc_type.__name__}: {exc}")

    sys.excepthook = hook


def build(args: argparse.Namespace | None = None):
    """Create the store, settings, controller and window (used by run_app and by tests)."""
    from .background import Background
    from .compare_controller import CompareController
    from .controller import ChatController
    from .settings import Settings
    from .store import HistoryStore
    from .ui.main_window import MainWindow

    settings = Settings()
    store = HistoryStore()
    controller = ChatController(store, settings)
    background = Background(store)
    window = MainWindow(controller, background, settings, CompareController(store, settings))
    if args is not None and getattr(args, "open_path", None):
        background.extra_dirs.append(Path(args.open_path))
    return window


async def _run(window, smoke: bool) -> None:
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    window.show()
    if smoke:
        from .smoke import attach

        attach(window)
    else:
        window.start()
    await closed.wait()


def run_app(args: argparse.Namespace) -> int:
    if getattr(args, "install_desktop_entry", False):
        from .desktop_entry import install_desktop_entry

        for path in install_desktop_entry():
            print(f"wrote {path}")
        return 0
    import qasync
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName("Nanoscope")
    app.setApplicationName("Nanoscope")
    app.setDesktopFileName("nanoscope")
    from PySide6.QtGui import QIcon

    from .paths import resource_path

    app.setWindowIcon(QIcon(str(resource_path("icons/nanoscope-256.png"))))
    _install_excepthook()
    smoke = bool(getattr(args, "smoke_test", False))
    if smoke and args.home is None:
        import tempfile

        from . import paths

        paths.set_home(tempfile.mkdtemp(prefix="nanoscope-smoke-"))
    window = build(args)
    app.aboutToQuit.connect(window.close)  # closeEvent shuts the worker down in order
    with contextlib.suppress(asyncio.CancelledError):
        qasync.run(_run(window, smoke))
    return int(getattr(window, "exit_code", 0))


def main() -> int:
    from .cli import main as cli_main

    return cli_main(sys.argv[1:])
