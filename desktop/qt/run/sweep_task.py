"""The Run tab's sweeps off the GUI thread: one step after another, one checkpoint open at a
time, on a job's thread (``qt/jobs/runner.py``); each result, the progress and the end are
emitted as signals on the window's thread. Stop ends a sweep after the item in hand; one sweep of
a kind runs at a time.

A sweep started ``gentle`` (an evaluation that follows a run as it trains, in the background)
runs on a thread at the lowest OS priority and, unless told not to mind the chat, waits before
each step and between its items while the foreground holds background work (a reply streaming,
the user typing: :mod:`desktop.engine.foreground`), saying so (``waiting``).

* :class:`SampleSweepTask`: nanochat's base_train prompts (or the user's), greedy, 16 tokens.
* :class:`GradedSweepTask`: multiple choice from the user's JSONL (nanochat's categorical method),
  or the bundled problems whose replies are checked.
* :class:`BitsSweepTask`: bits per byte of the user's text.
* :class:`CoreSweepTask`: nanochat's CORE over its eval_bundle (every task, or the first N
  examples of each, as its ``--max-per-task N``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from desktop.config import paths
from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError, is_out_of_memory
from desktop.engine.files.bounded import FileRefused
from desktop.engine.foreground import HELD, lower_this_threads_priority, wait_while_held
from desktop.engine.runs import core_bundle
from desktop.engine.runs.bits_per_byte import read_text
from desktop.engine.runs.checked_answers import bundled_problems
from desktop.engine.runs.evals import SAMPLE_PROMPTS, sample_sweep
from desktop.engine.runs.grading import Graded, accuracy, what_flipped
from desktop.engine.runs.multiple_choice import read_questions
from desktop.engine.runs.sweep import tasks_sweep
from desktop.engine.runs.timeline import Point
from desktop.qt.jobs.runner import Job, Run
from desktop.store.eval_results import (
    StoreKeeper,
    core_key,
    kept_answers,
    kept_bits,
    kept_choices,
    shared_results,
)

logger = logging.getLogger(__name__)

# A sweep's work, on the job's thread: it reads ``run.cancel`` between its items and posts what it
# reports (the signals are emitted on the GUI thread).
SweepWork = Callable[[Run, LoadOptions], None]


class SweepTask(QObject):
    """Signals: progress(done, total), kept(steps read back from the eval results store, of all
    steps), waiting(True while a gentle sweep waits for the foreground, then False),
    finished(error: "" when it completed or was stopped)."""

    progress = Signal(int, int)
    kept = Signal(int, int)
    waiting = Signal(bool)
    finished = Signal(str)
    job_name = "sweep"  # its thread's name

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._job = Job(self.job_name, self)
        self._gentle = False  # the running sweep's: at the lowest priority, making way
        self._mind_chat = True  # a gentle sweep waits while the foreground holds background work
        self._wake = threading.Event()  # ends a wait for the foreground: a stop, or chat not minded

    def running(self) -> bool:
        return self._job.running()

    def stop(self, wait: float = 0.0) -> None:
        self._job.stop()  # its Stop is set before the wait for the foreground is woken
        self._wake.set()
        self._job.stop(wait)

    def mind_chat(self, mind: bool) -> None:
        """Whether a gentle sweep waits while the user chats (read before each of its items)."""
        self._mind_chat = mind
        self._wake.set()

    def _launch(self, work: SweepWork, gentle: bool = False) -> bool:
        if self.running():
            return False
        self._gentle = gentle
        options = LoadOptions(base_dir=paths.nanochat_base_dir(), kernel_cache=paths.kernel_timings_file())

        def main(run: Run) -> str:
            if gentle:  # this run's thread, and the OpenMP workers it starts
                lower_this_threads_priority()
            self._step_aside(run)
            return _outcome(work, run, options)

        return self._job.start(
            main,
            done=self.finished.emit,
            failed=lambda line: self.finished.emit(f"the sweep failed: {line}"),
        )

    def _step_aside(self, run: Run) -> None:
        """On the job's thread, between items: a gentle sweep waits while the foreground holds
        background work (unless chat is not minded), ``waiting`` saying so; a stop ends the wait."""
        if not (self._gentle and self._mind_chat and HELD) or run.cancel.is_set():
            return
        run.post(self.waiting.emit, True)
        try:
            while True:
                self._wake.clear()  # before the checks: a stop after them still wakes the wait
                if not (HELD and self._mind_chat) or run.cancel.is_set():
                    return
                wait_while_held(self._wake)
        finally:
            run.post(self.waiting.emit, False)


def _outcome(work: SweepWork, run: Run, options: LoadOptions) -> str:
    """Run a sweep's work: "" when it completed or was stopped, else why it could not go on (an
    error it expects, said plainly; any other is the runner's to log and report)."""
    try:
        work(run, options)
    except (NanoscopeError, FileRefused) as exc:
        return str(exc)
    except (MemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        return "out of memory while loading a step; close other models first"
    return ""


class SampleSweepTask(SweepTask):
    """Signals: sample(stage, step, prompt, text), and the sweep's progress and end."""

    sample = Signal(str, int, str, str)
    job_name = "sample-sweep"

    def start(
        self, points: Sequence[Point], prompts: Sequence[str] = SAMPLE_PROMPTS, gentle: bool = False
    ) -> bool:
        if not points:
            return False
        points, prompts = list(points), list(prompts)

        def work(run: Run, options: LoadOptions) -> None:
            said = sample_sweep(
                points,
                prompts,
                options=options,
                cancel=run.cancel,
                progress=lambda done, total: run.post(self.progress.emit, done, total),
            )
            for s in said:
                run.post(self.sample.emit, s.stage, s.step, s.prompt, s.text)
                self._step_aside(run)

        return self._launch(work, gentle)


class GradedSweepTask(SweepTask):
    """Questions with a right answer: multiple choice from the user's JSONL ("mc") or the
    bundled checked-answer problems ("answers"). Signals: questions([(line, question, text
    asked)], problems) once they are read; answered(stage, step, line, correct) for each step
    and question; scored(task, {(stage, step): share right}) and flipped(earlier, later, lost
    lines, gained lines) between the first and last step answered, by the engine's rules; then
    the sweep's end."""

    questions = Signal(list, list)
    answered = Signal(str, int, int, bool)
    scored = Signal(str, object)
    flipped = Signal(object, object, list, list)
    job_name = "graded-sweep"

    def start(
        self, points: Sequence[Point], data: Path | None, kind: str = "mc", gentle: bool = False
    ) -> bool:
        if not points:
            return False
        points = list(points)

        def work(run: Run, options: LoadOptions) -> None:
            graded: Iterator[tuple[Graded, bool]]
            store = shared_results()
            if kind == "mc" and data is not None:
                asked, problems = read_questions(Path(data))
                run.post(self.questions.emit, [(q.line, q.question, q.text()) for q in asked], problems)
                task, count = f"multiple choice: {Path(data).name}", len(asked)
                graded = kept_choices(store, points, asked, options, run.cancel)
            else:
                bundled = bundled_problems()
                run.post(self.questions.emit, [(p.line, p.question, p.question) for p in bundled], [])
                task, count = "arithmetic and spelling", len(bundled)
                graded = kept_answers(store, points, bundled, options, run.cancel)
            answers = []
            read_back: set[tuple[str, int]] = set()
            for a, kept in graded:
                answers.append(a)
                if kept:
                    read_back.add((a.stage, a.step))
                run.post(self.answered.emit, a.stage, a.step, a.line, a.correct)
                run.post(self.progress.emit, len(answers), count * len(points))
                self._step_aside(run)
            scores = accuracy(answers)
            run.post(self.kept.emit, len(read_back), len(scores))
            run.post(self.scored.emit, task, scores)
            if len(scores) >= 2:
                earlier, *_, later = scores
                flips = what_flipped(answers, earlier, later)
                run.post(self.flipped.emit, earlier, later, list(flips.lost), list(flips.gained))

        return self._launch(work, gentle)


class BitsSweepTask(SweepTask):
    """Signals: scored(task, {(stage, step): bits per byte}) after each step (the curve grows as
    the sweep goes), and the sweep's progress and end."""

    scored = Signal(str, object)
    job_name = "bits-sweep"

    def start(self, points: Sequence[Point], data: Path, gentle: bool = False) -> bool:
        if not points:
            return False
        points = list(points)

        def work(run: Run, options: LoadOptions) -> None:
            text, more = read_text(Path(data))
            task = f"bits per byte: {Path(data).name}" + (" (start)" if more else "")
            scores: dict[tuple[str, int], float] = {}
            read_back = 0
            for r, kept in kept_bits(shared_results(), points, text, more, options, run.cancel):
                read_back += kept
                scores[(r.stage, r.step)] = r.bits_per_byte
                run.post(self.progress.emit, len(scores), len(points))
                run.post(self.scored.emit, task, dict(scores))
                self._step_aside(run)
            run.post(self.kept.emit, read_back, len(scores))

        return self._launch(work, gentle)


class CoreSweepTask(SweepTask):
    """Signals: scored("CORE …", {(stage, step): CORE}) as each step's every task is answered
    (the curve grows step by step), as the CLI's ``--task core`` computes it."""

    scored = Signal(str, object)
    job_name = "core-sweep"

    def start(
        self, points: Sequence[Point], bundle: Path | None, lite: int | None, gentle: bool = False
    ) -> bool:
        """``bundle``: the eval_bundle folder (None: ``$NANOCHAT_BASE_DIR/eval_bundle``);
        ``lite``: the first N examples of each task (None: all)."""
        if not points:
            return False
        points = list(points)

        def work(run: Run, options: LoadOptions) -> None:
            folder = core_bundle.find_bundle(bundle, paths.nanochat_base_dir())
            tasks, problems = core_bundle.read_tasks(folder)
            for problem in problems:
                logger.warning("CORE: %s", problem)
            asked, keys = [], {}
            for task in tasks:
                examples, _skipped = core_bundle.read_examples(task, lite)
                one = core_bundle.core_task(task, examples)
                asked.append(one)
                keys[one.name] = core_key(task, examples, lite)
            title = f"CORE (lite {lite})" if lite else "CORE"
            total = len(points) * sum(len(one.items) for one in asked)
            keeper = StoreKeeper(shared_results(), keys, run.cancel)
            answers: list[core_bundle.CoreAnswer] = []
            sweep = tasks_sweep(points, asked, options=options, cancel=run.cancel, keeper=keeper)
            for done, r in enumerate(sweep, start=1):
                # Steps come one after another: a new one means the last is complete, and CORE
                # is computed then (not after every answer: that grows with the square).
                if answers and (r.result.stage, r.result.step) != (answers[-1].stage, answers[-1].step):
                    run.post(self.scored.emit, title, core_bundle.core_scores(answers, tasks))
                answers.append(r.result)
                run.post(self.progress.emit, done, total)
                self._step_aside(run)
            if answers:
                run.post(self.scored.emit, title, core_bundle.core_scores(answers, tasks))
            run.post(self.kept.emit, len({(stage, step) for stage, step, _ in keeper.read_back}), len(points))

        return self._launch(work, gentle)
