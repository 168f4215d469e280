"""The app's log: a rotating file in ``paths.log_dir()``, plus warnings on stderr when there is one.

A frozen macOS app has no console, so the file is the only place a crash report can go: uncaught
exceptions, on the main thread (``sys.excepthook``, which PySide6 also calls for exceptions in
slots) and on other threads (``threading.excepthook``), are written there with their traceback.
The CLI uses the same file, and nothing here imports Qt (``qt.app.log_folder`` opens the
folder). Nothing is opened at import; ``setup_logging()`` does it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from logging.handlers import RotatingFileHandler
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from desktop import __version__
from desktop.config import paths
from desktop.engine.text_lines import one_line

logger = logging.getLogger(__name__)

LOG_NAME = "nanoscope.log"
MAX_BYTES = 2 * 1024 * 1024  # a few MB: weeks of normal use, small enough to attach to a bug report
BACKUP_COUNT = 3  # nanoscope.log.1 ... .3
FILE_FORMAT = "%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s"

# ``logger.error(..., extra=SHOWN)``: the user has already seen this line (the CLI printed it), so
# it goes to the file only, not a second time to stderr.
SHOWN = {"nanoscope_shown": True}

# Called with one readable line after an uncaught exception is logged (the GUI shows it).
ErrorCallback = Callable[[str], None]

# The hooks in place before the first install_exception_hooks(), for teardown_logging() to restore.
_previous_hooks: list[tuple[Callable[..., Any], Callable[..., Any]]] = []


class _FileHandler(RotatingFileHandler):
    """Ours, so that a second setup finds and replaces it instead of adding another.

    A record that cannot be written (a full disk, the file replaced by a folder) turns file
    logging off with one warning on stderr, instead of logging's traceback for every record.
    """

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        logging.getLogger().removeHandler(self)
        with contextlib.suppress(Exception):
            self.close()
        logger.warning("Logging to the console only: cannot write %s (%s)", self.baseFilename, error)


class _FileFormatter(logging.Formatter):
    """:data:`FILE_FORMAT`, each record one line through the cleaner of every printed line (a name
    with a newline cannot forge a record, nor ``ESC[2J`` clear the terminal of whoever tails
    the file); a traceback keeps its lines, each cleaned the same way."""

    def __init__(self) -> None:
        super().__init__(FILE_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        # The record's line, then its traceback's (which another handler may have formatted and
        # cached on the record first, uncleaned).
        return "\n".join(map(one_line, super().format(record).split("\n")))


class _ConsoleFormatter(logging.Formatter):
    """``nanoscope: warning: ...``, the form the CLI's own messages take: one clean line (the
    cleaner of every printed line), the traceback left to the log file."""

    def format(self, record: logging.LogRecord) -> str:
        return one_line(f"nanoscope: {record.levelname.lower()}: {record.getMessage()}")


class _ConsoleHandler(logging.StreamHandler):
    """Warnings and errors to whatever ``sys.stderr`` is when they happen.

    Looked up per record, like logging's own last-resort handler: tests swap stderr, and a
    windowed frozen app has none (``None``), in which case the file alone has the record.
    """

    def __init__(self) -> None:
        super().__init__()
        self.setLevel(logging.WARNING)
        self.setFormatter(_ConsoleFormatter())
        self.addFilter(lambda record: not getattr(record, "nanoscope_shown", False))

    @property  # type: ignore[override]
    def stream(self) -> TextIO | None:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        """StreamHandler.__init__ assigns a stream; this handler has none of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        if sys.stderr is not None:
            super().emit(record)


def log_file() -> Path:
    return paths.log_dir() / LOG_NAME


