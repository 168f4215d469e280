"""``nanoscope timeline RUN [--json]``: a training run's saved steps and the numbers their files
state (metas and logs only, never weights). ``nanoscope eval`` is in :mod:`desktop.cli.evals`.

RUN is a nanochat checkpoint folder (``<phase>_checkpoints/<tag>``, whose other stages join it),
``SOURCE[/TAG]`` under ``$NANOCHAT_BASE_DIR``, or a KempnerForge run.
"""

from __future__ import annotations

import argparse
import json

from desktop.cli.say import say, warn
from desktop.config import paths


def add_timeline_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("timeline", help="a training run's saved steps and their numbers (metas only)")
    p.add_argument(
        "run", help="checkpoint folder, KempnerForge run, or SOURCE[/TAG] with SOURCE in base|mid|sft|rl"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_timeline(args: argparse.Namespace) -> int:
    from desktop.engine.discovery import resolve_spec
    from desktop.engine.runs.timeline import timeline_of

    directory, _step = resolve_spec(args.run, paths.nanochat_base_dir())
    timeline = timeline_of(directory)
    for problem in timeline.problems:
        warn(problem)
    if args.json:
        say(json.dumps(timeline.to_dict()))
        return 0
    metrics = timeline.metric_names()
    say(f"{timeline.name}: {len(timeline.points)} saved steps")
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
        say("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    return 0
