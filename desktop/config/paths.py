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


def kempnerforge_configs_file() -> Path:
    """Which training TOML was chosen for which KempnerForge run (a small JSON map)."""
    return cache_dir() / "kempnerforge_configs.json"


def kernel_timings_file() -> Path:
    """How fast each matrix-product kernel ran on this machine (engine/kernels/tuning.py)."""
    return cache_dir() / "kernel_timings.json"


def cache_dir() -> Path:
    d = _ensure("cache", platformdirs.user_cache_dir)
    tag = d / "CACHEDIR.TAG"
    if not tag.exists():
        tag.write_text(_CACHEDIR_TAG, encoding="utf-8")
    return d


def log_dir() -> Path:
    return _ensure("log", platformdirs.user_log_dir)


def unusable_home() -> str | None:
    """Why the app's folders cannot be used, in one line; None when they can.

    Checked at start, before any thread or file exists: a ``cache`` that is a file, a read-only
    home or one below a file would otherwise fail later, in a worker, or abort Qt.
    """
    for name, make in (("data", data_dir), ("config", config_dir), ("cache", cache_dir), ("log", log_dir)):
        try:
            folder = make()
        except FileExistsError as exc:
            return f"{exc.filename or name}: is a file, not a folder; move it away or choose another home"
        except OSError as exc:
            where = exc.filename or home() or name
            return f"{where}: cannot be used for Nanoscope's {name} ({exc.strerror or exc})"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"{folder}: not writable; choose another home"
    return None


def history_db_path() -> Path:
    return data_dir() / "history.sqlite3"


def eval_results_path() -> Path:
    """Eval answers kept by step and weights' content hash (store/eval_results.py): a cache, not history."""
    return cache_dir() / "eval_results.sqlite3"


def settings_path() -> Path:
    return config_dir() / "settings.json"


def nanochat_base_dir() -> Path:
    """Where nanochat itself keeps checkpoints; read-only for us, so it is never created here."""
    return Path(os.environ.get(NANOCHAT_BASE_ENV) or "~/.cache/nanochat").expanduser()


# The bundled demo checkpoint, relative to the resources folder (docs/DEMO_MODEL.md).
DEMO_DIR = PurePath("demo") / "chatsft_checkpoints" / "demo"


def frozen_root() -> Path | None:
    """The folder a PyInstaller bundle unpacks to (``sys._MEIPASS``), or None when not frozen."""
    root = getattr(sys, "_MEIPASS", None)
    return Path(root) if root else None


def resources_root() -> Path:
    """The folder holding the demo model, the icons and the launcher template.

    Three layouts, one answer: a PyInstaller bundle has it at ``<bundle>/resources`` (the spec's
    ``datas``), an installed wheel inside the package as ``desktop/resources`` (pyproject maps the
    repo's folder there), and a source checkout or editable install at ``<repo>/resources``.
    Plain paths rather than ``importlib.resources.files()``: wheels always install unpacked, the
    folder is a namespace package (where ``files()`` gives no real path), and torch, Qt and the
    checkpoint scanner all need real files.
    """
    bundle = frozen_root()
    if bundle is not None:
        return bundle / "resources"
    package = Path(__file__).resolve().parents[1]  # desktop/, this module being desktop/config/
    installed = package / "resources"
    return installed if installed.is_dir() else package.parent / "resources"


def resource_path(name: str | os.PathLike[str]) -> Path:
    """A file or folder in the resources folder (see ``resources_root``), by its relative name.

    Absolute names and ``..`` are refused, so a name read from a file or a setting cannot point
    outside the app's own resources.
    """
    rel = PurePath(name)
    if rel.is_absolute() or rel.anchor or ".." in rel.parts:
        raise ValueError(f"resource name must be relative without '..': {name!s}")
    return resources_root() / rel


def demo_checkpoint() -> Path | None:
    """The bundled demo checkpoint folder, or None when this installation lacks it."""
    path = resource_path(DEMO_DIR)
    return path if path.is_dir() else None


def demo_runs() -> list[Path]:
    """The bundled demo's runs: the chat model first, then the smaller depth of its miniseries
    (trained on the same data with the same tokenizer: a draft for speculative decoding)."""
    demo = demo_checkpoint()
    if demo is None:
        return []
    return [demo, *sorted(p for p in demo.parent.iterdir() if p.is_dir() and p != demo)]


def is_demo(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is the bundled demo checkpoint (however it is spelled)."""
    demo = demo_checkpoint()
    return demo is not None and Path(path).resolve() == demo.resolve()
