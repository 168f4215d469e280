"""The app's own files never stop it: a damaged or special state file is set aside with one
notice and the app goes on; a home that cannot be used is refused at start in one line, before
any thread or window exists."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.cli import main as cli
from desktop.config import logfile, paths
from desktop.config.settings import DEFAULTS, Settings
from desktop.engine.kempnerforge.config import ConfigMemory
from desktop.store import HistoryError, HistoryStore


@pytest.fixture(autouse=True)
def clean_logging() -> Iterator[None]:
    logfile.teardown_logging()
    yield
    logfile.teardown_logging()


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


# --- a home that cannot be used ----------------------------------------------------------------


@pytest.mark.parametrize("sub", ["cache", "config", "data", "log"])
def test_a_home_whose_folder_is_a_file_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys, sub):
    home = tmp_path / "home"
    home.mkdir()
    (home / sub).write_text("not a folder")
    monkeypatch.setenv(paths.HOME_ENV, str(home))
    assert cli.main(["list"]) == cli.EXIT_ERROR
    line = one_error_line(capsys)
    assert (
        line
        == f"nanoscope: error: {home / sub}: is a file, not a folder; move it away or choose another home"
    )


def test_nanoscope_home_below_a_file_is_refused_like_home(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(paths.HOME_ENV, str(blocker / "home"))
    assert cli.main(["list"]) == cli.EXIT_ERROR
    assert one_error_line(capsys).startswith(f"nanoscope: error: {blocker}")


# --- state files set aside ------------------------------------------------------------------------


def test_settings_that_are_a_fifo_or_point_at_dev_zero_are_set_aside(tmp_path):
    path = paths.settings_path()
    os.mkfifo(path)  # reading it would block for ever
    settings = Settings()
    assert settings.get("theme") == DEFAULTS["theme"]
    assert len(settings.warnings) == 1 and "not a regular file (a named pipe)" in settings.warnings[0]
    path.symlink_to("/dev/zero")
    settings = Settings()
    assert len(settings.warnings) == 1 and "not a regular file (a device)" in settings.warnings[0]


def test_a_deeply_nested_config_memory_is_ignored_with_a_notice(caplog):
    path = paths.kempnerforge_configs_file()
    path.write_text("[" * 100_000 + "]" * 100_000)
    memory = ConfigMemory(path)
    with caplog.at_level(logging.WARNING):
        assert memory.get(Path("/runs/a")) is None
    assert any("remembered KempnerForge configs" in r.getMessage() for r in caplog.records)


def test_a_history_database_that_is_a_fifo_is_refused_in_one_line(tmp_path):
    path = tmp_path / "history.sqlite3"
    os.mkfifo(path)
    with pytest.raises(HistoryError, match=r"not a history database \(not a regular file \(a named pipe\)\)"):
        HistoryStore(path)


# --- the log ----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: os.mkfifo(p)], ids=["folder", "fifo"])
def test_a_log_that_is_not_a_regular_file_is_moved_aside_and_logging_goes_on(capsys, make):
    path = paths.log_dir() / logfile.LOG_NAME
    make(path)
    assert logfile.setup_logging() == path
    logging.getLogger("desktop.test").warning("written after the move")
    assert "written after the move" in path.read_text()
    assert path.with_name(logfile.LOG_NAME + ".bak").exists()
    assert "was not a regular file; moved it to nanoscope.log.bak" in capsys.readouterr().err


def test_a_log_that_cannot_be_written_turns_file_logging_off_with_one_warning(capsys):
    path = logfile.setup_logging()
    assert path is not None
    ours = [h for h in logging.getLogger().handlers if type(h).__module__ == logfile.__name__]
    handler = next(h for h in ours if isinstance(h, logging.FileHandler))
    handler.stream = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115 (the handler closes it)
    for _ in range(3):
        logging.getLogger("desktop.test").warning("disk full")
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--- Logging error ---" not in err
    assert err.count("Logging to the console only: cannot write") == 1
    assert handler not in logging.getLogger().handlers
