"""User settings: one JSON file, one table of defaults, typed get/set (Qt-free).

Why not QSettings: the engine, the CLI and the tests need the same values without a
QApplication, and a JSON file is easy to inspect. The file carries ``schema_version``;
older files go through ``MIGRATIONS``, and a file that is corrupt or from a newer app is
copied to ``<name>.bak`` and replaced by defaults, with a warning the UI can show once.
Keys this version does not know are kept in the file untouched, so nothing a user (or
another app version) wrote is dropped silently.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from desktop.config import paths
from desktop.engine.files import bounded
from desktop.engine.files.numbers import NumberRefused, describe, finite_float
from desktop.engine.files.safe_json import JsonRefused, loads_bounded
from desktop.engine.kernels.device import DEVICES, PRECISIONS
from desktop.engine.params import CHAT_DEFAULTS, SamplingParams

SCHEMA_VERSION = 2
MAX_FILE_BYTES = 16 << 20  # a settings file is a few KB

THEMES = ("system", "light", "dark")

# The chat window's sampling values (engine/params.py decides them), plus whether the seed is kept.
# Unlocked, as in LM Studio: every reply (a regeneration too) draws a new seed unless the user locks one.
DEFAULT_SAMPLING: dict[str, Any] = {**CHAT_DEFAULTS.to_dict(), "seed_locked": False}

DEFAULTS: dict[str, Any] = {
    "window_geometry": None,  # base64 of QMainWindow.saveGeometry(), or None before the first close
    # "follow": the chat followed the run's latest step ("Latest" in the Step list)
    "last_checkpoint": {"dir": None, "step": None, "follow": False},
    "sampling": DEFAULT_SAMPLING,
    "sampling_presets": {},  # user preset name -> sampling values
    "theme": "system",
    "enter_sends": True,
    "system_prompt": "",
    "device": "auto",
    "dtype": "auto",
    "checkpoint_folders": [],  # folders opened with Open folder…, scanned again at every start
    "recent_checkpoints": [],  # {"dir", "step", "used" (epoch s)}, newest first: the picker's "last used"
    "sampling_panel_visible": True,
    # Speculative decoding in Chat: the draft (StreamOptions.draft, "" off) and its length (0: adaptive).
    "draft": "",
    "draft_k": 0,
    # Compiled in the background where a C++ compiler is found, used once faster than eager: a
    # draft checkpoint's forward (engine/decode/compiled_draft.py), and fast and int8 mode's
    # one-row steps (engine/decode/compiled_step.py).
    "compile_drafts": True,
    # OpenAI-compatible servers: {"id", "name", "url", "stall_timeout", "models"}; keys live in the
    # OS keyring (desktop/config/keystore.py), never here.
    "servers": [],
    # The Compare screen at quit: each pane's pick {"dir", "step", "overrides"} and the comparison
    # it showed (a history conversation id), restored at the next start.
    "compare_session": {"panes": [], "conversation": None},
}

# MIGRATIONS[i] turns a version i+1 document into a version i+2 one (version 1 is the first).
Migration = Callable[[dict[str, Any]], dict[str, Any]]


def _fast_precision(doc: dict[str, Any]) -> dict[str, Any]:
    """v1 -> v2: the picker's "Fast · bf16" became "Fast · 16-bit" ("fast"), the quickest 16-bit
    form for the device: still bf16 on GPUs, fp16 weights with fp32 activations on x86 CPUs."""
    if doc.get("dtype") == "bfloat16":
        doc["dtype"] = "fast"
    return doc


MIGRATIONS: list[Migration] = [_fast_precision]


def _check_type(key: str, value: Any, default: Any) -> Any:
    """``value`` coerced to the type of ``default``; raises ValueError when it cannot be."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        try:
            value, ok = finite_float(value), True
        except NumberRefused:
            ok = False
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ValueError(f"setting {key!r} must be {type(default).__name__}, got {describe(value)}")
    return value


def _sampling(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"setting {key!r} must be a dict of sampling values, got {value!r}")
    unknown = set(value) - set(DEFAULT_SAMPLING)
    if unknown:
        raise ValueError(f"setting {key!r} has unknown sampling values {sorted(unknown)}")
    # Missing entries take the defaults, so presets saved by older versions stay usable.
    values = {k: _check_type(f"{key}.{k}", value.get(k, d), d) for k, d in DEFAULT_SAMPLING.items()}
    SamplingParams.from_dict(values)  # the same ranges as everywhere else; raises ValueError
    return values


