"""The Run tab's report card: what needs the disk (the config, each step's weights hash) is read
off the GUI thread; the curves are drawn on it (they are the tab's own plots), then the Markdown
is written next to them.

Hashing reads every byte of every step's weights, seconds per GB, so it runs on a thread and
Stop (a new report, or quitting) ends it between files; the card then says which hashes are
missing rather than waiting for them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from desktop.engine.errors import NanoscopeError
from desktop.engine.runs.evals import Sample
from desktop.engine.runs.report import RunReport, StepKey, report_markdown, run_config, step_hashes
from desktop.engine.runs.timeline import Timeline
from desktop.qt.jobs.stoppable_job import StoppableJob

logger = logging.getLogger(__name__)
REPORT_NAME = "report.md"

# Draws the tab's curves into a folder: (metric, PNG file name) for each.
PlotDrawer = Callable[[Path], list[tuple[str, str]]]


@dataclass
class _Gathered:
    folder: Path
    timeline: Timeline
    samples: Sequence[Sample]
    scores: Mapping[str, Mapping[StepKey, float]]
    config: dict[str, object] = field(default_factory=dict)
    hashes: dict[StepKey, str] = field(default_factory=dict)


class RunReportTask(QObject):
    """Signals: finished(message): where the card was written, or why it was not. ``samples``
    are (stage, step, prompt, text) as the Run tab's sweep showed them."""

    finished = Signal(str)
    _gathered = Signal(object)  # from the thread to the GUI thread (a queued call)

    def __init__(self, draw_plots: PlotDrawer, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._draw_plots = draw_plots
        self._job = StoppableJob()
        self._gathered.connect(self._write)

    def running(self) -> bool:
        return self._job.running()

    def start(
        self,
        folder: Path,
        timeline: Timeline,
        samples: Sequence[tuple[str, int, str, str]] = (),
        scores: Mapping[str, Mapping[StepKey, float]] | None = None,
    ) -> bool:
        said = [Sample(stage, step, prompt, (), text) for stage, step, prompt, text in samples]
        job = _Gathered(Path(folder), timeline, said, dict(scores or {}))
        return self._job.start("run-report", lambda cancel: self._gather(job, cancel))

    def stop(self, wait: float = 0.0) -> None:
        self._job.stop(wait)

    def _gather(self, job: _Gathered, cancel: threading.Event) -> None:
        try:
            job.config = run_config(job.timeline)
            job.hashes = step_hashes(job.timeline, cancel)
        except NanoscopeError as exc:
            self.finished.emit(f"No report: {exc}")
            return
        self._gathered.emit(job)

    def _write(self, job: _Gathered) -> None:
        try:
            job.folder.mkdir(parents=True, exist_ok=True)
            plots = self._draw_plots(job.folder)
            card = report_markdown(
                RunReport(job.timeline, plots, job.hashes, job.scores, job.samples, job.config)
            )
            path = job.folder / REPORT_NAME
            path.write_text(card, encoding="utf-8")
        except OSError as exc:
            logger.warning("report card not written: %s", exc)
            self.finished.emit(f"No report: {job.folder}: {exc.strerror or exc}")
            return
        missing = len(job.timeline.points) - len(job.hashes)
        note = f" ({missing} steps without a hash: stopped)" if missing else ""
        self.finished.emit(f"Report card written: {path}, {len(plots)} curves{note}")
