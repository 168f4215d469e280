"""Where Nanoscope keeps its files: the one module that knows paths.

Everything else asks this module, so that a single override (the ``NANOSCOPE_HOME``
environment variable, or ``set_home()`` which the tests and the ``--home`` CLI flag use)
moves *all* of the app's files at once and nothing can leak into the real home directory.
Directories are created on first use, never at import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path, PurePath

import platformdirs

APP_NAME = "Nanoscope"
HOME_ENV = "NANOSCOPE_HOME"
NANOCHAT_BASE_ENV = "NANOCHAT_BASE_DIR"

# Written once into the cache folder so backup tools skip it (https://bford.info/cachedir/).
_CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by Nanoscope.\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)

_home_override: Path | None = None


def set_home(path: str | os.PathLike[str] | None) -> None:
    """Keep every Nanoscope file under ``path`` (``None`` goes back to the env var or the OS defaults)."""
    global _home_override
    _home_override = None if path is None else Path(path).expanduser().resolve()


def home() -> Path | None:
    """The override in effect, if any: ``set_home()`` wins over ``$NANOSCOPE_HOME``."""
    if _home_override is not None:
        return _home_override
    env = os.environ.get(HOME_ENV)
    return Path(env).expanduser().resolve() if env else None


def _ensure(sub: str, platform_dir: Callable[..., str]) -> Path:
    base = home()
    # appauthor=False: no "author" folder level on Windows; one name everywhere.
    d = base / sub if base is not None else Path(platform_dir(APP_NAME, False))
    d.mkdir(parents=True, exist_ok=True)
    return d


def data_dir() -> Path:
    return _ensure("data", platformdirs.user_data_dir)


def config_dir() -> Path:
    return _ensure("config", platformdirs.user_config_dir)


def cache_dir() -> Path:
    d = _ensure("cache", platformdirs.user_cache_dir)
    tag = d / "CACHEDIR.TAG"
    if not tag.exists():
        tag.write_text(_CACHEDIR_TAG, encoding="utf-8")
    return d


def log_dir() -> Path:
    return _ensure("log", platformdirs.user_log_dir)


def history_db_path() -> Path:
    return data_dir() / "history.sqlite3"


def settings_path() -> Path:
    return config_dir() / "settings.json"


def nanochat_base_dir() -> Path:
    """Where nanochat itself keeps checkpoints; read-only for us, so it is never created here."""
    return Path(os.environ.get(NANOCHAT_BASE_ENV) or "~/.cache/nanochat").expanduser()


def resource_path(name: str | os.PathLike[str]) -> Path:
    """A file in the repo-level ``resources/`` folder, from a checkout or a PyInstaller bundle.

    ``resources/`` sits outside the ``desktop`` package, so a frozen app finds it under
    ``sys._MEIPASS`` (where the spec's ``datas`` put it) and a checkout next to ``desktop/``.
    """
    rel = PurePath(name)
    if rel.is_absolute() or rel.anchor or ".." in rel.parts:
        raise ValueError(f"resource name must be relative without '..': {name!s}")
    frozen_root = getattr(sys, "_MEIPASS", None)
    root = Path(frozen_root) if frozen_root else Path(__file__).resolve().parents[1]
    return root / "resources" / rel
