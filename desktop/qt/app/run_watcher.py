"""Noticing that runs on disk changed while the window is open (a step saved, a log grown).

Two ways, so that a step appears within seconds wherever the files are:

* the OS's notifications through Qt's :class:`QFileSystemWatcher` (inotify on Linux, FSEvents or
  kqueue on macOS): a folder gains or loses an entry, a watched file is written;
* a slow poll of the same paths' sizes and modification times, for filesystems notifications do
  not reach (NFS, SMB, FUSE mounts, a folder written by another machine). Its ``stat`` s run on a
  job's thread, so a hung network mount never stalls the window.

Both end in ``changed``, debounced: a save that writes five files is one rescan. While a step is
still settling, ``look_again_in`` asks for a look once it should have settled (a file that keeps
its name but grows gives a folder no event).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from PySide6.QtCore import QFileSystemWatcher, QObject, QTimer, Signal

from desktop.qt.jobs.runner import Job, Run

POLL_S = 5.0  # the fallback's period: a step saved on a network mount appears within it
DEBOUNCE_S = 0.3  # events this close together are one change
MAX_WATCHED = 4096  # paths given to the OS (inotify's per-user limit is shared with other apps)

Fingerprint = dict[str, tuple[int, int]]  # path -> (mtime_ns, size); (-1, -1) when absent


def fingerprint(paths: Iterable[str]) -> Fingerprint:
    """What the poll compares: each path's modification time and size."""
    found: Fingerprint = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            found[path] = (-1, -1)
        else:
            found[path] = (st.st_mtime_ns, st.st_size)
    return found


class RunWatcher(QObject):
    """Signals: changed() once the watched folders or files changed (debounced)."""

    changed = Signal()

    def __init__(self, parent: QObject | None = None, poll_s: float = POLL_S) -> None:
        super().__init__(parent)
        self._os = QFileSystemWatcher(self)
        self._os.directoryChanged.connect(self._soon)
        self._os.fileChanged.connect(self._soon)
        self._paths: list[str] = []
        self._seen: Fingerprint = {}
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(round(DEBOUNCE_S * 1000))
        self._debounce.timeout.connect(self.changed)
        self._settle = QTimer(self)
        self._settle.setSingleShot(True)
        self._settle.timeout.connect(self.changed)
        self._poll = QTimer(self)
        self._poll.setInterval(round(poll_s * 1000))
        self._poll.timeout.connect(self._poll_now)
        self._poll_job = Job("watch-poll", self, latest_wins=True)

    def watch(self, paths: Iterable[Path], seen: Fingerprint | None = None) -> None:
        """Watch exactly ``paths`` (folders and files) from now on; ``seen``: their fingerprint
        as the scan that listed them found it (the poll's starting point)."""
        wanted = list(dict.fromkeys(str(p) for p in paths))[:MAX_WATCHED]
        if wanted != self._paths:
            old = set(self._paths)
            gone = [p for p in self._paths if p not in set(wanted)]
            if gone:
                self._os.removePaths(gone)
            new = [p for p in wanted if p not in old and os.path.exists(p)]
            if new:
                self._os.addPaths(new)  # paths the OS cannot watch are left to the poll
            self._paths = wanted
        if seen is not None:
            self._seen = {p: seen[p] for p in wanted if p in seen}
        if not self._poll.isActive():
            self._poll.start()

    def watched(self) -> list[str]:
        """The paths the OS notifies about (the others are polled only)."""
        return self._os.directories() + self._os.files()

    def look_again_in(self, seconds: float) -> None:
        """A step is settling: look again once it should have (unless a look comes sooner)."""
        if not self._settle.isActive():
            self._settle.start(max(1, round(seconds * 1000)))

    def stop(self) -> None:
        self._poll.stop()
        self._settle.stop()
        self._debounce.stop()
        self._poll_job.stop()

    def _soon(self, _path: str = "") -> None:
        self._debounce.start()

    def _poll_now(self) -> None:
        paths, before = list(self._paths), dict(self._seen)
        if paths:
            self._poll_job.start(lambda run: self._compare(paths, before, run))

    def _compare(self, paths: list[str], before: Fingerprint, run: Run) -> None:
        now = fingerprint(paths)
        if now != before:
            run.post(self._polled, now)

    def _polled(self, now: Fingerprint) -> None:
        self._seen = now
        self._soon()
