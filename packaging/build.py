"""Build the frozen Nanoscope app with PyInstaller, from the current virtualenv.

    .venv/bin/python packaging/build.py [--clean] [--smoke-test]

Installs PyInstaller into this interpreter's environment when it is missing, runs
``packaging/nanoscope.spec`` with ``build/`` as the work folder and ``dist/`` as the output, and
prints the size of the result. ``--smoke-test`` then runs ``packaging/smoke_test.py`` on it.
Run it on the OS you are building for: PyInstaller does not cross-compile.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "packaging" / "nanoscope.spec"
BUILD_DIR = ROOT / "build"
DIST_DIR = ROOT / "dist"
PYINSTALLER_REQUIREMENT = "pyinstaller>=6.10"


def frozen_executable(dist: Path = DIST_DIR) -> Path:
    """The executable the spec produces: inside the .app on macOS, in the onedir folder elsewhere."""
    if sys.platform == "darwin":
        return dist / "Nanoscope.app" / "Contents" / "MacOS" / "nanoscope"
    return dist / "nanoscope" / ("nanoscope.exe" if sys.platform == "win32" else "nanoscope")


def tree_size(path: Path) -> int:
    """Bytes used by the files under ``path``; symlinks count as links, not as their targets."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        total += sum(os.lstat(os.path.join(dirpath, f)).st_size for f in files)
    return total


def ensure_pyinstaller() -> None:
    if importlib.util.find_spec("PyInstaller") is None:
        print(f"installing {PYINSTALLER_REQUIREMENT} into {sys.prefix}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", PYINSTALLER_REQUIREMENT], check=True)


def build(clean: bool = False) -> Path:
    """Run PyInstaller on the spec; return the output folder (the .app on macOS)."""
    ensure_pyinstaller()
    cmd = [
        sys.executable,
        "-m",
        "PyInstaller",
        "--noconfirm",
        "--distpath",
        str(DIST_DIR),
        "--workpath",
        str(BUILD_DIR),
        *(["--clean"] if clean else []),
        str(SPEC),
    ]
    print("running:", " ".join(cmd), flush=True)
    started = time.monotonic()
    subprocess.run(cmd, check=True, cwd=ROOT)
    out = DIST_DIR / ("Nanoscope.app" if sys.platform == "darwin" else "nanoscope")
    print(f"built {out} in {time.monotonic() - started:.0f} s: {tree_size(out) / 2**20:.0f} MiB")
    print(f"executable: {frozen_executable()}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clean", action="store_true", help="empty PyInstaller's cache and build/ first")
    parser.add_argument("--smoke-test", action="store_true", help="run packaging/smoke_test.py afterwards")
    args = parser.parse_args(argv)
    try:
        build(clean=args.clean)
    except subprocess.CalledProcessError as exc:
        print(f"build.py: {' '.join(exc.cmd[1:3])} failed (exit {exc.returncode})", file=sys.stderr)
        return 1
    if args.smoke_test:
        smoke = ROOT / "packaging" / "smoke_test.py"
        return subprocess.run([sys.executable, str(smoke), str(frozen_executable())], check=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
