"""``nanoscope timeline RUN [--json]``: a training run's saved steps and the numbers their files state;
``nanoscope eval RUN --task samples [--steps A,B] [--prompt TEXT]... [--json]``: what each step says;
``nanoscope eval RUN --task mc --data FILE.jsonl [--steps A,B] [--json]``: multiple choice by
nanochat's categorical method, each step's accuracy and what flipped from the first to the last;
``nanoscope eval RUN --task bpb --data FILE.txt [--steps A,B] [--json]``: bits per byte per step;
``nanoscope eval RUN --task answers [--steps A,B] [--json]``: the bundled arithmetic and letter
counting problems, each reply checked, calculator calls counted.

RUN is a nanochat checkpoint folder (``<phase>_checkpoints/<tag>``, whose other stages join it),
``SOURCE[/TAG]`` under ``$NANOCHAT_BASE_DIR``, or a KempnerForge run. The timeline reads metas
only; an eval loads one step at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from desktop.config import paths

if TYPE_CHECKING:
    from desktop.engine.backend import LoadOptions

T = TypeVar("T")


def add_timeline_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("timeline", help="a training run's saved steps and their numbers (metas only)")
    p.add_argument(
        "run", help="checkpoint folder, KempnerForge run, or SOURCE[/TAG] with SOURCE in base|mid|sft|rl"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a run's saved steps, one at a time")
    p.add_argument("run", help="as for timeline")
    p.add_argument(
        "--task",
        choices=["samples", "mc", "bpb", "answers"],
        required=True,
        help="samples: nanochat's seven base_train prompts (or --prompt), greedy, 16 tokens; "
        "mc: multiple choice from --data (JSONL: question, choices, answer), nanochat's scoring; "
        "bpb: bits per byte of the text in --data; "
        "answers: bundled arithmetic and letter counting, replies checked",
    )
    p.add_argument("--data", default=None, help="the questions (mc) or the text (bpb); docs/EVALS.md")
    p.add_argument("--steps", default=None, help="comma-separated steps (default: every saved step)")
    p.add_argument("--prompt", action="append", default=None, help="your own prompt (repeatable)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true", help="one JSON line per sample or answer")


def cmd_eval(args: argparse.Namespace) -> int:
    from desktop.engine.backend import LoadOptions
    from desktop.engine.discovery import resolve_spec
    from desktop.engine.errors import NanoscopeError
    from desktop.engine.runs.evals import SAMPLE_PROMPTS, sample_sweep
    from desktop.engine.runs.timeline import timeline_of

    base = paths.nanochat_base_dir()
    directory, _step = resolve_spec(args.run, base)
    points = list(timeline_of(directory).points)
    if args.steps:
        try:
            wanted = {int(s) for s in args.steps.split(",")}
        except ValueError:
            raise NanoscopeError(f"--steps {args.steps!r}: comma-separated step numbers") from None
        missing = wanted - {p.step for p in points}
        if missing:
            raise NanoscopeError(f"{directory}: no saved step {', '.join(map(str, sorted(missing)))}")
        points = [p for p in points if p.step in wanted]
    options = LoadOptions(device=args.device, base_dir=base, kernel_cache=paths.kernel_timings_file())
    if args.task == "mc":
        return _multiple_choice(args, points, options)
    if args.task == "bpb":
        return _bits_per_byte(args, points, options)
    if args.task == "answers":
        return _checked_answers(args, points, options)
    prompts = args.prompt or list(SAMPLE_PROMPTS)
    shown = None
    for sample in sample_sweep(points, prompts, options=options):
        if args.json:
            print(json.dumps(sample.to_dict()), flush=True)
            continue
        if (sample.stage, sample.step) != shown:
            shown = (sample.stage, sample.step)
            print(f"{sample.stage} step {sample.step}:", flush=True)
        print(f"  {sample.prompt}{sample.text!r}", flush=True)
    return 0


def _said_kept(results: Iterator[tuple[T, bool]]) -> Iterator[T]:
    """The results, with one line on stderr for each step whose results were kept from before."""
    said: set[tuple[str, int]] = set()
    for result, kept in results:
        step = (getattr(result, "stage", ""), getattr(result, "step", 0))
        if kept and step not in said:
            said.add(step)
            print(
                f"nanoscope: {step[0]} step {step[1]}: kept results (same weights, same task)",
                file=sys.stderr,
            )
        yield result


def _checked_answers(args: argparse.Namespace, points: list, options: LoadOptions) -> int:
    from desktop.engine.runs.checked_answers import bundled_problems
    from desktop.engine.runs.grading import accuracy
    from desktop.store.eval_results import kept_answers, shared_results

    problems = bundled_problems()
    checked = []
    for result in _said_kept(kept_answers(shared_results(), points, problems, options, threading.Event())):
        checked.append(result)
        if args.json:
            print(json.dumps(result.to_dict()), flush=True)
    if not args.json:
        for (stage, step), share in accuracy(checked).items():
            mine = [c for c in checked if (c.stage, c.step) == (stage, step)]
            calls = sum(c.calculator_calls for c in mine)
            marked = sum(c.marked for c in mine)
            print(
                f"{stage} step {step}: {share:.1%} right of {len(mine)}, {calls} calculator calls, "
                f"{marked} answers after ####",
                flush=True,
            )
    return 0


def _read_data(args: argparse.Namespace, read: Callable[[Path], T], needs: str) -> T:
    """What ``--data`` names, read by ``read``; one line when it is missing or cannot be read."""
    from desktop.engine.errors import NanoscopeError
    from desktop.engine.files.bounded import FileRefused

    if not args.data:
        raise NanoscopeError(f"--task {args.task} needs --data {needs}")
    try:
        return read(Path(args.data).expanduser())
    except FileRefused as exc:
        raise NanoscopeError(str(exc)) from None


def _bits_per_byte(args: argparse.Namespace, points: list, options: LoadOptions) -> int:
    from desktop.engine.runs.bits_per_byte import read_text
    from desktop.store.eval_results import kept_bits, shared_results

    text, more = _read_data(args, read_text, "FILE (the text to measure)")
    for result in _said_kept(kept_bits(shared_results(), points, text, more, options, threading.Event())):
        if args.json:
            print(json.dumps(result.to_dict()), flush=True)
        else:
            short = " (the text's start only)" if result.cut else ""
            print(
                f"{result.stage} step {result.step}: {result.bits_per_byte:.4f} bits per byte over "
                f"{result.tokens:,} tokens, {result.bytes:,} bytes{short}",
                flush=True,
            )
    return 0


def _multiple_choice(args: argparse.Namespace, points: list, options: LoadOptions) -> int:
    from desktop.engine.runs.grading import accuracy, what_flipped
    from desktop.engine.runs.multiple_choice import read_questions
    from desktop.store.eval_results import kept_choices, shared_results

    questions, problems = _read_data(args, read_questions, "FILE.jsonl (question, choices, answer per line)")
    for problem in problems:
        print(f"nanoscope: warning: {problem}", file=sys.stderr)
    answers = []
    for answer in _said_kept(kept_choices(shared_results(), points, questions, options, threading.Event())):
        answers.append(answer)
        if args.json:
            print(json.dumps(answer.to_dict()), flush=True)
    scores = accuracy(answers)
    if not args.json:
        for (stage, step), share in scores.items():
            right = round(share * len(questions))
            print(f"{stage} step {step}: {right}/{len(questions)} right ({share:.1%})", flush=True)
    if len(scores) >= 2:
        first, *_, last = scores
        flips = what_flipped(answers, first, last)
        if args.json:
            shown = {"from": list(first), "to": list(last), "lost": flips.lost, "gained": flips.gained}
            print(json.dumps(shown))
        else:
            lost, gained = list(flips.lost), list(flips.gained)
            print(f"from step {first[1]} to {last[1]}: lost lines {lost}, gained lines {gained}")
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    from desktop.engine.discovery import resolve_spec
    from desktop.engine.runs.timeline import timeline_of

    directory, _step = resolve_spec(args.run, paths.nanochat_base_dir())
    timeline = timeline_of(directory)
    for problem in timeline.problems:
        print(f"nanoscope: warning: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps(timeline.to_dict()))
        return 0
    metrics = timeline.metric_names()
    print(f"{timeline.name}: {len(timeline.points)} saved steps")
    header = ["stage", "step", "tokens", *metrics, "MB"]
    rows = [
        [
            p.stage,
            str(p.step),
            f"{p.tokens:,}" if p.tokens is not None else "",
            *(f"{p.metrics[m]:.6g}" if m in p.metrics else "" for m in metrics),
            f"{p.file_bytes / 1e6:.1f}",
        ]
        for p in timeline.points
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    return 0
