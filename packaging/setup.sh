#!/usr/bin/env bash
# Set up a local virtualenv and either launch Nanoscope or run its tests.
#   bash packaging/setup.sh run [nanoscope args...]   # set up + launch the app
#   bash packaging/setup.sh test [pytest args...]     # set up + run the test suite
#   bash packaging/setup.sh check                     # set up + lint, format check, type check
# Idempotent and quick the second time: .venv is reused, and `pip install -e` runs only when
# pyproject.toml changed since the last install (a stamp in .venv holds its hash) or the venv's
# `desktop` is not this checkout's (a moved or copied folder).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
shift || true
PY=${PYTHON:-python3}
VPY=.venv/bin/python
if [ ! -x "$VPY" ]; then
  "$PY" -m venv .venv
  "$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
fi

# torch first, pinned, so the unpinned range in pyproject never pulls a multi-GB CUDA build by
# accident. On Linux dev/CI machines a local CPU wheel of this version is found first. find_spec,
# not `import torch`: the check must not cost the second of an import on every launch.
if ! "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"; then
  "$VPY" -m pip install -q "torch==${NANOSCOPE_TORCH_VERSION:-2.13.0}"
fi

# pyproject.toml decides everything an install holds (dependencies, entry points, package data).
pyproject_hash() {
  if command -v sha256sum >/dev/null; then sha256sum pyproject.toml; else shasum -a 256 pyproject.toml; fi | cut -d" " -f1
}

# True when the last `setup.sh $1` install (run or test) was for this pyproject.toml and this
# checkout. -I keeps the current folder off sys.path, so `desktop` is found the way the
# installed app finds it.
installed() {
  local stamp=.venv/nanoscope-$1.stamp
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(pyproject_hash)" ] || return 1
  "$VPY" -I -c 'import pathlib, sys, desktop
sys.exit(pathlib.Path(desktop.__file__).resolve().parent != pathlib.Path(sys.argv[1]).resolve())' \
    "$PWD/desktop" 2>/dev/null
}

# `pip install -e $2` for mode $1 unless already done; a test install has all that run needs.
ensure_installed() {
  if installed "$1" || { [ "$1" = run ] && installed test; }; then
    return 0
  fi
  "$VPY" -m pip install -q -e "$2"
  pyproject_hash >".venv/nanoscope-$1.stamp"
}

# Qt's X11 plugin needs a few xcb libraries that minimal systems lack (libxcb-cursor0 since
# Qt 6.5, libxcb-icccm4, libxcb-keysyms1, ...). Ask ldd which are missing and install those.
need_x11_libs() {
  [ "$(uname -s)" = Linux ] && [ -n "${DISPLAY:-}" ] || return 0
  plugin=$("$VPY" -c "import pathlib, PySide6; print(pathlib.Path(PySide6.__file__).parent / 'Qt/plugins/platforms/libqxcb.so')" 2>/dev/null) || return 0
  [ -f "$plugin" ] || return 0
  missing=$(ldd "$plugin" 2>/dev/null | awk '/not found/ {print $1}' | sort -u)
  [ -n "$missing" ] || return 0
  # Debian names: libxcb-icccm.so.4 -> libxcb-icccm4, libxkbcommon-x11.so.0 -> libxkbcommon-x11-0
  pkgs=$(echo "$missing" | sed -E 's/\.so\.([0-9]+)$/ \1/' | awk '{ if ($1 ~ /[0-9]$/) print $1 "-" $2; else print $1 $2 }')
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q $pkgs >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1; apt-get install -y -q $pkgs >/dev/null 2>&1; } \
      || echo "note: could not install $pkgs; the window may not open" >&2
  else
    echo "note: Qt's X11 plugin needs: $pkgs (e.g. sudo apt install $pkgs)" >&2
  fi
}

case "$mode" in
  run)
    ensure_installed run .
    need_x11_libs
    exec .venv/bin/nanoscope "$@"
    ;;
  test)
    ensure_installed test ".[test]"
    export QT_QPA_PLATFORM=offscreen
    # One pytest-xdist worker per CPU this process may use, at most 4: each holds torch and the
    # models of its tests (~1 GB), and past 4 the suite's longest tests set its time. Files are
    # shared out test by test, idle workers taking from busy ones (worksteal). `-n 0` runs serially.
    workers=$("$VPY" -c 'import os; n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(); print(max(1, min(4, n or 1)))')
    exec "$VPY" -m pytest -q -n "$workers" --dist worksteal "$@"
    ;;
  check)
    # What CI runs before the tests: lint, formatting and the type checker.
    ensure_installed test ".[test]"
    "$VPY" -m ruff check .
    "$VPY" -m ruff format --check .
    "$VPY" -m mypy
    ;;
  *)
    echo "usage: bash packaging/setup.sh run|test|check [args...]" >&2
    exit 2
    ;;
esac
