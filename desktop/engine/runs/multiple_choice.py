"""Multiple choice across a run's steps, scored by nanochat's own categorical method (Qt-free).

nanochat's ``scripts/chat_eval.py`` (``run_categorical_eval``) asks each question as a user turn
in ``tasks/common.py``'s ``render_mc`` format (each choice followed by ``=`` and its letter, no
space, as the answer is the bare letter), renders the conversation up to the assistant's turn,
and reads the model's logits at that last position *restricted to the letters of the choices*:
the predicted answer is the letter with the highest logit. Log-probabilities rank the letters as
the logits do (one softmax normaliser for all), so the backend's teacher-forced scoring of each
letter gives the same answer.

A base checkpoint (no chat tokens) is asked the same text as a completion, followed by
``\\nAnswer:``; it was not trained to answer so, and scores near chance until it is.

The questions come from a JSONL file the user points at, one object per line (docs/EVALS.md)::

    {"question": "What is 2 + 3?", "choices": ["4", "5", "6"], "answer": 1}

``answer`` is the index of the right choice, or its letter ("B"). A line that cannot be used is
one problem line naming the file and line and is skipped; only the head of a huge file is read.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from desktop.engine.backend import Backend, LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import FileRefused, parse_json, read_head_lines
from desktop.engine.messages import Message
from desktop.engine.runs.records import parse_records
from desktop.engine.runs.sweep import EvalTask, step_sweep
from desktop.engine.runs.timeline import Point

LETTERS = "ABCDEFGHIJ"
MAX_QUESTIONS = 5_000  # a sweep over 20 steps asks each of them once per step
MAX_LINE_CHARS = 64_000
MAX_CHOICE_CHARS = 2_000


@dataclass(frozen=True)
class Question:
    line: int  # 1-based, in the file
    question: str
    choices: tuple[str, ...]
    answer: int  # index into choices

    def text(self) -> str:
        """nanochat's ``render_mc``: the letter after each choice, no space before it."""
        rows = "".join(
            f"- {choice}={letter}\n" for letter, choice in zip(LETTERS, self.choices, strict=False)
        )
        ask = "Respond only with the letter of the correct answer."
        return f"Multiple Choice question: {self.question}\n{rows}\n{ask}"


@dataclass(frozen=True)
class Answer:
    """One step's answer to one question."""

    stage: str
    step: int
    line: int
    chosen: int
    answer: int
    logprobs: tuple[float, ...]  # of each choice's letter at the answer position

    @property
    def correct(self) -> bool:
        return self.chosen == self.answer

    def to_dict(self) -> dict[str, object]:
        return {
            "stage": self.stage,
            "step": self.step,
            "line": self.line,
            "chosen": LETTERS[self.chosen],
            "answer": LETTERS[self.answer],
            "correct": self.correct,
            "logprobs": list(self.logprobs),
        }


def read_questions(path: Path) -> tuple[list[Question], list[str]]:
    """The usable questions of a JSONL file, and one line per problem (the first few named,
    then a count). FileRefused when the file itself cannot be read."""
    lines, more = read_head_lines(path, "eval_data", MAX_QUESTIONS * 4)
    questions, problems, stopped = parse_records(
        lines, lambda line, number: _question(line, number, path), path, MAX_QUESTIONS
    )
    more = more or stopped
    if more:
        problems.append(f"{path}: only the first {len(questions):,} questions are used")
    if not questions:
        raise FileRefused(path, "no usable question (one JSON object per line: question, choices, answer)")
    return questions, problems


def _question(line: str, number: int, path: Path) -> Question:
    if len(line) > MAX_LINE_CHARS:
        raise ValueError(f"a line of {len(line):,} characters (at most {MAX_LINE_CHARS:,})")
    try:
        data = parse_json(line, f"{path}:{number}", max_depth=4)
    except FileRefused as exc:
        raise ValueError("not a JSON object") from exc
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    question, choices, answer = data.get("question"), data.get("choices"), data.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("no question text")
    if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS):
        raise ValueError(f"choices must be a list of 2 to {len(LETTERS)} texts")
    if not all(isinstance(c, str) and 0 < len(c) <= MAX_CHOICE_CHARS for c in choices):
        raise ValueError(f"each choice must be a text of 1 to {MAX_CHOICE_CHARS:,} characters")
    if isinstance(answer, str) and len(answer) == 1 and answer.upper() in LETTERS[: len(choices)]:
        answer = LETTERS.index(answer.upper())
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise ValueError(f"answer must be a choice's index (0-{len(choices) - 1}) or letter")
    return Question(number, question, tuple(choices), answer)


def letter_ids(backend: Backend) -> list[int]:
    """Each letter's token id, as nanochat requires: one token per letter, else one line."""
    ids = []
    for letter in LETTERS:
        encoded = backend.encode(letter)
        if len(encoded) != 1:
            raise NanoscopeError(
                f"the letter {letter} is {len(encoded)} tokens for this tokenizer; it must be one"
            )
        ids.append(encoded[0])
    return ids


def ask(backend: Backend, question: Question, letters: Sequence[int]) -> tuple[int, tuple[float, ...]]:
    """The letter the model's logits favour at the answer position, among this question's
    choices, and each letter's log-probability there."""
    if backend.info().capabilities.chat:
        prompt = backend.render([Message.of_text("user", question.text())], 1, chat=True)
    else:
        prompt = backend.render(question.text() + "\nAnswer:", 1, chat=False)
    mine = [letters[i] for i in range(len(question.choices))]
    # One pass: every letter's log-probability at the answer position.
    logprobs = tuple(float(lp) for lp in backend.score(prompt, mine[:1], choices=mine)["choice_logprobs"])
    chosen = max(range(len(logprobs)), key=lambda i: logprobs[i] if math.isfinite(logprobs[i]) else -math.inf)
    return chosen, logprobs


def mc_task(questions: Sequence[Question]) -> EvalTask:
    """Multiple choice as one task of a :func:`~desktop.engine.runs.sweep.tasks_sweep` (named
    "mc"; each result an :class:`Answer`)."""

    def answer(backend: Backend, point: Point, question: Question) -> Answer:
        chosen, logprobs = ask(backend, question, letter_ids(backend))
        return Answer(point.stage, point.step, question.line, chosen, question.answer, logprobs)

    return EvalTask("mc", questions, answer)


def mc_sweep(
    points: Sequence[Point],
    questions: Sequence[Question],
    *,
    options: LoadOptions | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[Answer]:
    """Each step's answer to each question, step after step, one checkpoint open at a time;
    ``progress(done, total)`` after each answer; ``cancel`` stops after the question in hand."""
    task = mc_task(questions)
    return step_sweep(points, task.items, task.ask, options=options, cancel=cancel, progress=progress)
