"""desktop.paths: one place for every path, with an override that keeps tests out of the real home."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop import paths

DIRS = {"data": paths.data_dir, "config": paths.config_dir, "cache": paths.cache_dir, "log": paths.log_dir}


@pytest.fixture(autouse=True)
def no_override(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(paths.HOME_ENV, raising=False)
    paths.set_home(None)
    yield
    paths.set_home(None)


@pytest.mark.parametrize("name", sorted(DIRS))
def test_set_home_puts_each_folder_under_home_and_creates_it(tmp_path: Path, name: str) -> None:
    paths.set_home(tmp_path / "nh")
    d = DIRS[name]()
    assert d == tmp_path / "nh" / name
    assert d.is_dir()


def test_files_live_in_their_folders(tmp_path: Path) -> None:
    paths.set_home(tmp_path)
    assert paths.history_db_path().parent == tmp_path / "data"
    assert paths.settings_path().parent == tmp_path / "config"
    assert not paths.history_db_path().exists()  # only the folder is created, not the file


def test_env_override_applies_and_set_home_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "from-env"))
    assert paths.config_dir() == tmp_path / "from-env" / "config"
    paths.set_home(tmp_path / "from-flag")
    assert paths.config_dir() == tmp_path / "from-flag" / "config"
    paths.set_home(None)
    assert paths.config_dir() == tmp_path / "from-env" / "config"


def test_relative_home_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    paths.set_home("rel")
    assert paths.data_dir() == tmp_path.resolve() / "rel" / "data"


def test_cache_folder_is_tagged_for_backup_tools(tmp_path: Path) -> None:
    paths.set_home(tmp_path)
    tag = paths.cache_dir() / "CACHEDIR.TAG"
    assert tag.read_text(encoding="utf-8").startswith("Signature: 8a477f597d28d172789f06886806bc55")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG variables steer platformdirs on Linux")
def test_without_override_the_os_folders_are_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    assert paths.data_dir() == tmp_path / "xdg-data" / paths.APP_NAME
    assert paths.settings_path() == tmp_path / "xdg-config" / paths.APP_NAME / "settings.json"


def test_nanochat_base_dir_follows_nanochat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.NANOCHAT_BASE_ENV, str(tmp_path / "nc"))
    assert paths.nanochat_base_dir() == tmp_path / "nc"
    monkeypatch.delenv(paths.NANOCHAT_BASE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.nanochat_base_dir() == tmp_path / ".cache" / "nanochat"
    assert not (tmp_path / ".cache").exists()  # nanochat's folder is read, never created by us


def test_resource_path_from_a_checkout() -> None:
    repo = Path(__file__).resolve().parents[1]
    assert paths.resource_path("icons/app.png") == repo / "resources" / "icons" / "app.png"


def test_resource_path_in_a_frozen_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert paths.resource_path("style.qss") == tmp_path / "resources" / "style.qss"


@pytest.mark.parametrize("bad", ["/etc/passwd", "../secrets", "icons/../../x"])
def test_resource_path_refuses_escapes(bad: str) -> None:
    with pytest.raises(ValueError, match="relative"):
        paths.resource_path(bad)
