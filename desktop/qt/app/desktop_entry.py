"""``nanoscope --install-desktop-entry``: put Nanoscope in the Linux application launcher.

Writes ``nanoscope.desktop`` into ``$XDG_DATA_HOME/applications`` and the icon into the user's
``hicolor`` theme, following the freedesktop.org Desktop Entry and Icon Theme specs. The launcher
runs *this* installation (the frozen executable, or the venv's ``nanoscope`` script), so it keeps
working when several copies are installed side by side.

The keys live in ``resources/linux/nanoscope.desktop.in`` (shared with distribution packages,
and shipped with every installation as a resource); this module only fills in the command.
No Qt and no torch here: it must run instantly and headless.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from desktop.config.paths import resource_path
from desktop.engine.errors import NanoscopeError

APP_ID = "nanoscope"  # the .desktop basename; gui/app.py passes it to QApplication.setDesktopFileName
TEMPLATE = f"linux/{APP_ID}.desktop.in"  # a resource_path() name
# hicolor's index.theme defines fixed-size folders up to 512 px; bigger files would never be used.
ICON_SIZES = (16, 32, 48, 64, 128, 256, 512)

# Characters that force an Exec argument into double quotes (Desktop Entry spec, "The Exec key").
_EXEC_RESERVED = frozenset(" \t\n\"'\\><~|&;$*?#()`")


def xdg_data_home() -> Path:
    """``$XDG_DATA_HOME``, or ``~/.local/share`` when unset or not absolute (as the spec says)."""
    env = os.environ.get("XDG_DATA_HOME", "")
    return Path(env) if os.path.isabs(env) else Path.home() / ".local" / "share"


def launch_command() -> tuple[list[str], Path, Path | None]:
    """(argv that starts this installation, its executable for TryExec, working dir or None).

    A frozen app is its own executable. A pip/venv install has the ``nanoscope`` console script
    next to the interpreter. A bare source checkout has neither, so the launcher runs
    ``python -m desktop`` from the checkout folder.
    """
    exe = Path(sys.executable).absolute()  # absolute, not resolved: a venv's python is a symlink
    if getattr(sys, "frozen", False):
        return [str(exe)], exe, None
    script = exe.parent / APP_ID
    if script.is_file():
        return [str(script)], script, None
    # Run from the folder holding the ``desktop`` package, so ``-m desktop`` finds it.
    return [str(exe), "-m", "desktop"], exe, Path(__file__).resolve().parents[3]


def _escape_string(value: str) -> str:
    r"""Escape a value of type *string*: backslash first, then the control characters."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def exec_quote(arg: str) -> str:
    """One argument for the ``Exec`` key, quoted per the Desktop Entry spec.

    Arguments with reserved characters go in double quotes with ``"`$\\`` backslash-escaped;
    a literal ``%`` is ``%%``. The string-level escaping is applied on top, which is why one
    backslash in a quoted path ends up as four in the file.
    """
    arg = arg.replace("%", "%%")
    if not arg or any(c in _EXEC_RESERVED for c in arg):
        arg = '"' + "".join("\\" + c if c in '"`$\\' else c for c in arg) + '"'
    return _escape_string(arg)


def render_desktop_file(argv: list[str], try_exec: Path, workdir: Path | None = None) -> str:
    """The ``.desktop`` text for a launcher that runs ``argv``."""
    template = resource_path(TEMPLATE)
    try:
        text = template.read_text(encoding="utf-8")
    except OSError as exc:
        raise NanoscopeError(f"{template}: cannot read the desktop entry template ({exc.strerror})") from None
    text = text.replace("@EXEC@", " ".join(exec_quote(a) for a in argv))
    text = text.replace("@TRYEXEC@", _escape_string(str(try_exec)))
    if workdir is not None:
        text = text.rstrip("\n") + f"\nPath={_escape_string(str(workdir))}\n"
    return text


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` in one step, so a launcher never reads a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def install_desktop_entry(apps_dir: Path | None = None, icons_dir: Path | None = None) -> list[Path]:
    """Write the launcher and its icons; return the files written.

    ``apps_dir`` defaults to ``$XDG_DATA_HOME/applications``; ``icons_dir`` is the icon-theme
    base and defaults to ``$XDG_DATA_HOME/icons`` (icons go in ``hicolor/<n>x<n>/apps/``).
    Running it again overwrites the same files, e.g. after moving the installation.
    """
    if sys.platform == "darwin" or sys.platform.startswith("win"):
        raise NanoscopeError("--install-desktop-entry is for Linux desktops; use the packaged app instead")
    apps_dir = apps_dir if apps_dir is not None else xdg_data_home() / "applications"
    icons_dir = icons_dir if icons_dir is not None else xdg_data_home() / "icons"

    sources = {
        Path(f"{n}x{n}") / "apps" / f"{APP_ID}.png": resource_path(f"icons/{APP_ID}-{n}.png")
        for n in ICON_SIZES
    }
    sources[Path("scalable") / "apps" / f"{APP_ID}.svg"] = resource_path(f"icons/{APP_ID}.svg")
    missing = [str(src) for src in sources.values() if not src.is_file()]
    if missing:
        raise NanoscopeError(f"{missing[0]}: icon missing from this installation ({len(missing)} missing)")

    argv, try_exec, workdir = launch_command()
    desktop_file = apps_dir / f"{APP_ID}.desktop"
    _write_atomic(desktop_file, render_desktop_file(argv, try_exec, workdir).encode("utf-8"))
    written = [desktop_file]
    for rel, src in sources.items():
        dest = icons_dir / "hicolor" / rel
        _write_atomic(dest, src.read_bytes())
        written.append(dest)
    return written
