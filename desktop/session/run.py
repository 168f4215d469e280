"""The Run screen's state, Qt-free: the run chosen and its timeline, the steps marked for Compare,
what the sample sweep said, the evaluations' scores (each also a curve on the timeline), what was
read back from kept results, and what flipped between two steps.

The Run view renders it and sends the user's intents to it; the sweeps' results are recorded into
it; the report card takes its inputs from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from desktop.engine.discovery import CheckpointEntry
from desktop.engine.runs.saving import SAVING, StepState
from desktop.engine.runs.timeline import Curve, Point, Timeline
from desktop.session.observable import Events

StepKey = tuple[str, int]  # (stage, step)
Said = tuple[str, int, str, str]  # (stage, step, prompt, text)
MAX_COMPARED = 4  # panes the Compare screen holds
SWEEP = "sweep"  # the source of a curve an evaluation drew (not a file's)
GRADED = ("mc", "answers")  # the evaluations that say what flipped between two steps


@dataclass(frozen=True)
class Evaluation:
    """An evaluation as the user asked for it: ``kind`` "samples" (the sample prompts), "mc"
    (the questions in ``data``), "answers" (the bundled problems), "bpb" (the text in ``data``),
    "core-lite" or "core" (the eval_bundle folder ``data``; None: the base dir's)."""

    kind: str
    data: Path | None = None

    def title(self) -> str:
        name = self.data.name if self.data is not None else ""
        return {
            "samples": "sample prompts",
            "mc": f"multiple choice: {name}",
            "answers": "arithmetic and spelling",
            "bpb": f"bits per byte: {name}",
            "core-lite": "CORE lite",
            "core": "CORE",
        }.get(self.kind, self.kind)


@dataclass
class Follow:
    """An evaluation that follows the run: the steps that landed and wait for it (oldest
    first), the one in hand, the newest it evaluated (what the next is compared with)."""

    evaluation: Evaluation
    last: Point | None = None
    waiting: list[Point] = field(default_factory=list)
    in_hand: Point | None = None
    paused: bool = False
    held: bool = False  # the step in hand waits while the user chats
    failed: str = ""  # the last step it could not evaluate, and why


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
    follow_changed(): following turned on or off, paused or resumed, a step landed for it, was
        taken in hand, waits while the user chats, or was done.
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
            "follow_changed",
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
        # The run's steps still being saved or never finished (as the last scan found them).
        self.unsaved: list[StepState] = []
        self.asked: Evaluation | None = None  # the evaluation the user ran last
        self.asked_newest: Point | None = None  # the newest step it asked
        self.follow: Follow | None = None  # the evaluation that follows the run as it trains
        self.even_while_chatting = False  # the follower goes on while a reply streams

    # ----- the run ---------------------------------------------------------------------------

    def choose_run(self, folder: Path) -> None:
        self.run = Path(folder)
        self.events.run_chosen.emit(self.run)

    def show_timeline(self, timeline: Timeline) -> None:
        self.timeline, self.problem, self.marked = timeline, "", []
        self.asked_newest = None
        if self.follow is not None:  # another run (or the same read anew): nothing waits
            self.follow = Follow(self.follow.evaluation, paused=self.follow.paused)
        self.events.timeline_changed.emit()
        self.events.follow_changed.emit()

    def note_unsaved(self, entries: Sequence[CheckpointEntry]) -> None:
        """The scan's list: which steps of the chosen run are being saved, or never finished."""
        folders = {self.run, *(p.path for p in self.timeline.points)} if self.timeline else {self.run}
        self.unsaved = sorted(
            (s for e in entries if Path(e.path) in folders for s in e.unsaved), key=lambda s: s.step
        )

    def unsaved_line(self) -> str:
        """What the status line says of them: "step 4,000 saving…", "step 1,500 incomplete: why"."""
        return " · ".join(
            s.label() if s.state == SAVING else f"{s.label()}: {s.reason}" for s in self.unsaved
        )

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
            if self.follow is not None:
                self.follow.waiting += landed
                self.events.follow_changed.emit()

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
        return self._asking(Evaluation("samples"))

    def add_sample(self, stage: str, step: int, prompt: str, text: str) -> None:
        self.said.append((stage, step, prompt, text))
        self.events.sample_added.emit(stage, step, prompt, text)

    # ----- evaluations -----------------------------------------------------------------------

    def start_evaluation(self, kind: str = "", data: Path | None = None) -> list[Point]:
        """A new evaluation (``kind`` and ``data`` as :class:`Evaluation` names them): nothing
        read back yet; the steps to ask."""
        self.kept = (0, 0)
        return self._asking(Evaluation(kind, data)) if kind else self.targets()

    def _asking(self, evaluation: Evaluation) -> list[Point]:
        """The steps ``evaluation`` asks, remembered as the evaluation run last (what following
        follows, and the step it compares the next one with)."""
        targets = self.targets()
        self.asked = evaluation
        self.asked_newest = self._newest(targets)
        return targets

    def _newest(self, points: Sequence[Point]) -> Point | None:
        """The newest of ``points`` by their place on the timeline."""
        keys = [_key(p) for p in self.timeline.points] if self.timeline is not None else []
        return max(points, key=lambda p: keys.index(_key(p)) if _key(p) in keys else -1, default=None)

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

    def extend_scores(self, task: str, scores: Mapping[StepKey, float]) -> None:
        """More steps' scores on ``task`` (a step evaluated as it landed): they join the ones
        kept (a step scored again takes its new score), and the curve grows."""
        self.scores[task] = {**self.scores.get(task, {}), **scores}
        self._draw_scores(task, self.scores[task])
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

    # ----- following the run as it trains ----------------------------------------------------

    def follow_run(self, evaluation: Evaluation | None) -> None:
        """Evaluate each step that lands from now on with ``evaluation`` (None: stop following).
        The step it is compared with first is the newest the user asked, when it was the same
        evaluation."""
        if evaluation is None:
            self.follow = None
        else:
            last = self.asked_newest if evaluation == self.asked else None
            self.follow = Follow(evaluation, last)
        self.events.follow_changed.emit()

    def pause_following(self, paused: bool) -> None:
        """Pause (the step in hand is left after the item in hand; the steps waiting stay) or
        go on."""
        if self.follow is not None and self.follow.paused != paused:
            self.follow.paused = paused
            self.events.follow_changed.emit()

    def follow_while_chatting(self, on: bool) -> None:
        """Whether the follower goes on while a reply streams or the user types."""
        self.even_while_chatting = on
        self.events.follow_changed.emit()

    def next_to_follow(self) -> list[Point]:
        """Take the oldest step waiting in hand: the steps to ask for it (the one before it
        and it, for an evaluation that says what flipped; else it alone); empty when none
        waits, one is in hand already, or following is paused or off."""
        f = self.follow
        if f is None or f.paused or f.in_hand is not None or not f.waiting:
            return []
        f.in_hand, f.held = f.waiting[0], False
        asked = [f.in_hand]
        if f.evaluation.kind in GRADED:
            before = f.last if f.last is not None else self._before(f.in_hand)
            if before is not None and _key(before) != _key(f.in_hand):
                asked.insert(0, before)
        self.events.follow_changed.emit()
        return asked

    def _before(self, point: Point) -> Point | None:
        """The step before ``point`` on the timeline (None: it is the first)."""
        keys = [_key(p) for p in self.timeline.points] if self.timeline is not None else []
        index = keys.index(_key(point)) if _key(point) in keys else 0
        return self.timeline.points[index - 1] if self.timeline is not None and index > 0 else None

    def follow_held(self, held: bool) -> None:
        """The step in hand waits while the user chats (or goes on)."""
        if self.follow is not None and self.follow.in_hand is not None and self.follow.held != held:
            self.follow.held = held
            self.events.follow_changed.emit()

    def followed(self, error: str = "") -> None:
        """The step in hand is done with: evaluated (the next is compared with it), stopped by a
        pause (it waits still, asked again on resume), or it failed (``error``: it is let go)."""
        f = self.follow
        if f is None or f.in_hand is None:
            return
        done, f.in_hand, f.held = f.in_hand, None, False
        if f.waiting and _key(f.waiting[0]) == _key(done) and (error or not f.paused):
            f.waiting.pop(0)
            if error:
                f.failed = f"step {done.step} not evaluated: {error}"
            else:
                f.last, f.failed = done, ""
        self.events.follow_changed.emit()

    def follow_status(self) -> str:
        """What the follower does, in a few words ("" when nothing follows)."""
        f = self.follow
        if f is None:
            return ""
        in_hand = f.in_hand is not None and bool(f.waiting) and _key(f.waiting[0]) == _key(f.in_hand)
        more = len(f.waiting) - in_hand
        if f.in_hand is not None:
            if f.held:
                said = f"step {f.in_hand.step} waits while you chat"
            elif f.paused:
                said = f"pausing after the item in hand of step {f.in_hand.step}"
            else:
                said = f"evaluating step {f.in_hand.step} as it landed…"
            if more:
                said += f" ({more} more waiting)"
        elif f.paused:
            said = f"{_steps(len(f.waiting))} waiting: paused" if f.waiting else "following paused"
        elif f.waiting:
            said = f"{_steps(len(f.waiting))} waiting"
        else:
            said = f"following {f.evaluation.title()}: new steps are evaluated as they land"
        return f"{said} · {f.failed}" if f.failed else said


def _key(point: Point) -> StepKey:
    return (point.stage, point.step)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"
