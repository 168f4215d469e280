"""Multiple choice over a run's steps, by nanochat's categorical method: each step's answer is
the letter its logits favour at the assistant's first position, among the question's letters;
a JSONL that is broken, huge or hostile gives one line per problem and the rest is asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support import REPO

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.files.bounded import FileRefused
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.runs.grading import accuracy, what_flipped
from desktop.engine.runs.multiple_choice import (
    LETTERS,
    MAX_QUESTIONS,
    Question,
    ask,
    letter_ids,
    mc_sweep,
    read_questions,
)
from desktop.engine.runs.timeline import timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
QUESTIONS = [
    {"question": "What is 12 times 7?", "choices": ["74", "84", "94"], "answer": 1},
    {"question": "How many e are in elephant?", "choices": ["1", "2", "3", "4"], "answer": "B"},
    {"question": "What is the capital of France?", "choices": ["Paris", "Rome"], "answer": 0},
    {"question": "Which is a colour?", "choices": ["dog", "red", "run"], "answer": "b"},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def test_the_answer_is_the_letter_the_logits_favour_among_the_choices(tmp_path):
    questions, problems = read_questions(write_jsonl(tmp_path / "q.jsonl", QUESTIONS))
    assert not problems and [q.answer for q in questions] == [1, 1, 0, 1]
    backend = NanochatBackend.open(DEMO, LoadOptions(device="cpu"))
    try:
        tok, model = backend.tok, backend.loaded.model
        letters = letter_ids(backend)
        assert letters == [tok.encode(letter)[0] for letter in LETTERS]
        for q in questions:
            # nanochat's render_for_completion of one user turn, built here from the tokenizer
            s = tok.special_id
            ids = [
                s("<|bos|>"),
                s("<|user_start|>"),
                *tok.encode(q.text()),
                s("<|user_end|>"),
                s("<|assistant_start|>"),
            ]
            with torch.inference_mode():
                logits = model(torch.tensor([ids]))[0, -1]
            focus = logits[letters[: len(q.choices)]]
            chosen, logprobs = ask(backend, q, letters)
            assert chosen == int(focus.argmax())
            assert torch.allclose(
                torch.tensor(logprobs), torch.log_softmax(logits, -1)[letters[: len(q.choices)]], atol=1e-4
            )
    finally:
        backend.close()


def test_a_sweep_answers_every_question_at_every_step_and_flips_mirror(tmp_path):
    questions, _ = read_questions(write_jsonl(tmp_path / "q.jsonl", QUESTIONS))
    points = timeline_of(DEMO).points
    seen: list[tuple[int, int]] = []
    answers = list(mc_sweep(points, questions, progress=lambda d, t: seen.append((d, t))))
    assert [(a.step, a.line) for a in answers] == [(p.step, q.line) for p in points for q in questions]
    assert seen[-1] == (len(points) * len(questions),) * 2
    scores = accuracy(answers)
    for p in points:
        right = [a.correct for a in answers if a.step == p.step]
        assert scores[(p.stage, p.step)] == sum(right) / len(questions)
    first, last = (points[0].stage, points[0].step), (points[-1].stage, points[-1].step)
    forward, backward = what_flipped(answers, first, last), what_flipped(answers, last, first)
    assert forward.lost == backward.gained and forward.gained == backward.lost
    by = {(a.step, a.line): a.correct for a in answers}
    for line in forward.lost:
        assert by[(first[1], line)] and not by[(last[1], line)]


def test_broken_lines_are_named_and_skipped(tmp_path):
    rows = [
        QUESTIONS[0],
        "not json",
        "[1, 2]",
        {"question": "", "choices": ["a", "b"], "answer": 0},
        {"question": "q", "choices": ["only one"], "answer": 0},
        {"question": "q", "choices": ["a", "b"], "answer": 2},
        {"question": "q", "choices": ["a", 3], "answer": 0},
        {"question": "q", "choices": ["a", "b" * 10_000], "answer": 0},
        {"question": "q", "choices": ["a", "b"], "answer": True},
        '{"question": ' * 50,
        QUESTIONS[1],
    ]
    path = write_jsonl(tmp_path / "q.jsonl", rows)
    questions, problems = read_questions(path)
    assert [q.line for q in questions] == [1, 11]
    assert len(problems) == 9
    assert [int(p.split(":")[1]) for p in problems] == list(range(2, 11))
    assert all(p.startswith(f"{path}:") and "\n" not in p and len(p) < 300 for p in problems)


def test_a_million_lines_are_read_in_bounded_time_and_say_so(tmp_path):
    path = tmp_path / "big.jsonl"
    line = json.dumps(QUESTIONS[0]) + "\n"
    with path.open("w", encoding="utf-8") as f:
        for _ in range(10):
            f.write(line * 100_000)
    questions, problems = read_questions(path)
    assert len(questions) == MAX_QUESTIONS
    assert problems[-1] == f"{path}: only the first {MAX_QUESTIONS:,} questions are used"


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\xff\xfe garbage\n", b'{"question": "q"}\n'])
def test_a_file_with_no_usable_question_is_one_line(tmp_path, content):
    path = tmp_path / "q.jsonl"
    path.write_bytes(content)
    with pytest.raises(FileRefused, match="no usable question"):
        read_questions(path)


def test_a_question_reads_as_nanochat_renders_it():
    q = Question(1, "What is 2 + 3?", ("4", "5"), 1)
    assert q.text() == (
        "Multiple Choice question: What is 2 + 3?\n- 4=A\n- 5=B\n\n"
        "Respond only with the letter of the correct answer."
    )


def test_nanoscope_eval_mc_prints_each_answer_then_what_flipped(tmp_path, capsys):
    data = write_jsonl(tmp_path / "q.jsonl", [*QUESTIONS, "broken"])
    steps = [p.step for p in timeline_of(DEMO).points]
    argv = ["eval", str(DEMO), "--task", "mc", "--data", str(data), "--steps", f"{steps[0]},{steps[-1]}"]
    assert cli.main([*argv, "--device", "cpu", "--json"]) == 0
    out, err = capsys.readouterr()
    *answers, flips = [json.loads(line) for line in out.splitlines()]
    asked = [(s, n) for s in (steps[0], steps[-1]) for n in (1, 2, 3, 4)]
    assert [(a["step"], a["line"]) for a in answers] == asked
    assert all(a["correct"] == (a["chosen"] == a["answer"]) for a in answers)
    right = {(a["step"], a["line"]): a["correct"] for a in answers}
    lost = [n for n in (1, 2, 3, 4) if right[(steps[0], n)] and not right[(steps[-1], n)]]
    assert [f["line"] for f in flips["lost"]] == lost and flips["task"] == "mc"
    assert err.count("\n") == 1 and f"{data}:5: not a JSON object" in err


@pytest.mark.parametrize("data", [None, "/dev/zero", "missing.jsonl"])
def test_nanoscope_eval_mc_without_usable_data_is_one_line(capsys, data):
    argv = ["eval", str(DEMO), "--task", "mc"] + (["--data", data] if data else [])
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1
