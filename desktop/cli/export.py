"""``nanoscope export MODEL --hf OUT``: a nanochat checkpoint as a transformers NanoChat folder.

The export itself lives in :mod:`desktop.engine.export.hf_export`; this module adds the subcommand to
the CLI's parser and prints the result: a summary line with the measured logit differences, or
with ``--json`` one JSON object.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from desktop.cli.say import say
from desktop.config import paths
from desktop.engine.backend import LoadOptions


def add_export_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write a nanochat checkpoint as a Hugging Face (transformers NanoChat) folder"
    )
    p.add_argument(
        "model", help="checkpoint directory, or SOURCE[/TAG[/STEP]] with SOURCE in base|mid|sft|rl"
    )
    p.add_argument("--hf", type=Path, required=True, metavar="OUT", help="the folder to write (new or empty)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.pkl or its folder")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_export(args: argparse.Namespace) -> int:
    from desktop.engine.discovery import resolve_spec
    from desktop.engine.export.hf_export import export_to_hf

    base = paths.nanochat_base_dir()
    directory, step = resolve_spec(args.model, base)
    options = LoadOptions(
        step=args.step if args.step is not None else step, tokenizer=args.tokenizer, base_dir=base
    )
    report = export_to_hf(directory, args.hf, options)
    say(json.dumps(report.to_dict()) if args.json else report.summary())
    return 0
