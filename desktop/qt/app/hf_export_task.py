"""File › Export to Hugging Face…: run :func:`~desktop.engine.export.hf_export.export_to_hf` off the GUI
thread and report the outcome as a banner notice.

The export loads the checkpoint, writes the folder and loads it back twice to compare logits, so
it takes seconds to minutes; it runs on a thread of its own (torch never runs on the GUI thread)
and ``done`` is emitted from there, which Qt delivers to the window's thread as a queued call.
Stop (quitting) ends it at the next of its stages and removes what it wrote.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError, is_out_of_memory
from desktop.qt.jobs.stoppable_job import StoppableJob

logger = logging.getLogger(__name__)

TITLE = "Export to Hugging Face"


class HFExportTask(QObject):
    """Signal: done(level, title, message), level "info" or "error"."""

    done = Signal(str, str, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._job = StoppableJob()

    def running(self) -> bool:
        return self._job.running()

    def start(self, directory: Path, step: int | None, out: Path, base_dir: Path | None) -> bool:
        """Begin exporting ``directory`` at ``step`` to ``out``; False when one is already running."""
        options = LoadOptions(step=step, base_dir=base_dir)
        return self._job.start(
            "hf-export", lambda cancel: self._run(Path(directory), Path(out), options, cancel)
        )

    def stop(self, wait: float = 0.0) -> None:
        self._job.stop(wait)

    def _run(self, directory: Path, out: Path, options: LoadOptions, cancel: threading.Event) -> None:
        from desktop.engine.export.hf_export import export_to_hf

        try:
            report = export_to_hf(directory, out, options, cancel=cancel)
        except NanoscopeError as exc:
            self.done.emit("error", TITLE, str(exc))
        except (MemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc):
                logger.exception("export of %s failed", directory)
                self.done.emit("error", TITLE, f"the export failed: {exc}")
            else:
                self.done.emit("error", TITLE, "out of memory while exporting; close other models first")
        else:
            logger.info("%s", report.summary())
            self.done.emit("info", TITLE, report.summary())
