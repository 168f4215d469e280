"""The Chat window tests drive the window with ``tests/qt/app/test_window_sequences.py``'s
helpers; its folder goes on the import path so a file here also runs on its own."""

import sys
from pathlib import Path

APP_TESTS = str(Path(__file__).resolve().parents[1] / "app")
if APP_TESTS not in sys.path:
    sys.path.insert(0, APP_TESTS)
