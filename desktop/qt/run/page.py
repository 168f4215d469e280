"""The Run page: the Run view over its session, the sweeps and the report card that work for it
off the GUI thread, and their shutdown. The window only routes the page's hand-offs (a step to
Chat, steps or a flipped question to Compare) and asks the page to shut down.

It also runs the evaluation that follows the run as it trains (the session's ``follow``): each
step that lands is taken in hand once no evaluation or sample sweep of the user's runs, and
evaluated alone (with the step before it, for what flipped) by the same sweeps, gently (lowest
priority, waiting while the user chats, unless asked not to); its scores extend the task's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from desktop.engine.runs.timeline import Point, Timeline
from desktop.qt.app.background import Background
from desktop.qt.run.report_task import RunReportTask
from desktop.qt.run.sweep_task import (
    BitsSweepTask,
    CoreSweepTask,
    GradedSweepTask,
    SampleSweepTask,
    SweepTask,
)
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
        self._follower: SweepTask | None = None  # the sweep evaluating a step as it landed
        self._dropping = False  # the follower was stopped: what it still says is not kept
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
        sweep.progress.connect(lambda done, total: self._progress(view.show_sweep_progress, done, total))
        sweep.finished.connect(lambda error: self._finished(view.sweep_done, error))
        view.report_wanted.connect(self._write_report)
        view.eval_wanted.connect(self._evaluate)
        for task in (self.graded_sweep, self.bits_sweep, self.core_sweep):
            view.eval_stopped.connect(task.stop)
            task.progress.connect(lambda done, total: self._progress(view.show_eval_progress, done, total))
            task.scored.connect(self._scored)
            task.kept.connect(session.note_kept)
            task.finished.connect(lambda error: self._finished(view.eval_done, error))
        for each in (sweep, self.graded_sweep, self.bits_sweep, self.core_sweep):
            each.waiting.connect(session.follow_held)
        session.events.follow_changed.connect(self._follow)
        self.graded_sweep.questions.connect(lambda questions, _problems: session.set_questions(questions))
        self.graded_sweep.questions.connect(view.say_problems)
        self.graded_sweep.flipped.connect(self._flipped)
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
        if self._follower is not None or not self._start(kind, points, data):
            self.run_view.eval_done("another evaluation is running")

    def _sweep_of(self, kind: str) -> SweepTask:
        if kind == "samples":
            return self.sample_sweep
        if kind.startswith("core"):
            return self.core_sweep
        return self.bits_sweep if kind == "bpb" else self.graded_sweep

    def _start(self, kind: str, points: list[Point], data: Path | None, gentle: bool = False) -> bool:
        if kind == "samples":
            return self.sample_sweep.start(points, gentle=gentle)
        if kind.startswith("core"):
            lite = CORE_LITE if kind == "core-lite" else None
            return self.core_sweep.start(points, data, lite, gentle=gentle)
        if kind == "bpb":
            return data is not None and self.bits_sweep.start(points, data, gentle=gentle)
        return self.graded_sweep.start(points, data, kind, gentle=gentle)

    # ----- the evaluation that follows the run ------------------------------------------------

    def _follow(self) -> None:
        """Following changed: a pause (or following off, or another run) stops the step in hand
        after its item; a step waiting is taken in hand once no other sweep runs."""
        session, view = self.session, self.run_view
        follow = session.follow
        if self._follower is not None:
            self._follower.mind_chat(not session.even_while_chatting)
            if follow is None or follow.in_hand is None or follow.paused:
                self._dropping = True
                self._follower.stop()
            return
        if view.evaluating or view.sweeping or follow is None:
            return
        sweep = self._sweep_of(follow.evaluation.kind)
        if sweep.running():  # a stopped sweep of the user's still ending: its end calls again
            return
        points = session.next_to_follow()
        if not points:
            return
        sweep.mind_chat(not session.even_while_chatting)
        self._follower, self._dropping = sweep, False
        evaluation = follow.evaluation
        if not self._start(evaluation.kind, points, evaluation.data, gentle=True):
            self._follower = None
            session.followed("it could not start")

    def _scored(self, task: str, scores: dict) -> None:
        if self._follower is None:
            self.session.record_scores(task, scores)
        elif not self._dropping:  # (stopped by a pause: the step is asked again on resume)
            self.session.extend_scores(task, scores)

    def _flipped(self, earlier: tuple, later: tuple, lost: list, gained: list) -> None:
        if self._follower is None or not self._dropping:
            self.session.record_flips(earlier, later, lost, gained)

    def _progress(self, show: Callable[[int, int], None], done: int, total: int) -> None:
        if self._follower is None:
            show(done, total)
        else:
            self.run_view.show_follow_progress(done, total)

    def _finished(self, done: Callable[[str], None], error: str) -> None:
        """A sweep ended: the user's is told to the view; the follower's step is done with. Then
        the next step waiting is taken in hand."""
        if self._follower is None:
            done(error)
        else:
            self._follower = None
            self.session.followed(error)
        self._follow()

    def shutdown(self) -> None:
        """Stop every job of the page, each after the item in hand."""
        self.sample_sweep.stop(wait=SHUTDOWN_WAIT)  # after the prompt being written
        self.graded_sweep.stop(wait=SHUTDOWN_WAIT)  # after the question in hand
        self.bits_sweep.stop(wait=SHUTDOWN_WAIT)  # after the window in hand
        self.core_sweep.stop(wait=SHUTDOWN_WAIT)  # after the example in hand
        self.run_report.stop(wait=SHUTDOWN_WAIT)  # between two chunks of a file
