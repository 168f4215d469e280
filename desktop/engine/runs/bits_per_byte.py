"""Bits per byte of a text the user picks, at every step of a run (Qt-free).

nanochat's own measure (``nanochat/loss_eval.py`` ``evaluate_bpb``): the nats the model spends
on each target token, summed, over ln 2, over the UTF-8 bytes those tokens stand for (special
tokens count neither). It does not depend on the tokenizer's vocabulary size, so steps, depths
and runs with other tokenizers compare on one scale.

The text is cut into windows of the model's context, each scored after the prompt an empty
completion renders (BOS where the model has one), so every token of the text is a target
exactly once. Only the head of the file is read (``eval_text`` in engine/files), and at most
:data:`MAX_TOKENS` tokens are scored; the result says when it stopped short.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from desktop.engine.backend import Backend, LoadOptions, Prompt
from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import read_head_text
from desktop.engine.runs.sweep import EvalTask, step_sweep
from desktop.engine.runs.timeline import Point

MAX_TOKENS = 65_536  # scored per step: a few seconds at d4, about a minute at d12 on a laptop CPU


@dataclass(frozen=True)
class BitsPerByte:
    stage: str
    step: int
    bits_per_byte: float
    tokens: int
    bytes: int
    cut: bool  # the text was longer than what was scored

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def read_text(path: Path) -> tuple[str, bool]:
    """The text to measure, and whether the file held more than is read."""
    text, more = read_head_text(path, "eval_text")
    if not text.strip():
        raise NanoscopeError(f"{path}: no text to measure")
    return text, more


def measure(
    backend: Backend, text: str, cancel: threading.Event | None = None
) -> tuple[float, int, int, bool] | None:
    """(bits per byte, tokens scored, bytes, cut short) of ``text`` under one loaded model;
    None when ``cancel`` was set before the end."""
    ids = backend.encode(text)
    cut = len(ids) > MAX_TOKENS
    ids = ids[:MAX_TOKENS]
    lead = backend.render("", None, chat=False)
    if not lead.ids:  # no BOS: the text's first token is the context of the rest
        lead, ids = Prompt((), tuple(ids[:1]), 1, lead.context_length), ids[1:]
    window = max(1, lead.context_length - len(lead.require_ids()))
    nats, n_bytes, scored = 0.0, 0, 0
    for start in range(0, len(ids), window):
        if cancel is not None and cancel.is_set():
            return None
        part = ids[start : start + window]
        result = backend.score(lead, part)
        nats -= sum(result["token_logprobs"])
        n_bytes += result["bytes"]
        scored += len(part)
    if not n_bytes:
        raise NanoscopeError("the text is no bytes to this tokenizer")
    return nats / math.log(2) / n_bytes, scored, n_bytes, cut


def bpb_task(text: str, cut: bool = False, cancel: threading.Event | None = None) -> EvalTask:
    """Bits per byte of ``text`` as one task of a :func:`~desktop.engine.runs.sweep.tasks_sweep`
    (named "bpb", one item: the text; each result a :class:`BitsPerByte`). ``cut``: the file
    held more than ``text``."""

    def ask(backend: Backend, point: Point, whole: str) -> BitsPerByte | None:
        measured = measure(backend, whole, cancel)
        if measured is None:
            return None
        bpb, tokens, n_bytes, short = measured
        return BitsPerByte(point.stage, point.step, bpb, tokens, n_bytes, cut or short)

    return EvalTask("bpb", [text], ask)


def bpb_sweep(
    points: Sequence[Point],
    text: str,
    cut: bool = False,
    *,
    options: LoadOptions | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[BitsPerByte]:
    """Each step's bits per byte on ``text``, one checkpoint open at a time."""
    cancel = cancel or threading.Event()
    task = bpb_task(text, cut, cancel)
    return step_sweep(points, task.items, task.ask, options=options, cancel=cancel, progress=progress)
