"""File › Export to Hugging Face…: run :func:`~desktop.engine.export.hf_export.export_to_hf` off the GUI
thread and report the outcome as a banner notice.

The export loads the checkpoint, writes the folder and loads it back twice to compare logits, so
it takes seconds to minutes; it runs on a daemon thread (torch never runs on the GUI thread) and
``done`` is emitted from there, which Qt delivers to the window's thread as a queued call.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError, is_out_of_memory

logger = logging.getLogger(__name__)

TITLE = "Export to Hugging Face"


class HFExportTask(QObject):
    """Signal: done(level, title, message), level "info" or "error"."""

    done = Signal(str, str, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, directory: Path, step: int | None, out: Path, base_dir: Path | None) -> bool:
        """Begin exporting ``directory`` at ``step`` to ``out``; False when one is already running."""
        if self.running():
            return False
        options = LoadOptions(step=step, base_dir=base_dir)
        self._thread = threading.Thread(
            target=self._run, args=(Path(directory), Path(out), options), name="hf-export", daemon=True
        )
        self._thread.start()
        return True

    def _run(self, directory: Path, out: Path, options: LoadOptions) -> None:
        from desktop.engine.export.hf_export import export_to_hf

        try:
            report = export_to_hf(directory, out, options)
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
