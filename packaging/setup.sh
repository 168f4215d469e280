#!/usr/bin/env bash
# Set up a local virtualenv and either launch Nanoscope or run its tests.
#   bash packaging/setup.sh run [nanoscope args...]   # set up + launch the app
#   bash packaging/setup.sh test [pytest args...]     # set up + run the test suite
# Idempotent: a second run reuses .venv and only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
shift || true
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true

# torch first, pinned, so the unpinned range in pyproject never pulls a multi-GB CUDA build by
# accident. On Linux dev/CI machines a local CPU wheel of this version is found first.
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  "$VPY" -m pip install -q "torch==${NANOSCOPE_TORCH_VERSION:-2.13.0}"
fi

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
    "$VPY" -m pip install -q -e .
    need_x11_libs
    exec .venv/bin/nanoscope "$@"
    ;;
  test)
    "$VPY" -m pip install -q -e ".[test]"
    export QT_QPA_PLATFORM=offscreen
    exec "$VPY" -m pytest -q "$@"
    ;;
  *)
    echo "usage: bash packaging/setup.sh run|test [args...]" >&2
    exit 2
    ;;
esac
