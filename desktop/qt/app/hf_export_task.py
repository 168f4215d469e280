"""File › Export to Hugging Face…: run :func:`~desktop.engine.export.hf_export.export_to_hf` off the GUI
thread and report the outcome as a banner notice.

The export loads the checkpoint, writes the folder and loads it back twice to compare logits, so
it takes seconds to minutes; it runs on a job's thread (``qt/jobs/runner.py``: torch never runs
on the GUI thread) and ``done`` is emitted on the window's thread once it ends.
Stop (quitting) ends it at the next of its stages and removes what it wrote.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError, is_out_of_memory
from desktop.qt.jobs.runner import Job, Run

logger = logging.getLogger(__name__)

TITLE = "Export to Hugging Face"


class HFExportTask(QObject):
    """Signal: done(level, title, message), level "info" or "error"."""

    done = Signal(str, str, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._job = Job("hf-export", self)

    def running(self) -> bool:
        return self._job.running()

    def start(self, directory: Path, step: int | None, out: Path, base_dir: Path | None) -> bool:
        """Begin exporting ``directory`` at ``step`` to ``out``; False when one is already running."""
        options = LoadOptions(step=step, base_dir=base_dir)
        return self._job.start(
            lambda run: _export(Path(directory), Path(out), options, run),
            done=lambda outcome: self.done.emit(*outcome),
            failed=lambda line: self.done.emit("error", TITLE, f"the export failed: {line}"),
        )

    def stop(self, wait: float = 0.0) -> None:
        self._job.stop(wait)


def _export(directory: Path, out: Path, options: LoadOptions, run: Run) -> tuple[str, str, str]:
    """On the job's thread: the export, and what the banner says of it (level, title, message)."""
    from desktop.engine.export.hf_export import export_to_hf

    try:
        report = export_to_hf(directory, out, options, cancel=run.cancel)
    except NanoscopeError as exc:
        return "error", TITLE, str(exc)
    except (MemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        return "error", TITLE, "out of memory while exporting; close other models first"
    logger.info("%s", report.summary())
    return "info", TITLE, report.summary()
