"""Checked answers across steps: the bundled problems are right by construction, a reply's
number is read as nanochat's GSM8K reads it (after ####, else the last number), and each step's
calculator calls are the python parts its reply holds."""

from __future__ import annotations

import json
import operator
import re
import threading

import pytest
from support import REPO

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.messages import PYTHON, Message
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.params import SamplingParams
from desktop.engine.runs.checked_answers import REPLY_TOKENS, answer_sweep, bundled_problems, read_answer
from desktop.engine.runs.grading import accuracy
from desktop.engine.runs.timeline import timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
OPS = {"plus": operator.add, "minus": operator.sub, "times": operator.mul}


def right(given: str | None, answer: str) -> bool:
    return given is not None and float(given.replace(",", "")) == float(answer)


def test_the_bundled_problems_are_right_and_the_same_every_time():
    problems = bundled_problems(60)
    assert problems == bundled_problems(60) and problems != bundled_problems(60, seed=1)
    kinds = set()
    for p in problems:
        if m := re.fullmatch(r"What is (\d+) (plus|minus|times) (\d+)\?", p.question):
            kinds.add("arithmetic")
            assert int(p.answer) == OPS[m[2]](int(m[1]), int(m[3]))
        else:
            m = re.fullmatch(r"How many (\w) are in (\w+)\?", p.question)
            assert m is not None
            kinds.add("letters")
            assert int(p.answer) == m[2].count(m[1]) > 0
    assert kinds == {"arithmetic", "letters"} and [p.line for p in problems] == list(range(1, 61))


@pytest.mark.parametrize(
    ("reply", "given", "marked"),
    [
        ("so 3 + 4 = 7\n#### 7", "7", True),
        ("#### 1,234 then 5", "1,234", True),
        ("12 times 7 is 84.", "84", False),
        ("There are -3 left", "-3", False),
        ("no number here", None, False),
    ],
)
def test_the_answer_is_read_as_nanochat_reads_it(reply, given, marked):
    assert read_answer(reply) == (given, marked)


def test_each_step_s_replies_are_checked_and_its_calculator_calls_counted():
    problems = bundled_problems(6)
    points = timeline_of(DEMO).points
    checked = list(answer_sweep([points[0], points[-1]], problems))
    assert [(c.step, c.line) for c in checked] == [
        (p.step, q.line) for p in (points[0], points[-1]) for q in problems
    ]
    for c in checked:
        assert c.correct == (c.given is not None and float(c.given.replace(",", "")) == float(c.answer))
    # The same prompt, streamed into the one reply object: its python parts are the calls.
    backend = NanochatBackend.open(DEMO, LoadOptions(device="cpu", step=points[-1].step))
    try:
        for c in checked[len(problems) :]:
            question = problems[c.line - 1].question
            prompt = backend.render([Message.of_text("user", question)], REPLY_TOKENS, chat=True)
            reply = Message(role="assistant")
            greedy = SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS)
            for ev in backend.stream(prompt, greedy, threading.Event()):
                reply.add_event(ev)
            assert c.calculator_calls == sum(1 for part in reply.parts if part.kind == PYTHON)
    finally:
        backend.close()
    scores = accuracy(checked)
    assert set(scores) == {(points[0].stage, points[0].step), (points[-1].stage, points[-1].step)}


def test_nanoscope_eval_answers_prints_each_checked_reply(capsys):
    step = timeline_of(DEMO).points[-1].step
    assert cli.main(["eval", str(DEMO), "--task", "answers", "--steps", str(step), "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(shown) == len(bundled_problems()) and all(r["step"] == step for r in shown)
    assert all(
        r["correct"] == (r["given"] is not None and float(r["given"].replace(",", "")) == float(r["answer"]))
        for r in shown
    )
