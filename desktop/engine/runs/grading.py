"""What every graded evaluation shares: each step's share of right answers, and what flipped
between two steps (Qt-free). An answer is anything with a stage, a step, the line of its question
and whether it was right (multiple choice, checked answers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class Graded(Protocol):
    @property
    def stage(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def line(self) -> int: ...
    @property
    def correct(self) -> bool: ...


def accuracy(answers: Sequence[Graded]) -> dict[tuple[str, int], float]:
    """The share of right answers per (stage, step)."""
    asked: dict[tuple[str, int], list[bool]] = {}
    for a in answers:
        asked.setdefault((a.stage, a.step), []).append(a.correct)
    return {key: sum(right) / len(right) for key, right in asked.items()}


@dataclass(frozen=True)
class Flips:
    """Between an earlier and a later step: the questions (by line) the later one got wrong
    that the earlier one got right, and those it newly got right."""

    lost: tuple[int, ...]
    gained: tuple[int, ...]


def what_flipped(answers: Sequence[Graded], earlier: tuple[str, int], later: tuple[str, int]) -> Flips:
    before = {a.line: a.correct for a in answers if (a.stage, a.step) == earlier}
    after = {a.line: a.correct for a in answers if (a.stage, a.step) == later}
    both = sorted(set(before) & set(after))
    return Flips(
        lost=tuple(line for line in both if before[line] and not after[line]),
        gained=tuple(line for line in both if after[line] and not before[line]),
    )


@dataclass(frozen=True)
class Flipped:
    """One example that changed between two steps, with what it asks, so the window can open
    a side-by-side Compare of ``earlier`` and ``later`` on ``prompt``."""

    line: int
    prompt: str
    lost: bool  # True: the earlier step was right and the later wrong; False: the reverse
    earlier: tuple[str, int]
    later: tuple[str, int]

    def to_dict(self) -> dict[str, object]:
        return {
            "line": self.line,
            "prompt": self.prompt,
            "flip": "lost" if self.lost else "gained",
            "earlier": list(self.earlier),
            "later": list(self.later),
        }


def flipped_examples(
    answers: Sequence[Graded],
    earlier: tuple[str, int],
    later: tuple[str, int],
    prompts: Mapping[int, str],
) -> list[Flipped]:
    """:func:`what_flipped` as examples: the lost ones, then the gained, each by line with its
    prompt from ``prompts`` (line -> what the example asks; "" when it is not given)."""
    flips = what_flipped(answers, earlier, later)
    return [
        Flipped(line, prompts.get(line, ""), lost, earlier, later)
        for lines, lost in ((flips.lost, True), (flips.gained, False))
        for line in lines
    ]
