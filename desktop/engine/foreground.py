"""What the user is waiting on in the foreground, which background work (a model's compile,
engine/decode/compiled_draft.py) makes way for, and how a background thread steps aside.

Why: with nothing to do, a compile of the target's verifying passes kept a 2-core machine at
~55% CPU for minutes, and a reply streamed meanwhile ran at 5.7 tokens/s instead of ~100. So a
background compile runs on a thread at the lowest OS priority, and waits while a reply streams
(:func:`hold_background`, from the decode loop, so the CLI's replies hold it too) or while the
user types (:func:`set_foreground_busy`, from the chat's input box). Torch-free and Qt-free: the
window tells it what the user does, the compile's thread asks it whether to wait.

Measured (2-core AMD EPYC, other programs keeping the load near 3.5): the demo's replies drafted
by demo-d2 during a cold compile of its draft, once the compile was past its imports, streamed at
123-164 tokens/s before and 382-474 after (488-571 with no compile). In a compile's first
seconds it imports the compiler, where it cannot wait (an import holds a lock the reply's thread
may take): a reply then still ran at ~30 tokens/s.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_counts: dict[str, int] = {}  # reason -> holds under way (replies may stream side by side)
_flags: set[str] = set()  # reasons set busy until set idle (the user typing)
# Non-empty while anything holds: read on every call the compile's thread makes (a trace
# function), so a list's truth, not a function call.
HELD: list[bool] = []
_wakers: set[threading.Event] = set()  # the waits to end once nothing holds
_said_no_priority: list[bool] = []  # the log said once that this OS keeps the thread's priority


def _update() -> None:
    """HELD from the holds and flags (under ``_lock``); waits end when nothing holds."""
    held = any(_counts.values()) or bool(_flags)
    if held and not HELD:
        HELD.append(True)
        logger.debug("background work held (%s)", ", ".join(holding()))
    elif not held and HELD:
        HELD.clear()
        logger.debug("background work free to go on")
        for waker in _wakers:
            waker.set()


@contextmanager
def hold_background(reason: str) -> Iterator[None]:
    """Background work waits while this runs (``reason``: what the user waits on, e.g. a reply)."""
    with _lock:
        _counts[reason] = _counts.get(reason, 0) + 1
        _update()
    try:
        yield
    finally:
        with _lock:
            _counts[reason] -= 1
            _update()


def set_foreground_busy(reason: str, busy: bool) -> None:
    """Hold background work for ``reason`` (e.g. "typing") until called again with ``busy`` False;
    calling it twice with the same value changes nothing."""
    with _lock:
        if busy:
            _flags.add(reason)
        else:
            _flags.discard(reason)
        _update()


def holding() -> list[str]:
    """What holds background work now (empty when nothing does)."""
    return sorted({r for r, n in _counts.items() if n} | _flags)


def wait_while_held(wake: threading.Event) -> None:
    """Wait, on the calling thread, until nothing holds background work or ``wake`` is set (by a
    stop, from another thread; the caller clears it before it looks at what would set it);
    returns at once when nothing holds."""
    with _lock:
        if not HELD:
            return
        _wakers.add(wake)
    try:
        wake.wait()
    finally:
        with _lock:
            _wakers.discard(wake)


def lower_this_threads_priority() -> bool:
    """Put the calling thread (and what it starts: a C++ compiler, OpenMP's workers) at the lowest
    OS priority, never the whole process: on Linux its nice value (a thread's own there), on
    macOS its QoS class "background", on Windows THREAD_PRIORITY_IDLE. Whether it could; the log
    says once where it cannot."""
    try:
        if sys.platform.startswith("linux"):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            return True
        if sys.platform == "darwin":  # no per-thread nice; os.setpriority would name a process
            qos_class_background = 0x09
            libc = ctypes.CDLL("/usr/lib/libSystem.dylib")
            if int(libc.pthread_set_qos_class_self_np(qos_class_background, 0)) == 0:
                return True
            _say_once("background threads keep their priority: no QoS class for this thread")
            return False
        if sys.platform == "win32":
            kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
            thread_priority_idle = -15
            if kernel32.SetThreadPriority(kernel32.GetCurrentThread(), thread_priority_idle):
                return True
            _say_once("background threads keep their priority: SetThreadPriority failed")
            return False
    except (OSError, AttributeError) as exc:
        _say_once(f"background threads keep their priority here: {exc}")
        return False
    _say_once(f"background threads keep their priority on {sys.platform}")
    return False


def _say_once(line: str) -> None:
    if not _said_no_priority:
        _said_no_priority.append(True)
        logger.info("%s", line)
