"""``python -m tools.demo``: train the bundled demo model, save several steps, grade them.

    python -m tools.demo --out resources/demo --plot docs/demo_loss.png --report /tmp/demo.md
    python -m tools.demo --grade-only --out resources/demo      # grade the files already there
    python -m tools.demo --preset tiny --out /tmp/demo-tiny      # seconds: the same code paths

Everything is drawn from the seed: the chats, the prose split, the tokenizer, the initial weights
and the batch order. The output is nanochat's layout, so the app loads it like a user's own::

    <out>/chatsft_checkpoints/demo/model_<step>.pt + meta_<step>.json   (one pair per saved step)
    <out>/tokenizer/tokenizer.pkl
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from desktop.engine.errors import NanoscopeError

from .bpe import TokenizerTrainingError
from .pipeline import make_corpus, run_training
from .plot import draw_loss_curve
from .report import DemoCheckError, check_twelve_times_seven, grade_steps, loss_table
from .settings import PRESETS, RunSettings, preset
from .training import ModelMismatchError, TimeLimitError

logger = logging.getLogger(__name__)


def parse_args(argv: Sequence[str] | None) -> tuple[RunSettings, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--out", type=Path, help="output base dir (default resources/demo)")
    ap.add_argument("--steps", type=int, help="optimizer steps (the LR schedule spans them)")
    ap.add_argument("--snapshots", type=int, help="evenly spaced steps to save")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--threads", type=int, help="torch threads (part of the result)")
    ap.add_argument("--minutes", type=float, help="fail if training takes longer")
    ap.add_argument("--plot", type=Path, help="write the loss curve PNG here")
    ap.add_argument("--report", type=Path, help="write the markdown tables here")
    ap.add_argument("--grade-only", action="store_true", help="only grade the files already in --out")
    ap.add_argument("--no-grade", action="store_true", help="skip grading through the engine")
    args = ap.parse_args(argv)
    names = ("out", "steps", "snapshots", "seed", "threads", "minutes")
    changes = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    settings = preset(args.preset, **changes)
    if settings.snapshots < 1 or not 0 < settings.first_snapshot < settings.steps:
        ap.error(f"need at least one snapshot, and more than {settings.first_snapshot} steps (the first one)")
    return replace(settings, window_pattern=settings.window_pattern.upper()), args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("rustbpe").setLevel(logging.WARNING)  # one line per merge otherwise
    s, args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        return run(s, args)
    finally:
        torch.set_num_threads(threads)  # a caller in the same process (the tests) keeps its own


def run(s: RunSettings, args: argparse.Namespace) -> int:
    started = time.perf_counter()
    torch.manual_seed(s.seed)
    try:
        corpus = make_corpus(s)
        report = [f"settings: {s}"]
        if not args.grade_only:
            log = run_training(s, corpus)
            size = sum(f.stat().st_size for f in s.out.rglob("*") if f.is_file())
            report += [
                f"training: {log.steps} steps in {log.minutes:.1f} min, {log.tokens:,} tokens in batches",
                f"files: {size / 1e6:.2f} MB in {s.out}",
                "",
                loss_table(log, s.snapshot_steps),
            ]
            if args.plot is not None:
                curves = {"train (EMA of batch loss)": log.train_curve}
                for name in ("chat", "prose"):
                    curves[f"validation, {name}"] = [(st, losses[name][0]) for st, losses in log.evals]
                draw_loss_curve(args.plot, curves, s.snapshot_steps)
        if s.require_showcase:
            check_twelve_times_seven(s)
        if not args.no_grade:
            tables, _ = grade_steps(s, corpus)
            report += ["", tables]
    except ModuleNotFoundError as exc:
        if exc.name != "rustbpe":
            raise
        logger.error("the demo trainer needs rustbpe: pip install -e '.[demo]'")
        return 1
    except (
        TokenizerTrainingError,
        TimeLimitError,
        ModelMismatchError,
        DemoCheckError,
        NanoscopeError,
    ) as exc:
        logger.error("%s", exc)
        return 1
    report.append(f"\ntotal wall time {(time.perf_counter() - started) / 60:.1f} min")
    text = "\n".join(report) + "\n"
    if args.report is not None:
        args.report.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0
