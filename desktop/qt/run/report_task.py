"""The Run tab's report card: what needs the disk (the config, each step's weights hash) is read
off the GUI thread; the curves are drawn on it (they are the tab's own plots), then the Markdown
is written next to them.

Hashing reads every byte of every step's weights, seconds per GB, so it runs on a thread and
Stop (a new report, or quitting) ends it between files; the card then says which hashes are
missing rather than waiting for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from desktop.engine.errors import NanoscopeError
from desktop.engine.runs.evals import Sample
from desktop.engine.runs.report import RunReport, StepKey, report_markdown, run_config, step_hashes
from desktop.engine.runs.timeline import Timeline
from desktop.qt.jobs.runner import Job, Run

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

    def __init__(self, draw_plots: PlotDrawer, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._draw_plots = draw_plots
        self._job = Job("run-report", self)

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
        return self._job.start(
            lambda run: _gather(job, run),
            done=self._write,
            failed=lambda line: self.finished.emit(f"No report: {line}"),
        )

    def stop(self, wait: float = 0.0) -> None:
        self._job.stop(wait)

    def _write(self, job: _Gathered | str) -> None:
        """On the GUI thread: draw the curves and write the card (or say why there is none)."""
        if isinstance(job, str):
            self.finished.emit(job)
            return
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


def _gather(job: _Gathered, run: Run) -> _Gathered | str:
    """On the job's thread: what the card needs from the disk, or why there is no card."""
    try:
        job.config = run_config(job.timeline)
        job.hashes = step_hashes(job.timeline, run.cancel)
    except NanoscopeError as exc:
        return f"No report: {exc}"
    return job
