"""The markdown tables of a run: losses per step, and accuracy per step through the engine."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from desktop.engine.nanochat.checkpoint import model_steps

from . import snapshots
from .grading import BUCKETS, SHOWCASE, TEN_IN_A_ROW, Grades, grade_chats, open_step
from .pipeline import Corpus, held_out_chats
from .settings import RunSettings
from .training import TrainingLog

logger = logging.getLogger(__name__)


class DemoCheckError(RuntimeError):
    """The saved model fails the question the app's smoke test asks."""


def loss_table(log: TrainingLog, marks: Sequence[int]) -> str:
    rows = [
        "| step | train loss (EMA) | val loss, chat | val bpb, chat | val loss, prose |",
        "|---:|---:|---:|---:|---:|",
    ]
    ema = dict(log.train_curve)
    for step, losses in log.evals:
        if step % (log.steps // 8 or 1) and step not in marks:
            continue
        train_loss = f"{ema[step]:.3f}" if step in ema else "–"
        saved = " (saved)" if step in marks else ""
        (chat, bpb), (prose, _) = losses["chat"], losses["prose"]
        rows.append(f"| {step}{saved} | {train_loss} | {chat:.3f} | {bpb:.3f} | {prose:.3f} |")
    return "\n".join(rows)


def grade_steps(s: RunSettings, corpus: Corpus) -> tuple[str, dict[int, Grades]]:
    """Grade every saved step through the engine; the markdown tables and the grades per step."""
    directory = snapshots.checkpoint_dir(s)
    steps = model_steps(directory)
    chats = held_out_chats(s, corpus)
    results: dict[int, Grades] = {}
    lines = [
        f"Held-out chats: {len(chats)} chats of {s.grade_exchanges} questions each, greedy, in the engine.",
        "",
        "| step | turns | questions | whole reply exact | final answer correct |",
        "|---:|---|---:|---:|---:|",
    ]
    extra = ["", "| step | showcase (fresh chats) | ten questions in one chat |", "|---:|---:|---:|"]
    for step in steps:
        started = time.perf_counter()
        backend = open_step(directory, step)
        grades = grade_chats(backend, chats)
        results[step] = grades
        for label, _, _ in BUCKETS:
            if grades.by_turn[label].n:
                lines.append(f"| {step} | {label} | {grades.by_turn[label].cells()} |")
        lines.append(f"| {step} | all | {grades.total().cells()} |")
        showcase = grade_chats(backend, [[ex] for ex in SHOWCASE]).total()
        ten = grade_chats(backend, [TEN_IN_A_ROW]).total()
        extra.append(
            f"| {step} | {showcase.exact}/{showcase.n} exact, {showcase.final}/{showcase.n} right "
            f"| {ten.exact}/{ten.n} exact, {ten.final}/{ten.n} right |"
        )
        logger.info("graded step %d in %.0fs", step, time.perf_counter() - started)
        backend.close()
    last = results[steps[-1]] if steps else None
    if last is not None:
        kinds = [
            "",
            "| kind (last step) | questions | whole reply exact | final answer correct |",
            "|---|---:|---:|---:|",
        ]
        kinds += [f"| {kind} | {t.cells()} |" for kind, t in sorted(last.by_kind.items())]
        misses = ["", f"Misses of the last step ({len(last.misses)}):", *(f"- {m}" for m in last.misses[:40])]
        extra += kinds + misses
    return "\n".join(lines + extra), results


def check_twelve_times_seven(s: RunSettings) -> None:
    """The app's smoke test asks this of the last step; refuse to ship a model that fails it."""
    directory = snapshots.checkpoint_dir(s)
    backend = open_step(directory, model_steps(directory)[-1])
    grades = grade_chats(backend, [[SHOWCASE[0]]])
    backend.close()
    if not grades.total().final:
        raise DemoCheckError(f"{SHOWCASE[0].question!r} does not get {SHOWCASE[0].result}: {grades.misses}")
