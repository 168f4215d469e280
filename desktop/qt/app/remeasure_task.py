"""Settings › Re-measure kernels: forget this machine's kernel choices (and speculative decoding's
kept decisions) off the GUI thread, then reload the chat's model so it times its products again.

A kernel choice is kept once made, so the same seed gives the same reply in any later session
(``engine/kernels/tuning.py``); this is the one way to time them again. Forgetting waits on the
tuner's lock, which a model being loaded holds while it times, so it runs on a job's thread.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal

from desktop.qt.jobs.runner import Job, Run

TITLE = "Re-measure kernels"


class RemeasureTask(QObject):
    """Signals: forgotten() once the choices are gone; failed(title, message) with one line."""

    forgotten = Signal()
    failed = Signal(str, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._job = Job("remeasure-kernels", self)

    def start(self, cache_file: Path) -> bool:
        """Forget the choices kept in ``cache_file``; False while a re-measure is already running."""
        return self._job.start(
            lambda run: _forget(cache_file, run),
            done=lambda _none: self.forgotten.emit(),
            failed=lambda line: self.failed.emit(TITLE, f"the kernel choices were kept: {line}"),
        )

    def stop(self, wait: float = 0.0) -> None:
        self._job.stop(wait)


def _forget(cache_file: Path, _run: Run) -> None:
    """On the job's thread (importing the tuner imports torch, which the GUI thread never does)."""
    from desktop.engine.kernels.tuning import remeasure

    remeasure(cache_file)
