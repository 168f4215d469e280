"""Is there a screen to open a window on? Asked before Qt starts.

On Linux with neither ``DISPLAY`` nor ``WAYLAND_DISPLAY`` set (an ssh session, a container, a
server), Qt's xcb plugin aborts the process with a paragraph about plugins. The app says one line
instead; the smoke test, which needs no screen, runs offscreen.
"""

from __future__ import annotations

import os
import sys

from desktop.engine.errors import NanoscopeError

NO_SCREEN = (
    "no screen to open a window on (DISPLAY and WAYLAND_DISPLAY are unset); "
    "run it from a desktop session or with ssh -X, or use `nanoscope generate` in a terminal"
)


def has_screen() -> bool:
    """macOS and Windows always have one; on Linux an X or Wayland display, or a Qt platform named."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.environ.get(name) for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"))


def ensure_screen(smoke: bool) -> None:
    """Raise the one-line error when there is no screen; the smoke test goes offscreen instead."""
    if has_screen():
        return
    if smoke:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        return
    raise NanoscopeError(NO_SCREEN)
