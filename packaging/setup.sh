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

# Qt's X11 plugin needs libxcb-cursor0 (Qt >= 6.5); install it where we can, for real windows.
if [ "$(uname -s)" = Linux ] && [ -n "${DISPLAY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q libxcb-cursor; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q libxcb-cursor0 >/dev/null 2>&1 || echo "note: could not install libxcb-cursor0" >&2
  else
    echo "note: install libxcb-cursor0 (e.g. sudo apt install libxcb-cursor0) if the window does not open" >&2
  fi
fi

case "$mode" in
  run)
    "$VPY" -m pip install -q -e .
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