def setup_logging(level: int = logging.INFO) -> Path | None:
    """Send log records to ``log_file()`` (and WARNING+ to stderr); return the file, or None.

    Safe to call again: a second call keeps the handlers, or moves the file when the home
    override changed. When the log folder cannot be made (a read-only ``--home``), the app runs
    on with stderr only and says so in one line.
    """
    root = logging.getLogger()
    if not any(isinstance(h, _ConsoleHandler) for h in root.handlers):
        root.addHandler(_ConsoleHandler())
    if root.getEffectiveLevel() > level:
        root.setLevel(level)
    try:
        path = log_file()
    except OSError as exc:
        _remove_handlers(_FileHandler)
        logger.warning("No log file: cannot create the log folder (%s)", exc.strerror or exc)
        return None
    current = [h for h in root.handlers if isinstance(h, _FileHandler)]
    if current and Path(current[0].baseFilename) == path:
        return path
    problem = _set_aside_if_special(path)
    if problem is not None:
        _remove_handlers(_FileHandler)
        logger.warning("No log file: %s", problem)
        return None
    _remove_handlers(_FileHandler)
    # delay: the file is opened by the first record, so a CLI run without news writes nothing.
    handler = _FileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUP_COUNT, encoding="utf-8", delay=True)
    handler.setFormatter(_FileFormatter())
    root.addHandler(handler)
    return path


def _set_aside_if_special(path: Path) -> str | None:
    """A log path that is a folder, a FIFO or a device (appending to a FIFO blocks for ever) is
    renamed to ``<name>.bak`` so the log can start afresh; why not, when that fails."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot use {path} ({exc.strerror or exc})"
    if stat.S_ISREG(mode) or (stat.S_ISLNK(mode) and path.is_file() and not path.is_fifo()):
        return None
    backup = path.with_name(path.name + ".bak")
    try:
        os.replace(path, backup)
    except OSError as exc:
        return f"{path} is not a regular file and cannot be moved aside ({exc.strerror or exc})"
    logger.warning("%s was not a regular file; moved it to %s", path, backup.name)
    return None


def teardown_logging() -> None:
    """Flush and remove what ``setup_logging`` and ``install_exception_hooks`` added."""
    _remove_handlers(_FileHandler)
    _remove_handlers(_ConsoleHandler)
    if _previous_hooks:
        sys.excepthook, threading.excepthook = _previous_hooks.pop()


def _remove_handlers(kind: type[logging.Handler]) -> None:
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, kind)]:
        root.removeHandler(handler)
        handler.close()


@contextlib.contextmanager
def cli_logging() -> Iterator[None]:
    """``setup_logging()`` for one run of the command line.

    An exception escaping the run is logged before Python prints it; at the end the handlers
    and hooks are removed, so a caller running ``cli.main()`` twice (the tests) keeps none.
    """
    setup_logging()
    try:
        yield
    except Exception:
        logger.critical("Uncaught exception", exc_info=True, extra=SHOWN)
        raise
    finally:
        teardown_logging()


def log_startup(what: str) -> None:
    logger.info("Nanoscope %s %s (Python %s, %s)", __version__, what, sys.version.split()[0], sys.platform)


def install_exception_hooks(on_error: ErrorCallback | None = None) -> None:
    """Log every uncaught exception with its traceback, then let ``on_error`` show it.

    ``on_error`` is called for ``sys.excepthook`` only, on whichever thread raised (a slot of a
    worker thread too), so it must check the thread itself. Other threads' exceptions are logged
    only. A failing ``on_error`` is logged as well: it must not hide the error it was showing.
    """

    def main_hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            sys.__excepthook__(exc_type, exc, tb)
            return
        logger.critical("Uncaught exception", exc_info=(exc_type, exc, tb))
        if on_error is not None:
            try:
                on_error(f"{exc_type.__name__}: {exc}")
            except Exception:
                logger.exception("Could not show the error")

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return  # what threading itself does: SystemExit just ends the thread
        name = args.thread.name if args.thread is not None else "unknown"
        exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
        logger.critical("Uncaught exception in thread %s", name, exc_info=exc_info)  # type: ignore[arg-type]

    if not _previous_hooks:
        _previous_hooks.append((sys.excepthook, threading.excepthook))
    sys.excepthook = main_hook
    threading.excepthook = thread_hook
