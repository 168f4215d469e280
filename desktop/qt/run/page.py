"""The Run page: the Run view over its session, the sweeps and the report card that work for it
off the GUI thread, and their shutdown. The window only routes the page's hand-offs (a step to
Chat, steps or a flipped question to Compare) and asks the page to shut down.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from desktop.engine.runs.timeline import Point, Timeline
from desktop.qt.app.background import Background
from desktop.qt.run.report_task import RunReportTask
from desktop.qt.run.sweep_task import BitsSweepTask, CoreSweepTask, GradedSweepTask, SampleSweepTask
from desktop.qt.run.view import CORE_LITE, RunView
from desktop.session.run import RunSession

SHUTDOWN_WAIT = 30.0  # seconds each job gets to end after the item in hand


class RunPage(QWidget):
    """Signals (the hand-offs): open_step(Path, int) a step to chat with; compare_steps(list of
    (Path, int)) steps to race in Compare; compare_question(list, str) two steps and a question."""

    open_step = Signal(object, int)
    compare_steps = Signal(list)
    compare_question = Signal(list, str)

    def __init__(self, background: Background, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = RunSession()
        self.run_view = RunView(self.session)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.run_view)
        self.sample_sweep = SampleSweepTask(self)
        self.graded_sweep = GradedSweepTask(self)
        self.bits_sweep = BitsSweepTask(self)
        self.core_sweep = CoreSweepTask(self)
        self.run_report = RunReportTask(self.run_view.save_plots, self)
        self._background = background
        self._first_read = False  # a run's first read is under way
        self._connect(background)

    def _connect(self, bg: Background) -> None:
        session, view = self.session, self.run_view
        bg.checkpoints_found.connect(view.set_entries)
        session.events.run_chosen.connect(self._read)
        bg.runs_changed.connect(self._read_again)
        bg.timeline_ready.connect(self._read_first)
        bg.timeline_grown.connect(self._grown)
        bg.timeline_failed.connect(self._failed)
        view.open_step.connect(self.open_step)
        view.compare_steps.connect(self.compare_steps)
        view.compare_question.connect(self.compare_question)
        sweep = self.sample_sweep
        view.samples_wanted.connect(sweep.start)
        view.samples_stopped.connect(sweep.stop)
        sweep.sample.connect(session.add_sample)
        sweep.progress.connect(view.show_sweep_progress)
        sweep.finished.connect(view.sweep_done)
        view.report_wanted.connect(self._write_report)
        view.eval_wanted.connect(self._evaluate)
        for task in (self.graded_sweep, self.bits_sweep, self.core_sweep):
            view.eval_stopped.connect(task.stop)
            task.progress.connect(view.show_eval_progress)
            task.scored.connect(session.record_scores)
            task.kept.connect(session.note_kept)
            task.finished.connect(view.eval_done)
        self.graded_sweep.questions.connect(lambda questions, _problems: session.set_questions(questions))
        self.graded_sweep.questions.connect(view.say_problems)
        self.graded_sweep.flipped.connect(session.record_flips)
        self.run_report.finished.connect(view.report_done)

    def _read(self, folder: Path) -> None:
        """A run was chosen: its timeline is read, and its logs watched as it trains."""
        self._first_read = True  # until it lands, the last run's timeline is not read again
        self._background.read_timeline(folder)
        self._background.watch_run(folder)

    def _read_first(self, timeline: Timeline) -> None:
        self._first_read = False
        self.session.show_timeline(timeline)

    def _read_again(self) -> None:
        """The watched folders changed: the run shown is read again (its new steps, its logs)."""
        if self.session.run is not None and self.session.timeline is not None and not self._first_read:
            self._background.read_timeline(self.session.run, again=True)

    def _failed(self, folder: Path, message: str) -> None:
        self._first_read = False
        self.session.show_problem(folder, message)

    def _grown(self, folder: Path, timeline: Timeline) -> None:
        if self.session.run == Path(folder):
            self.session.grow_timeline(timeline)

    def _write_report(self, folder: Path) -> None:
        inputs = self.session.report_inputs()
        if inputs is None or not self.run_report.start(folder, *inputs):
            self.run_view.report_done("A report card is being written; wait for it to finish.")

    def _evaluate(self, kind: str, points: list[Point], data: Path | None) -> None:
        if kind.startswith("core"):
            started = self.core_sweep.start(points, data, CORE_LITE if kind == "core-lite" else None)
        elif kind == "bpb" and data is not None:
            started = self.bits_sweep.start(points, data)
        else:
            started = self.graded_sweep.start(points, data, kind)
        if not started:
            self.run_view.eval_done("another evaluation is running")

    def shutdown(self) -> None:
        """Stop every job of the page, each after the item in hand."""
        self.sample_sweep.stop(wait=SHUTDOWN_WAIT)  # after the prompt being written
        self.graded_sweep.stop(wait=SHUTDOWN_WAIT)  # after the question in hand
        self.bits_sweep.stop(wait=SHUTDOWN_WAIT)  # after the window in hand
        self.core_sweep.stop(wait=SHUTDOWN_WAIT)  # after the example in hand
        self.run_report.stop(wait=SHUTDOWN_WAIT)  # between two chunks of a file
