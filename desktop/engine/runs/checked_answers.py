"""Problems with one right answer, written out by each step and checked (Qt-free).

As nanochat's GSM8K task checks a reply: the number after ``#### `` is the answer. Small models
seldom write the marker, so a reply without it is read for its last number instead, and the
result says how many replies used the marker. The reply is written greedily, as a chat turn
where the checkpoint has chat tokens (a base checkpoint continues "Question: … Answer:"), and
the calculator tool calls it makes (``<|python_start|>``) are counted.

The bundled set is generated here, not downloaded, with a fixed seed: arithmetic ("What is 37
times 12?") and letter counting ("How many r are in strawberry?"), the two skills nanochat's SFT
teaches with its calculator (its SpellingBee task).
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from desktop.engine.backend import Backend, LoadOptions
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.engine.runs.sweep import EvalTask, step_sweep
from desktop.engine.runs.timeline import Point

REPLY_TOKENS = 64
PYTHON_START = "<|python_start|>"
WORDS = (
    "strawberry", "banana", "elephant", "mississippi", "committee", "bookkeeper", "parallel",
    "giraffe", "coffee", "assessment", "balloon", "raspberry", "tomorrow", "possession",
)  # fmt: skip
MARKED = re.compile(r"####\s*(-?[\d,]+(?:\.\d+)?)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Problem:
    line: int  # its number in the set, 1-based (the key "what flipped" names it by)
    question: str
    answer: str  # the right number, as text


@dataclass(frozen=True)
class Checked:
    """One step's reply to one problem, and what was read from it."""

    stage: str
    step: int
    line: int
    reply: str
    given: str | None  # the number read from the reply
    marked: bool  # it followed "#### "
    calculator_calls: int
    answer: str

    @property
    def correct(self) -> bool:
        return self.given is not None and _same_number(self.given, self.answer)

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "correct": self.correct}


def bundled_problems(count: int = 40, seed: int = 0) -> list[Problem]:
    """The bundled set: arithmetic and letter counting in turn, the same for every ``seed``."""
    rng = random.Random(seed)
    problems: list[Problem] = []
    for line in range(1, count + 1):
        if line % 2:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            word, value = rng.choice((("plus", a + b), ("minus", a - b), ("times", a * b)))
            problems.append(Problem(line, f"What is {a} {word} {b}?", str(value)))
        else:
            word = rng.choice(WORDS)
            letter = rng.choice(sorted(set(word)))
            problems.append(Problem(line, f"How many {letter} are in {word}?", str(word.count(letter))))
    return problems


def read_answer(reply: str) -> tuple[str | None, bool]:
    """The number a reply gives: after "#### " (nanochat's GSM8K marker), else its last number."""
    marked = MARKED.findall(reply)
    if marked:
        return marked[-1], True
    numbers = NUMBER.findall(reply)
    return (numbers[-1], False) if numbers else (None, False)


def _same_number(given: str, answer: str) -> bool:
    try:
        return float(given.replace(",", "")) == float(answer.replace(",", ""))
    except ValueError:
        return False


def check(backend: Backend, problem: Problem, cancel: threading.Event) -> tuple[str, int]:
    """The step's greedy reply to ``problem`` and its calculator calls."""
    if backend.info().capabilities.chat:
        prompt = backend.render([Message.of_text("user", problem.question)], REPLY_TOKENS, chat=True)
    else:
        prompt = backend.render(f"Question: {problem.question}\nAnswer:", REPLY_TOKENS, chat=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS)
    events = list(backend.stream(prompt, greedy, cancel))
    calls = sum(1 for ev in events if ev.special == PYTHON_START)
    return "".join(ev.text for ev in events), calls


def answers_task(problems: Sequence[Problem], cancel: threading.Event | None = None) -> EvalTask:
    """Checked answers as one task of a :func:`~desktop.engine.runs.sweep.tasks_sweep` (named
    "answers"; each result a :class:`Checked`); ``cancel`` stops the reply being written."""
    cancel = cancel or threading.Event()

    def answer(backend: Backend, point: Point, problem: Problem) -> Checked:
        reply, calls = check(backend, problem, cancel)
        given, marked = read_answer(reply)
        return Checked(point.stage, point.step, problem.line, reply, given, marked, calls, problem.answer)

    return EvalTask("answers", problems, answer)


def answer_sweep(
    points: Sequence[Point],
    problems: Sequence[Problem],
    *,
    options: LoadOptions | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[Checked]:
    """Each step's checked reply to each problem, one checkpoint open at a time; ``cancel``
    stops after the reply being written."""
    cancel = cancel or threading.Event()
    task = answers_task(problems, cancel)
    return step_sweep(points, task.items, task.ask, options=options, cancel=cancel, progress=progress)
