"""The Run tab's sample sweep off the GUI thread: :func:`~desktop.engine.runs.evals.sample_sweep` over
the chosen steps, one checkpoint at a time, each sample, the progress and the end reported as
signals (Qt delivers them to the window's thread as queued calls). Stop ends it after the prompt
being written; a new sweep waits for none: one runs at a time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from PySide6.QtCore import QObject, Signal

from desktop.config import paths
from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError, is_out_of_memory
from desktop.engine.runs.evals import SAMPLE_PROMPTS, sample_sweep
from desktop.engine.runs.timeline import Point

logger = logging.getLogger(__name__)


class SampleSweepTask(QObject):
    """Signals: sample(stage, step, prompt, text), progress(done, total), finished(error: "" when
    it completed or was stopped)."""

    sample = Signal(str, int, str, str)
    progress = Signal(int, int)
    finished = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, points: Sequence[Point], prompts: Sequence[str] = SAMPLE_PROMPTS) -> bool:
        if self.running() or not points:
            return False
        self._cancel = threading.Event()
        options = LoadOptions(base_dir=paths.nanochat_base_dir(), kernel_cache=paths.kernel_timings_file())
        self._thread = threading.Thread(
            target=self._run, args=(list(points), list(prompts), options), name="sample-sweep", daemon=True
        )
        self._thread.start()
        return True

    def stop(self, wait: float = 0.0) -> None:
        self._cancel.set()
        if wait and self._thread is not None:
            self._thread.join(wait)

    def _run(self, points: list[Point], prompts: list[str], options: LoadOptions) -> None:
        try:
            for sample in sample_sweep(
                points, prompts, options=options, cancel=self._cancel, progress=self.progress.emit
            ):
                self.sample.emit(sample.stage, sample.step, sample.prompt, sample.text)
        except NanoscopeError as exc:
            self.finished.emit(str(exc))
        except (MemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc):
                logger.exception("sample sweep failed")
                self.finished.emit(f"the sweep failed: {exc}")
            else:
                self.finished.emit("out of memory while loading a step; close other models first")
        else:
            self.finished.emit("")
