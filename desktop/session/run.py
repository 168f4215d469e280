"""The Run screen's state, Qt-free: the run chosen and its timeline, the steps marked for Compare,
what the sample sweep said, the evaluations' scores (each also a curve on the timeline), what was
read back from kept results, and what flipped between two steps.

The Run view renders it and sends the user's intents to it; the sweeps' results are recorded into
it; the report card takes its inputs from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from desktop.engine.runs.timeline import Curve, Point, Timeline
from desktop.session.observable import Events

StepKey = tuple[str, int]  # (stage, step)
Said = tuple[str, int, str, str]  # (stage, step, prompt, text)
MAX_COMPARED = 4  # panes the Compare screen holds
SWEEP = "sweep"  # the source of a curve an evaluation drew (not a file's)


@dataclass(frozen=True)
class Flips:
    """The questions (by line) a later step got wrong that the earlier one got right (``lost``),
    and the reverse (``gained``)."""

    earlier: StepKey
    later: StepKey
    lost: tuple[int, ...]
    gained: tuple[int, ...]


class RunSession:
    """Events:
    run_chosen(folder): a run was chosen; its timeline is wanted.
    timeline_changed(): a new timeline, or none (``problem`` says why); the marks are cleared
        (but for a run read again as it trains: then they stay).
    steps_landed(points): the run, read again, has new saved steps (Point list, oldest first).
    marks_changed(): a step was marked or unmarked.
    samples_started(): a sample sweep began; what the last one said is gone.
    sample_added(stage, step, prompt, text): one step's continuation of one prompt.
    questions_changed(): a new multiple-choice sweep's questions; the flips are cleared.
    scores_changed(task): each step's score on ``task`` (and its curve on the timeline).
    flips_changed(): what flipped between two steps.
    """

    def __init__(self) -> None:
        self.events = Events(
            "run_chosen",
            "timeline_changed",
            "steps_landed",
            "marks_changed",
            "samples_started",
            "sample_added",
            "questions_changed",
            "scores_changed",
            "flips_changed",
        )
        self.run: Path | None = None
        self.timeline: Timeline | None = None
        self.problem = ""  # why the chosen run has no timeline
        self.marked: list[Point] = []
        self.said: list[Said] = []
        self.scores: dict[str, dict[StepKey, float]] = {}  # task -> step -> score
        self.questions: dict[int, tuple[str, str]] = {}  # line -> (the question, the text asked)
        self.folders: dict[StepKey, Path] = {}  # where each asked step's files are
        self.flips: Flips | None = None
        self.kept: tuple[int, int] = (0, 0)  # steps the running evaluation read back, of all

    # ----- the run ---------------------------------------------------------------------------

    def choose_run(self, folder: Path) -> None:
        self.run = Path(folder)
        self.events.run_chosen.emit(self.run)

    def show_timeline(self, timeline: Timeline) -> None:
        self.timeline, self.problem, self.marked = timeline, "", []
        self.events.timeline_changed.emit()

    def grow_timeline(self, timeline: Timeline) -> None:
        """The chosen run read again while it trains: marks on steps still there stay, the
        evaluations' curves are drawn on it again, and ``steps_landed`` names its new steps."""
        before = self.timeline
        if before is None:
            self.show_timeline(timeline)
            return
        if timeline == replace(before, curves=tuple(c for c in before.curves if c.source != "sweep")):
            return  # nothing new (the evaluations' curves are this session's, not the files')
        known = {(p.stage, p.step) for p in before.points}
        now = {(p.stage, p.step): p for p in timeline.points}
        self.timeline, self.problem = timeline, ""
        self.marked = [now[(p.stage, p.step)] for p in self.marked if (p.stage, p.step) in now]
        for task, scores in self.scores.items():
            self._draw_scores(task, scores)
        self.events.timeline_changed.emit()
        landed = [p for p in timeline.points if (p.stage, p.step) not in known]
        if landed:
            self.events.steps_landed.emit(landed)

    def show_problem(self, folder: Path, message: str) -> None:
        self.timeline, self.problem, self.marked = None, f"{Path(folder).name}: {message}", []
        self.events.timeline_changed.emit()

    # ----- marks -----------------------------------------------------------------------------

    def toggle_mark(self, point: Point) -> bool:
        """Mark ``point`` (up to MAX_COMPARED) or unmark it; False when nothing changed."""
        if point in self.marked:
            self.marked.remove(point)
        elif len(self.marked) < MAX_COMPARED:
            self.marked.append(point)
        else:
            return False
        self.events.marks_changed.emit()
        return True

    def can_compare(self) -> bool:
        return 2 <= len(self.marked) <= MAX_COMPARED

    def compare_steps(self) -> list[tuple[Path, int]]:
        """The marked steps as Compare loads them, (folder, step) in the order they were marked;
        empty unless Compare can hold them."""
        return [(p.path, p.step) for p in self.marked] if self.can_compare() else []

    def targets(self) -> list[Point]:
        """What a sweep asks: the marked steps, or every step when none is marked."""
        if self.timeline is None:
            return []
        return list(self.marked) or list(self.timeline.points)

    # ----- sample prompts ----------------------------------------------------------------------

    def start_samples(self) -> list[Point]:
        """A new sample sweep: what the last one said is dropped; the steps to ask."""
        self.said = []
        self.events.samples_started.emit()
        return self.targets()

    def add_sample(self, stage: str, step: int, prompt: str, text: str) -> None:
        self.said.append((stage, step, prompt, text))
        self.events.sample_added.emit(stage, step, prompt, text)

    # ----- evaluations -----------------------------------------------------------------------

    def start_evaluation(self) -> list[Point]:
        """A new evaluation: nothing read back yet; the steps to ask."""
        self.kept = (0, 0)
        return self.targets()

    def set_questions(self, questions: Sequence[tuple[int, str, str]]) -> None:
        """A sweep's questions by line: (line, the question, the whole text asked)."""
        self.questions = {line: (question, asked) for line, question, asked in questions}
        points = self.timeline.points if self.timeline is not None else ()
        self.folders = {(p.stage, p.step): p.path for p in points}
        self.flips = None
        self.events.questions_changed.emit()

    def record_scores(self, task: str, scores: Mapping[StepKey, float]) -> None:
        """Each step's score on ``task``: kept for the table and the report card, and drawn as a
        curve of the timeline (one segment per stage), replacing an earlier one of that task."""
        self.scores[task] = dict(scores)
        self._draw_scores(task, scores)
        self.events.scores_changed.emit(task)

    def _draw_scores(self, task: str, scores: Mapping[StepKey, float]) -> None:
        if self.timeline is not None:
            points = self.timeline.points
            curves = [c for c in self.timeline.curves if c.name != task]
            for stage in dict.fromkeys(p.stage for p in points):
                placed = sorted(
                    (float(p.x), scores[(p.stage, p.step)])
                    for p in points
                    if p.stage == stage and (p.stage, p.step) in scores
                )
                if placed:
                    xs, ys = zip(*placed, strict=True)
                    curves.append(Curve(task, stage, xs, ys, SWEEP))
            self.timeline = replace(self.timeline, curves=tuple(curves))

    def record_flips(
        self, earlier: StepKey, later: StepKey, lost: Sequence[int], gained: Sequence[int]
    ) -> None:
        self.flips = Flips(earlier, later, tuple(lost), tuple(gained))
        self.events.flips_changed.emit()

    def flip_question(self, line: int) -> tuple[list[tuple[Path, int]], str] | None:
        """A flipped question to ask both steps side by side: their (folder, step) and the text
        they were asked; None when either step's files are not known."""
        if self.flips is None:
            return None
        keys = (self.flips.earlier, self.flips.later)
        steps = [(self.folders[k], k[1]) for k in keys if k in self.folders]
        if len(steps) != 2:
            return None
        return steps, self.questions.get(line, ("", ""))[1]

    def note_kept(self, read_back: int, steps: int) -> None:
        """How many of the evaluated steps were read back from the kept results."""
        self.kept = (read_back, steps)

    def report_inputs(self) -> tuple[Timeline, list[Said], dict[str, dict[StepKey, float]]] | None:
        """What the report card is written from: the timeline, what was said, the scores."""
        if self.timeline is None:
            return None
        return self.timeline, list(self.said), {task: dict(s) for task, s in self.scores.items()}