SERVER_FIELDS = {"id": str, "name": str, "url": str, "stall_timeout": float, "models": list}


def _servers(key: str, value: Any) -> list[dict[str, Any]]:
    """Each server as its known fields; an API key (or any unknown field) is refused, so none can
    reach the settings file."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"setting {key!r} must be a list of servers")
    out, ids = [], set()
    for server in value:
        unknown = set(server) - set(SERVER_FIELDS)
        if unknown:
            raise ValueError(f"setting {key!r}: unknown server fields {sorted(unknown)}")
        sid, url = server.get("id"), server.get("url")
        if not isinstance(sid, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", sid) or sid in ids:
            raise ValueError(f"setting {key!r}: server id must be a unique slug, got {sid!r}")
        if not isinstance(url, str) or not url.strip():
            raise ValueError(f"setting {key!r}: server {sid!r} needs a URL")
        stall = server.get("stall_timeout", 30.0)
        if isinstance(stall, bool) or not isinstance(stall, (int, float)) or not 0 < stall <= 3600:
            raise ValueError(f"setting {key!r}: server {sid!r} stall_timeout must be in (0, 3600] seconds")
        models = server.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models):
            raise ValueError(f"setting {key!r}: server {sid!r} models must be a list of names")
        ids.add(sid)
        name = server.get("name") if isinstance(server.get("name"), str) else ""
        entry = {"id": sid, "name": name, "url": url.strip(), "stall_timeout": float(stall), "models": models}
        out.append(entry)
    return out


RECENT_MAX = 200  # checkpoints whose last use is remembered


def _folders(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"setting {key!r} must be a list of folder paths, got {value!r}")
    return list(dict.fromkeys(value))  # each folder once, in the order opened


def _compare_session(key: str, value: Any) -> dict[str, Any]:
    def pane(v: Any) -> bool:
        return (
            isinstance(v, dict)
            and set(v) <= {"dir", "step", "overrides"}
            and isinstance(v.get("dir"), str)
            and isinstance(v.get("step"), int)
            and not isinstance(v["step"], bool)
            and isinstance(v.get("overrides", {}), dict)
        )

    conv = value.get("conversation") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or set(value) - {"panes", "conversation"}
        or not isinstance(value.get("panes", []), list)
        or not all(pane(v) for v in value.get("panes", []))
        or (conv is not None and (not isinstance(conv, int) or isinstance(conv, bool)))
    ):
        raise ValueError(
            f"setting {key!r} must be {{'panes': [{{'dir', 'step', 'overrides'}}], 'conversation'}}"
        )
    panes = [
        {"dir": v["dir"], "step": v["step"], "overrides": dict(v.get("overrides", {}))}
        for v in value.get("panes", [])
    ]
    return {"panes": panes, "conversation": conv}


def _recent(key: str, value: Any) -> list[dict[str, Any]]:
    def valid(v: Any) -> bool:
        return (
            isinstance(v, dict)
            and set(v) == {"dir", "step", "used"}
            and isinstance(v["dir"], str)
            and isinstance(v["step"], int)
            and not isinstance(v["step"], bool)
            and _is_finite(v["used"])
        )

    if not isinstance(value, list) or not all(valid(v) for v in value):
        raise ValueError(f"setting {key!r} must be a list of {{'dir': str, 'step': int, 'used': number}}")
    return [{"dir": v["dir"], "step": v["step"], "used": finite_float(v["used"])} for v in value[:RECENT_MAX]]


def _is_finite(value: Any) -> bool:
    try:
        finite_float(value)
    except NumberRefused:
        return False
    return True


def _optional(key: str, value: Any, kind: type) -> Any:
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise ValueError(f"setting {key!r} must be {kind.__name__} or null, got {value!r}")
    return value


def normalize(key: str, value: Any) -> Any:
    """Validate ``value`` for ``key`` and return the form that is stored; raises KeyError/ValueError."""
    if key not in DEFAULTS:
        raise KeyError(f"unknown setting {key!r}")
    if key == "window_geometry":
        return _optional(key, value, str)
    if key == "last_checkpoint":
        if not isinstance(value, dict) or set(value) - {"dir", "step", "follow"}:
            shape = "{'dir': str|None, 'step': int|None, 'follow': bool}"
            raise ValueError(f"setting {key!r} must be {shape}, got {value!r}")
        follow = value.get("follow", False)
        if not isinstance(follow, bool):
            raise ValueError(f"setting {key!r}: 'follow' must be true or false, got {follow!r}")
        return {
            "dir": _optional(key, value.get("dir"), str),
            "step": _optional(key, value.get("step"), int),
            "follow": follow,
        }
    if key == "sampling":
        return _sampling(key, value)
    if key == "servers":
        return _servers(key, value)
    if key == "checkpoint_folders":
        return _folders(key, value)
    if key == "recent_checkpoints":
        return _recent(key, value)
    if key == "compare_session":
        return _compare_session(key, value)
    if key == "sampling_presets":
        if not isinstance(value, dict) or not all(isinstance(name, str) for name in value):
            raise ValueError(f"setting {key!r} must map preset names to sampling values")
        return {name: _sampling(f"{key}[{name!r}]", v) for name, v in value.items()}
    for name, allowed in (("theme", THEMES), ("dtype", PRECISIONS), ("device", DEVICES)):
        if key == name and value not in allowed:
            raise ValueError(f"setting {name!r} must be one of {allowed}, got {value!r}")
    return _check_type(key, value, DEFAULTS[key])


class Settings:
    """The settings of one file. ``warnings`` holds one readable line per problem met while loading."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else paths.settings_path()
        self.warnings: list[str] = []
        self._values: dict[str, Any] = copy.deepcopy(DEFAULTS)
        self._unknown: dict[str, Any] = {}
        self._listeners: list[Callable[[str], None]] = []
        self._load()

    def on_change(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(key)`` after every ``set()`` that changed a value (the app saves then)."""
        self._listeners.append(listener)

    def get(self, key: str) -> Any:
        """A copy of the value, so callers cannot change the settings behind ``set()``'s back."""
        if key not in DEFAULTS:
            raise KeyError(f"unknown setting {key!r}")
        return copy.deepcopy(self._values[key])

    def set(self, key: str, value: Any) -> bool:
        """Store ``value`` (validated); True when it differs from the current value."""
        value = normalize(key, value)
        if value == self._values[key]:
            return False
        self._values[key] = copy.deepcopy(value)
        for listener in self._listeners:
            listener(key)
        return True

    def reset(self, key: str) -> bool:
        """Back to the default (a "Restore defaults" button); True when that changed the value."""
        return self.set(key, copy.deepcopy(DEFAULTS[key]))

    def save(self) -> None:
        """Write atomically: a crash mid-save leaves the old file, never half a new one.

        Raises OSError (disk full, read-only folder) for the caller to report; nothing is lost
        in memory, so a later save can succeed.
        """
        doc = {**self._unknown, **self._values, "schema_version": SCHEMA_VERSION}
        tmp = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=2, sort_keys=True, ensure_ascii=False)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _load(self) -> None:
        try:
            text = bounded.read_text(self.path, "state", limit=MAX_FILE_BYTES)
        except bounded.FileMissing:
            return
        except bounded.FileRefused as e:
            self._set_aside(f"could not be read ({e.reason})")
            return
        try:
            # Bounded: deep nesting, NaN or a 5,000-digit number is refused here, not a traceback.
            doc = loads_bounded(text)
        except JsonRefused as e:
            self._set_aside(f"is not valid JSON ({e})")
            return
        version = doc.get("schema_version", 1) if isinstance(doc, dict) else None
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            self._set_aside("is not a settings object with a valid schema_version")
            return
        if version > SCHEMA_VERSION:
            self._set_aside(
                f"was written by a newer Nanoscope (schema {version}, this one knows {SCHEMA_VERSION})"
            )
            return
        for migrate in MIGRATIONS[version - 1 :]:
            doc = migrate(doc)
        doc.pop("schema_version", None)
        for key, value in doc.items():
            if key not in DEFAULTS:
                self._unknown[key] = value
                continue
            try:
                self._values[key] = normalize(key, value)
            except (ValueError, TypeError, OverflowError) as e:
                self.warnings.append(f"{self.path}: {e}; using the default")

    def _set_aside(self, problem: str) -> None:
        """Move the file to ``<name>.bak`` (so the next start does not warn again) and say so."""
        backup = self.path.with_name(self.path.name + ".bak")
        try:
            os.replace(self.path, backup)
            kept = f"moved it to {backup.name}"
        except OSError as e:
            try:
                shutil.copy2(self.path, backup)
                kept = f"kept a copy as {backup.name}"
            except OSError:
                kept = f"could not keep a copy ({e.strerror or e})"
        self.warnings.append(f"{self.path} {problem}; {kept} and started from defaults")
