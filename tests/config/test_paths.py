"""desktop.config.paths: one place for every path, with an override that keeps tests out of the real home."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO

from desktop.config import paths

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
    repo = REPO
    assert paths.resource_path("icons/app.png") == repo / "resources" / "icons" / "app.png"


def test_resource_path_in_a_frozen_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert paths.resource_path("style.qss") == tmp_path / "resources" / "style.qss"


@pytest.mark.parametrize("bad", ["/etc/passwd", "../secrets", "icons/../../x"])
def test_resource_path_refuses_escapes(bad: str) -> None:
    with pytest.raises(ValueError, match="relative"):
        paths.resource_path(bad)


def test_an_installed_wheel_finds_resources_inside_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel installs resources/ as desktop/resources (pyproject's package-dir mapping)."""
    package = tmp_path / "site-packages" / "desktop"
    (package / "resources" / "icons").mkdir(parents=True)
    monkeypatch.setattr(paths, "__file__", str(package / "config/paths.py"))
    assert paths.resource_path("icons/x.png") == package / "resources" / "icons" / "x.png"


def test_a_checkout_without_the_packaged_folder_uses_the_repo_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paths, "__file__", str(tmp_path / "repo" / "desktop" / "config/paths.py"))
    assert paths.resources_root() == tmp_path / "repo" / "resources"


def test_the_frozen_root_wins_over_the_package_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site-packages" / "desktop"
    (package / "resources").mkdir(parents=True)
    monkeypatch.setattr(paths, "__file__", str(package / "config/paths.py"))
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "bundle"), raising=False)
    assert paths.frozen_root() == tmp_path / "bundle"
    assert paths.resources_root() == tmp_path / "bundle" / "resources"


def test_demo_checkpoint_is_found_in_the_resources_and_recognised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert paths.demo_checkpoint() is None  # a bundle without the demo: no crash, no demo
    demo = tmp_path / "resources" / paths.DEMO_DIR
    demo.mkdir(parents=True)
    assert paths.demo_checkpoint() == demo
    assert paths.is_demo(demo / ".." / demo.name)  # however the path is spelled
    assert not paths.is_demo(tmp_path)


def test_the_log_folder_follows_the_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "env-home"))
    assert paths.log_dir() == tmp_path / "env-home" / "log"
    paths.set_home(tmp_path / "flag-home")  # what --home does
    assert paths.log_dir() == tmp_path / "flag-home" / "log"
