"""desktop.config.settings: defaults, typed set, atomic save, and files that are corrupt, newer or older."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from desktop.config import paths, settings
from desktop.config.settings import DEFAULTS, Settings


@pytest.fixture(autouse=True)
def home(tmp_path: Path) -> Iterator[Path]:
    paths.set_home(tmp_path)
    yield tmp_path
    paths.set_home(None)


def write_file(doc: Any) -> Path:
    path = paths.settings_path()
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def test_defaults_without_a_file_and_no_file_written(home: Path) -> None:
    s = Settings()
    assert s.path == home / "config" / "settings.json"
    for key, value in DEFAULTS.items():
        assert s.get(key) == value
    assert s.get("sampling")["temperature"] == 0.8
    assert s.warnings == []
    assert not s.path.exists()


def test_set_reports_change_and_save_round_trips() -> None:
    s = Settings()
    assert s.set("theme", "dark") is True
    assert s.set("theme", "dark") is False
    assert s.set("enter_sends", False) is True
    assert s.set("last_checkpoint", {"dir": "/ckpt/d20", "step": 650}) is True
    s.save()
    again = Settings()
    assert again.get("theme") == "dark"
    assert again.get("enter_sends") is False
    assert again.get("last_checkpoint") == {"dir": "/ckpt/d20", "step": 650, "follow": False}
    assert json.loads(s.path.read_text(encoding="utf-8"))["schema_version"] == settings.SCHEMA_VERSION
    assert not s.path.with_name("settings.json.tmp").exists()


def test_reset_restores_the_default() -> None:
    s = Settings()
    s.set("sampling", {"temperature": 1.5})
    assert s.reset("sampling") is True
    assert s.get("sampling") == DEFAULTS["sampling"]
    assert s.reset("sampling") is False


def test_get_returns_a_copy() -> None:
    s = Settings()
    sampling = s.get("sampling")
    sampling["temperature"] = 2.0
    assert s.get("sampling")["temperature"] == DEFAULTS["sampling"]["temperature"]


def test_sampling_is_merged_over_defaults_and_ints_become_floats() -> None:
    s = Settings()
    assert s.set("sampling", {"temperature": 1, "top_k": 10}) is True
    got = s.get("sampling")
    assert got == {**DEFAULTS["sampling"], "temperature": 1.0, "top_k": 10}
    assert isinstance(got["temperature"], float)


def test_presets_hold_sampling_values() -> None:
    s = Settings()
    s.set("sampling_presets", {"precise": {"temperature": 0.1}})
    assert s.get("sampling_presets")["precise"] == {**DEFAULTS["sampling"], "temperature": 0.1}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("theme", "blue"),
        ("enter_sends", 1),
        ("sampling", {"temperature": "hot"}),
        ("sampling", {"top_k": True}),
        ("sampling", {"top_k": 2.5}),
        ("sampling", {"mystery": 1}),
        ("window_geometry", 12),
        ("last_checkpoint", {"dir": 3}),
        ("last_checkpoint", {"dir": "/ckpt", "step": 1, "follow": "yes"}),
        ("sampling_presets", {"x": {"seed": "a"}}),
    ],
)
def test_wrong_values_are_refused(key: str, value: Any) -> None:
    s = Settings()
    before = s.get(key)
    with pytest.raises(ValueError, match=key.split(".")[0]):
        s.set(key, value)
    assert s.get(key) == before


def test_unknown_key_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        Settings().set("no_such_setting", 1)


def test_corrupt_file_is_kept_as_bak_and_defaults_used() -> None:
    path = write_file("{ not json")
    s = Settings()
    assert s.get("theme") == DEFAULTS["theme"]
    assert path.with_name("settings.json.bak").read_text(encoding="utf-8") == "{ not json"
    assert len(s.warnings) == 1 and "not valid JSON" in s.warnings[0] and str(path) in s.warnings[0]
    assert "\n" not in s.warnings[0]


def test_newer_file_is_kept_as_bak_and_defaults_used() -> None:
    newer = {"schema_version": settings.SCHEMA_VERSION + 1, "theme": "dark"}
    path = write_file(newer)
    s = Settings()
    assert s.get("theme") == DEFAULTS["theme"]
    assert json.loads(path.with_name("settings.json.bak").read_text(encoding="utf-8")) == newer
    assert "newer" in s.warnings[0]


def test_one_bad_value_falls_back_alone() -> None:
    write_file({"schema_version": 1, "theme": "purple", "enter_sends": False})
    s = Settings()
    assert s.get("theme") == DEFAULTS["theme"]
    assert s.get("enter_sends") is False
    assert len(s.warnings) == 1 and "theme" in s.warnings[0]


def test_unknown_keys_survive_a_save() -> None:
    path = write_file({"schema_version": 1, "from_another_version": {"a": 1}, "theme": "light"})
    s = Settings()
    s.set("theme", "dark")
    s.save()
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["from_another_version"] == {"a": 1}
    assert doc["theme"] == "dark"


def test_older_files_are_migrated(monkeypatch: pytest.MonkeyPatch) -> None:
    def dark_mode_to_theme(doc: dict[str, Any]) -> dict[str, Any]:
        doc = dict(doc)
        doc["theme"] = "dark" if doc.pop("dark_mode") else "light"
        return doc

    monkeypatch.setattr(settings, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(settings, "MIGRATIONS", [dark_mode_to_theme])
    path = write_file({"schema_version": 1, "dark_mode": True})
    s = Settings()
    assert s.get("theme") == "dark"
    s.save()
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["schema_version"] == 2 and "dark_mode" not in doc


def test_a_failed_save_leaves_the_old_file(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings()
    s.set("theme", "light")
    s.save()
    before = s.path.read_bytes()

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(settings.json, "dump", disk_full)
    s.set("theme", "dark")
    with pytest.raises(OSError):
        s.save()
    assert s.path.read_bytes() == before
    assert not s.path.with_name("settings.json.tmp").exists()


def test_version_1_fast_bf16_becomes_fast() -> None:
    path = write_file({"schema_version": 1, "dtype": "bfloat16", "theme": "dark"})
    s = Settings()
    assert s.get("dtype") == "fast" and s.get("theme") == "dark" and s.warnings == []
    s.save()
    assert json.loads(path.read_text(encoding="utf-8"))["schema_version"] == settings.SCHEMA_VERSION


@pytest.mark.parametrize(("key", "bad"), [("dtype", "float8"), ("device", "tpu")])
def test_unknown_precision_or_device_falls_back(key: str, bad: str) -> None:
    write_file({"schema_version": settings.SCHEMA_VERSION, key: bad})
    s = Settings()
    assert s.get(key) == DEFAULTS[key]
    assert len(s.warnings) == 1 and key in s.warnings[0]
    with pytest.raises(ValueError, match=key):
        s.set(key, bad)


# --- saved when changed (SettingsAutosave) ---------------------------------------------------


def on_disk(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def test_listeners_hear_real_changes_only() -> None:
    s = Settings()
    heard: list[str] = []
    s.on_change(heard.append)
    s.set("theme", "dark")
    s.set("theme", "dark")  # no change, no call
    s.reset("theme")
    assert heard == ["theme", "theme"]


@pytest.mark.gui
def test_a_burst_of_changes_reaches_disk_once_it_settles(qtbot) -> None:
    from desktop.qt.app.settings_autosave import SettingsAutosave

    s = Settings()
    autosave = SettingsAutosave(s, delay_ms=50)
    for value in ("dark", "light", "dark"):
        s.set("theme", value)
    assert on_disk(s.path) == {}  # debounced: nothing written while the changes still come
    qtbot.waitUntil(lambda: on_disk(s.path).get("theme") == "dark", timeout=5000)
    assert not autosave.pending


@pytest.mark.gui
def test_a_failed_autosave_is_logged_and_the_next_change_retries(
    qtbot, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from desktop.qt.app.settings_autosave import SettingsAutosave

    blocked = tmp_path / "blocked"
    blocked.write_text("")  # a file where the settings folder should be: every save fails
    s = Settings(blocked / "settings.json")
    autosave = SettingsAutosave(s, delay_ms=10)
    with caplog.at_level(logging.WARNING, logger="desktop.qt.app.settings_autosave"):
        s.set("theme", "dark")
        qtbot.waitUntil(lambda: any("Settings not saved" in r.message for r in caplog.records), timeout=5000)
    blocked.unlink()
    s.set("enter_sends", False)
    qtbot.waitUntil(lambda: on_disk(s.path).get("theme") == "dark", timeout=5000)
    assert on_disk(s.path)["enter_sends"] is False
    assert not autosave.pending


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[" * 100_000 + "]" * 100_000, "is not valid JSON (nested deeper than 64 levels)"),
        (
            '{"schema_version": 2, "theme": ' + "9" * 5000 + "}",
            "is not valid JSON (a number has more than 4300 digits)",
        ),
        (
            '{"schema_version": 2, "sampling": {"temperature": NaN}}',
            "is not valid JSON (NaN is not a JSON value)",
        ),
    ],
    ids=["deep", "5000-digits", "nan"],
)
def test_a_file_python_would_choke_on_starts_from_defaults_once(text: str, problem: str) -> None:
    path = write_file(text)
    s = Settings()
    assert s.get("theme") == DEFAULTS["theme"]
    assert s.warnings == [f"{path} {problem}; moved it to settings.json.bak and started from defaults"]
    assert path.with_name("settings.json.bak").read_text(encoding="utf-8") == text
    assert Settings().warnings == []  # said once: the next start finds no bad file


def test_a_value_too_big_for_its_setting_falls_back_alone() -> None:
    write_file({"schema_version": 2, "theme": "dark", "sampling": {**DEFAULTS["sampling"], "seed": 10**100}})
    s = Settings()
    assert s.get("theme") == "dark"
    assert s.get("sampling") == DEFAULTS["sampling"]
    assert len(s.warnings) == 1 and "seed" in s.warnings[0] and s.warnings[0].endswith("; using the default")


def test_a_settings_path_inside_a_file_is_reported_not_raised(home: Path, monkeypatch) -> None:
    blocker = home / "not-a-folder"
    blocker.write_text("x", encoding="utf-8")
    monkeypatch.setattr(paths, "settings_path", lambda: blocker / "settings.json")
    s = Settings()
    assert s.get("theme") == DEFAULTS["theme"]
    assert len(s.warnings) == 1 and s.warnings[0].startswith(f"{blocker / 'settings.json'} could not be read")
