"""Whether the checkpoints picked in Compare fit in memory, checked off the GUI thread.

Each checkpoint's shape summary is read once, on a thread of its own, and kept; the check runs
when every summary it needs is known, so picking a checkpoint never waits for its file.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from desktop.config.settings import Settings
from desktop.engine.discovery import CheckpointSummary, summarize
from desktop.engine.kernels import memory

Key = tuple[Path, int]  # a checkpoint folder and its step
# The checkpoints of every pane: those picked, and those loaded (a loaded one holds its memory
# until the pick replacing it loads), and the copies of a pane's checkpoint that other panes load
# as their draft.
Picked = Callable[[], tuple[list[Key], list[Key], list[Key]]]


class MemoryCheck(QObject):
    """Checks the panes' checkpoints against free memory (GUI thread).

    Signals:
        checked(bool, str): whether the selected checkpoints fit, and a message if not.
    """

    checked = Signal(bool, str)

    _summary_ready = Signal(object, object)  # from the summary thread: (path, step), summary

    def __init__(self, settings: Settings, picked: Picked, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self._picked = picked
        self.last: tuple[bool, int, int, str] | None = None
        self._summaries: dict[Key, CheckpointSummary] = {}
        self._summarizing: set[Key] = set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nanoscope-compare-summary")
        self._summary_ready.connect(self._on_summary)

    def check(self) -> None:
        """Estimate the memory of every pane's selected checkpoint against what is free (async)."""
        selection, loaded_keys, draft_keys = self._picked()
        keys = set(selection) | set(loaded_keys) | set(draft_keys)
        missing = [k for k in keys if k not in self._summaries]
        for key in missing:
            if key not in self._summarizing:
                self._summarizing.add(key)
                future = self._executor.submit(summarize, *key)
                future.add_done_callback(partial(self._summary_done, key))
        if missing:
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
        """Wait for the summary being read; drop those not started."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _summary_done(self, key: Key, future: Future) -> None:
        """On the summary thread: hand the result to the GUI thread (a queued signal)."""
        self._summary_ready.emit(key, _result(future))

    @Slot(object, object)
    def _on_summary(self, key: Key, summary: CheckpointSummary | None) -> None:
        self._summarizing.discard(key)
        if summary is not None:
            self._summaries[key] = summary
            self.check()


def _result(future: Future) -> CheckpointSummary | None:
    return None if future.cancelled() or future.exception() is not None else future.result()
