"""Whether the checkpoints picked in Compare fit in memory, checked off the GUI thread.

Each checkpoint's shape summary is read once, on a job's thread (``qt/jobs/runner.py``), and kept;
the check runs when every summary it needs is known, so picking a checkpoint never waits for its
file.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from desktop.config.settings import Settings
from desktop.engine.discovery import CheckpointSummary, summarize
from desktop.engine.kernels import memory
from desktop.qt.jobs.runner import Job, Run

Key = tuple[Path, int]  # a checkpoint folder and its step
# The checkpoints of every pane: those picked, and those loaded (a loaded one holds its memory
# until the pick replacing it loads), and the copies of a pane's checkpoint that other panes load
# as their draft.
Picked = Callable[[], tuple[list[Key], list[Key], list[Key]]]

# How long closing Compare waits for the summary being read (a file open and its header).
SHUTDOWN_WAIT_S = 30.0


class MemoryCheck(QObject):
    """Checks the panes' checkpoints against free memory (GUI thread).

    Signals:
        checked(bool, str): whether the selected checkpoints fit, and a message if not.
    """

    checked = Signal(bool, str)

    def __init__(self, settings: Settings, picked: Picked, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self._picked = picked
        self.last: tuple[bool, int, int, str] | None = None
        self._summaries: dict[Key, CheckpointSummary] = {}
        self._job = Job("compare-summary", self)

    def check(self) -> None:
        """Estimate the memory of every pane's selected checkpoint against what is free (async)."""
        selection, loaded_keys, draft_keys = self._picked()
        keys = set(selection) | set(loaded_keys) | set(draft_keys)
        missing = [k for k in keys if k not in self._summaries]
        if missing:
            # While a read is going this start is refused; its end checks again, and reads
            # what was picked meanwhile.
            self._job.start(partial(_read, missing), done=self._on_read)
            return
        selected = [self._summaries[k] for k in selection]
        loaded = [self._summaries[k] for k in loaded_keys]
        drafts = [self._summaries[k] for k in draft_keys]
        self.last = memory.fits(
            selected, self.settings.get("device"), self.settings.get("dtype"), loaded=loaded, drafts=drafts
        )
        ok, _needed, _available, message = self.last
        self.checked.emit(ok, message)

    def shutdown(self) -> None:
        """Wait for the summary being read; read no more, and check no more."""
        self._job.close(SHUTDOWN_WAIT_S)

    def _on_read(self, summaries: dict[Key, CheckpointSummary]) -> None:
        self._summaries.update(summaries)
        self.check()


def _read(keys: list[Key], run: Run) -> dict[Key, CheckpointSummary]:
    """On the job's thread: each checkpoint's summary, until Stop."""
    return {key: summarize(*key) for key in keys if not run.stopped()}
