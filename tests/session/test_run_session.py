"""The Run screen's state without Qt: a real run's timeline (the bundled demo), steps marked for
Compare, a sample sweep, evaluations recorded as scores and curves, and what flipped."""

import pytest
from support import REPO

from desktop.engine.runs.timeline import Point, Timeline, timeline_of
from desktop.session.run import MAX_COMPARED, Flips, RunSession

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"


@pytest.fixture
def session() -> RunSession:
    run = RunSession()
    run.show_timeline(timeline_of(DEMO))
    return run


def record(session: RunSession) -> list:
    seen: list = []
    for name in session.events.names():
        getattr(session.events, name).connect(lambda *args, n=name: seen.append((n, args)))
    return seen


def test_choosing_a_run_asks_for_its_timeline_and_a_problem_clears_it(session):
    seen = record(session)
    session.choose_run(DEMO)
    assert session.run == DEMO and seen == [("run_chosen", (DEMO,))]
    session.toggle_mark(session.timeline.points[0])
    session.show_problem(DEMO, "no metas")
    assert session.timeline is None and session.marked == [] and session.problem == "demo: no metas"
    assert session.targets() == [] and session.report_inputs() is None


def test_marks_toggle_in_order_and_compare_gets_them_as_marked(session):
    points = session.timeline.points
    assert len(points) >= 3
    seen = record(session)
    last, first, middle = points[-1], points[0], points[1]
    for point in (last, first):
        assert session.toggle_mark(point)
    assert session.compare_steps() == [(last.path, last.step), (first.path, first.step)]
    assert session.toggle_mark(middle) and session.toggle_mark(last)  # unmarked: the others stay in order
    assert session.compare_steps() == [(first.path, first.step), (middle.path, middle.step)]
    assert seen == [("marks_changed", ())] * 4
    assert session.toggle_mark(first) and session.compare_steps() == []  # one step: nothing to compare
    assert session.targets() == [middle]
    session.toggle_mark(middle)
    assert session.targets() == list(points)  # none marked: a sweep asks every step


def test_no_more_steps_are_marked_than_compare_holds():
    run = DEMO.parent / "long"
    points = tuple(Point("sft", s, s, run, {}, None, 0) for s in range(1, MAX_COMPARED + 3))
    session = RunSession()
    session.show_timeline(Timeline("long", points))
    for point in points:
        session.toggle_mark(point)
    assert session.marked == list(points[:MAX_COMPARED])
    assert not session.toggle_mark(points[-1])
    assert session.compare_steps() == [(run, p.step) for p in points[:MAX_COMPARED]]


def test_a_new_sample_sweep_forgets_what_the_last_one_said(session):
    seen = record(session)
    first = session.timeline.points[0]
    assert session.start_samples() == list(session.timeline.points)
    session.add_sample(first.stage, first.step, "The capital of France is", " Paris")
    assert session.said == [(first.stage, first.step, "The capital of France is", " Paris")]
    session.toggle_mark(first)
    assert session.start_samples() == [first] and session.said == []
    names = [name for name, _ in seen]
    assert names == ["samples_started", "sample_added", "marks_changed", "samples_started"]


def test_scores_are_kept_per_task_drawn_as_curves_and_handed_to_the_report(session):
    points = session.timeline.points[:2]
    keys = [(p.stage, p.step) for p in points]
    seen = record(session)
    session.record_scores("multiple choice: q.jsonl", {keys[0]: 0.25, keys[1]: 0.75})
    session.record_scores("bits per byte: t.txt", {keys[0]: 1.5, keys[1]: 1.25})
    session.record_scores("multiple choice: q.jsonl", {keys[0]: 0.5, keys[1]: 1.0})  # asked again
    assert seen == [
        ("scores_changed", ("multiple choice: q.jsonl",)),
        ("scores_changed", ("bits per byte: t.txt",)),
        ("scores_changed", ("multiple choice: q.jsonl",)),
    ]
    line = session.timeline.line("multiple choice: q.jsonl")
    assert line == [(float(points[0].x), 0.5), (float(points[1].x), 1.0)]
    timeline, said, scores = session.report_inputs()
    assert timeline is session.timeline and said == []
    assert scores == {
        "multiple choice: q.jsonl": {keys[0]: 0.5, keys[1]: 1.0},
        "bits per byte: t.txt": {keys[0]: 1.5, keys[1]: 1.25},
    }
    session.note_kept(2, 2)
    assert session.kept == (2, 2)
    session.start_evaluation()
    assert session.kept == (0, 0)


def test_what_flipped_sends_both_steps_and_the_question_asked(session):
    earlier, later = session.timeline.points[0], session.timeline.points[-1]
    keys = (earlier.stage, earlier.step), (later.stage, later.step)
    session.set_questions([(3, "What is 12 times 7?", "Q: What is 12 times 7?\nA:"), (5, "Sky?", "Sky? A:")])
    assert session.flip_question(3) is None  # nothing flipped yet
    seen = record(session)
    session.record_flips(keys[0], keys[1], [3], [5])
    assert session.flips == Flips(keys[0], keys[1], (3,), (5,)) and seen == [("flips_changed", ())]
    steps, asked = session.flip_question(3)
    assert steps == [(earlier.path, earlier.step), (later.path, later.step)]
    assert asked == "Q: What is 12 times 7?\nA:"
    session.set_questions([])  # a new sweep: its flips come when it ends
    assert session.flips is None


def test_a_flip_between_steps_whose_files_are_unknown_goes_nowhere(session):
    session.set_questions([(1, "q", "q asked")])
    session.record_flips(("sft", 1), ("sft", 999_999), [1], [])
    assert session.flip_question(1) is None
