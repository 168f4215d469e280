"""Following a run as it trains, without Qt: the steps that land wait for the evaluation the user
ran last, are taken in hand one at a time (with the step before them, for what flipped), their
scores extend the task's and its curve, a pause keeps them waiting, and the status says where it
is."""

from pathlib import Path

from desktop.engine.runs.timeline import Point, Timeline
from desktop.session.run import Evaluation, RunSession

RUN = Path("/runs/base_checkpoints/d2")
TASK = "arithmetic and spelling"


def point(step: int) -> Point:
    return Point("base", step, step, RUN, {"val_bpb": 3.0 - step / 100}, None, 0)


def timeline(*steps: int) -> Timeline:
    return Timeline("base/d2", tuple(point(s) for s in steps))


def steps(points: list[Point]) -> list[int]:
    return [p.step for p in points]


def record(session: RunSession) -> list[str]:
    seen: list[str] = []
    for name in session.events.names():
        getattr(session.events, name).connect(lambda *_args, n=name: seen.append(n))
    return seen


def test_landed_steps_wait_and_are_asked_one_at_a_time_with_the_step_before():
    session = RunSession()
    session.show_timeline(timeline(10))
    assert steps(session.start_evaluation("answers", None)) == [10]
    session.record_scores(TASK, {("base", 10): 0.25})
    session.follow_run(session.asked)
    assert session.follow.evaluation == Evaluation("answers") and session.follow.last.step == 10
    assert session.follow_status() == f"following {TASK}: new steps are evaluated as they land"
    assert session.next_to_follow() == []  # nothing landed yet

    seen = record(session)
    session.grow_timeline(timeline(10, 20, 30))  # two saves landed between two reads
    assert seen == ["timeline_changed", "steps_landed", "follow_changed"]
    assert steps(session.follow.waiting) == [20, 30]
    assert session.follow_status() == "2 steps waiting"

    assert steps(session.next_to_follow()) == [10, 20]  # the last one evaluated, and the new one
    assert session.follow_status() == "evaluating step 20 as it landed… (1 more waiting)"
    assert session.next_to_follow() == []  # one at a time
    session.follow_held(True)
    assert session.follow_status() == "step 20 waits while you chat (1 more waiting)"
    session.follow_held(False)
    session.extend_scores(TASK, {("base", 10): 0.25, ("base", 20): 0.5})
    session.followed()
    assert steps(session.follow.waiting) == [30] and session.follow.last.step == 20

    assert steps(session.next_to_follow()) == [20, 30]
    session.extend_scores(TASK, {("base", 20): 0.5, ("base", 30): 0.75})
    session.followed()
    assert session.follow.waiting == [] and session.follow.in_hand is None
    # The scores grew by a row per step, and so did the curve.
    assert session.scores[TASK] == {("base", 10): 0.25, ("base", 20): 0.5, ("base", 30): 0.75}
    assert session.timeline.line(TASK) == [(10.0, 0.25), (20.0, 0.5), (30.0, 0.75)]


def test_extending_scores_keeps_the_others_and_takes_a_step_asked_again():
    session = RunSession()
    session.show_timeline(timeline(10, 20))
    session.record_scores(TASK, {("base", 10): 0.25})
    seen = record(session)
    session.extend_scores(TASK, {("base", 10): 0.3, ("base", 20): 0.5})
    session.extend_scores("CORE", {("base", 20): 0.01})  # a task not scored before
    assert seen == ["scores_changed", "scores_changed"]
    assert session.scores == {TASK: {("base", 10): 0.3, ("base", 20): 0.5}, "CORE": {("base", 20): 0.01}}
    assert session.timeline.line("CORE") == [(20.0, 0.01)]


def test_a_pause_keeps_the_step_in_hand_waiting_and_a_failure_lets_it_go():
    session = RunSession()
    session.show_timeline(timeline(10))
    session.follow_run(Evaluation("answers"))  # nothing asked before: compared with the step before
    session.grow_timeline(timeline(10, 20))
    assert steps(session.next_to_follow()) == [10, 20]
    session.pause_following(True)
    assert session.follow_status() == "pausing after the item in hand of step 20"
    session.followed()  # stopped after the item in hand: it waits still
    assert steps(session.follow.waiting) == [20] and session.follow.last is None
    session.grow_timeline(timeline(10, 20, 30))
    assert session.follow_status() == "2 steps waiting: paused"
    assert session.next_to_follow() == []  # paused: nothing is taken in hand

    session.pause_following(False)
    assert steps(session.next_to_follow()) == [10, 20]  # asked again
    session.followed("out of memory while loading a step; close other models first")
    assert steps(session.follow.waiting) == [30]
    assert session.follow_status() == (
        "1 step waiting · step 20 not evaluated: out of memory while loading a step; close other models first"
    )
    assert steps(session.next_to_follow()) == [20, 30]  # the step before 30 on the timeline
    session.followed()
    assert session.follow_status().startswith("following arithmetic and spelling")


def test_only_graded_evaluations_ask_the_step_before_and_nothing_waits_unless_followed():
    session = RunSession()
    session.show_timeline(timeline(10))
    session.grow_timeline(timeline(10, 20))  # not following: nothing waits
    assert session.follow is None and session.follow_status() == ""
    session.start_samples()
    session.follow_run(session.asked)
    assert session.follow.evaluation == Evaluation("samples") and session.follow.last.step == 20
    session.grow_timeline(timeline(10, 20, 30))
    assert steps(session.next_to_follow()) == [30]  # a sample sweep asks the new step alone
    session.followed()
    kinds = (("bpb", Path("/t/text.txt")), ("core-lite", None), ("mc", Path("/t/q.jsonl")))
    for n, (kind, data) in enumerate(kinds, start=4):
        session.follow_run(Evaluation(kind, data))
        session.grow_timeline(timeline(*range(10, n * 10 + 1, 10)))
        want = [n * 10 - 10, n * 10] if kind == "mc" else [n * 10]
        assert steps(session.next_to_follow()) == want, kind
        session.followed()
    assert Evaluation("mc", Path("/t/q.jsonl")).title() == "multiple choice: q.jsonl"
    assert Evaluation("bpb", Path("/t/text.txt")).title() == "bits per byte: text.txt"


def test_another_run_forgets_the_steps_waiting_and_following_off_forgets_all():
    session = RunSession()
    session.show_timeline(timeline(10))
    session.follow_run(Evaluation("answers"))
    session.follow_while_chatting(True)
    session.grow_timeline(timeline(10, 20, 30))
    assert steps(session.next_to_follow()) == [10, 20]
    session.show_timeline(Timeline("other", (Point("sft", 5, 5, RUN, {}, None, 0),)))
    assert session.follow.waiting == [] and session.follow.in_hand is None
    assert session.follow.evaluation == Evaluation("answers") and session.even_while_chatting
    session.followed()  # the sweep of the other run's step ends: nothing is taken off
    assert session.follow.waiting == [] and session.follow.last is None
    session.follow_run(None)
    assert session.follow is None and session.next_to_follow() == []
