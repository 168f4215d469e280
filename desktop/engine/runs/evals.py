"""Evaluations swept across the saved steps of a run (Qt-free): one checkpoint in memory at a time.

The first task is nanochat's own progress check: during base training it samples seven prompts,
greedy, 16 tokens, at every evaluation (``scripts/base_train.py``). Run over a run's saved
steps, it shows side by side what each step says; the user's own prompts can stand in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from desktop.engine.backend import Backend, LoadOptions
from desktop.engine.params import SamplingParams
from desktop.engine.runs.sweep import EvalTask, step_sweep
from desktop.engine.runs.timeline import Point

# scripts/base_train.py's sampled prompts, in its order.
SAMPLE_PROMPTS = (
    "The capital of France is",
    "The chemical symbol of gold is",
    "If yesterday was Friday, then tomorrow will be",
    "The opposite of hot is",
    "The planets of the solar system are:",
    "My favorite color is",
    "If 5*x + 3 = 13, then x is",
)
SAMPLE_TOKENS = 16  # as nanochat samples them
MAX_PROMPTS = 100


@dataclass(frozen=True)
class Sample:
    stage: str
    step: int
    prompt: str
    ids: tuple[int, ...]
    text: str

    def to_dict(self) -> dict[str, object]:
        return {
            "stage": self.stage,
            "step": self.step,
            "prompt": self.prompt,
            "ids": list(self.ids),
            "text": self.text,
        }


def samples_task(
    prompts: Sequence[str] = SAMPLE_PROMPTS,
    cancel: threading.Event | None = None,
    max_tokens: int = SAMPLE_TOKENS,
) -> EvalTask:
    """Sample prompts as one task of a :func:`~desktop.engine.runs.sweep.tasks_sweep` (named
    "samples"; each result a :class:`Sample`): each prompt as a completion (BOS + text),
    continued greedily."""
    if not 0 < len(prompts) <= MAX_PROMPTS:
        raise ValueError(f"between 1 and {MAX_PROMPTS} prompts, got {len(prompts)}")
    cancel = cancel or threading.Event()
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    def ask(backend: Backend, point: Point, prompt: str) -> Sample:
        events = list(backend.stream(backend.render(prompt, max_tokens), greedy, cancel))
        ids = tuple(ev.id for ev in events if not ev.continues)
        return Sample(point.stage, point.step, prompt, ids, "".join(ev.text for ev in events))

    return EvalTask("samples", list(prompts), ask)


def sample_sweep(
    points: Sequence[Point],
    prompts: Sequence[str] = SAMPLE_PROMPTS,
    *,
    options: LoadOptions | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_tokens: int = SAMPLE_TOKENS,
) -> Iterator[Sample]:
    """Each step's greedy continuation of each prompt, step after step; the previous step is
    closed before the next opens. ``progress(done, total)`` after each prompt; ``cancel`` stops
    after the prompt being written."""
    cancel = cancel or threading.Event()
    task = samples_task(prompts, cancel, max_tokens)
    return step_sweep(points, task.items, task.ask, options=options, cancel=cancel, progress=progress)
