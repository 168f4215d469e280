"""desktop.config.logfile: the rotating log under the app's folders, uncaught exceptions, and CLI errors."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.cli import main as cli
from desktop.config import logfile, paths


@pytest.fixture(autouse=True)
def clean_logging() -> Iterator[None]:
    """Each test starts and ends without our handlers or hooks on the root logger."""
    logfile.teardown_logging()
    yield
    logfile.teardown_logging()


def our_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger().handlers if type(h).__module__ == logfile.__name__]


def test_the_log_file_lives_under_the_home_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "env-home"))
    assert logfile.setup_logging() == tmp_path / "env-home" / "log" / logfile.LOG_NAME
    logging.getLogger("desktop.test").info("hello from the test")
    assert "hello from the test" in (tmp_path / "env-home" / "log" / logfile.LOG_NAME).read_text()

    paths.set_home(tmp_path / "flag-home")  # --home, decided after the env var was read
    moved = logfile.setup_logging()
    assert moved == tmp_path / "flag-home" / "log" / logfile.LOG_NAME
    logging.getLogger("desktop.test").info("after the move")
    assert "after the move" in moved.read_text()
    assert len(our_handlers()) == 2  # one file, one console: setting up again adds none


def test_an_exception_in_another_thread_is_logged_with_its_traceback() -> None:
    log = logfile.setup_logging()
    logfile.install_exception_hooks()

    def work() -> None:
        raise ValueError("thread trouble 4711")

    thread = threading.Thread(target=work, name="scanner")
    thread.start()
    thread.join()
    text = log.read_text(encoding="utf-8")
    assert "Uncaught exception in thread scanner" in text
    assert "ValueError: thread trouble 4711" in text and "in work" in text


def test_teardown_restores_the_hooks_it_found() -> None:
    before = (sys.excepthook, threading.excepthook)
    logfile.setup_logging()
    logfile.install_exception_hooks()
    logfile.install_exception_hooks()  # a second install must not lose the originals
    assert sys.excepthook is not before[0]
    logfile.teardown_logging()
    assert (sys.excepthook, threading.excepthook) == before
    assert our_handlers() == []


def test_an_unusable_log_folder_leaves_one_warning_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(paths.HOME_ENV, str(blocker))  # log_dir() cannot be made under a file
    assert logfile.setup_logging() is None
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("nanoscope: warning: No log file")


def test_a_cli_error_is_logged_and_printed_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "cli-home"
    missing = tmp_path / "no-such-checkpoint"
    code = cli.main(["--home", str(home), "generate", str(missing), "--prompt", "hi"])
    assert code == cli.EXIT_ERROR
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("nanoscope: error:")
    message = err[0].removeprefix("nanoscope: error: ")
    log = (home / "log" / logfile.LOG_NAME).read_text(encoding="utf-8")
    assert f"ERROR [MainThread] desktop.cli.main: {message}" in log
    assert our_handlers() == []  # main() leaves nothing behind
