"""Golden checkpoints of the C++ fork (apstenku123/nanochat), written by the fork's own code.

``python -m tools.golden fork --src MIRROR_OR_CHECKOUT [--out tests/golden] [--variants plain,engram]``

The fork's ``main`` is exported and imported as the package ``nanochat``; for each variant
(its GPTConfig extras) its own code

* trains a tiny tokenizer with its ``RustBPETokenizer`` (the ``tokenizer.pkl`` path:
  ``NANOCHAT_CPP_TOKENIZER=0``, as the fork's non-C++ runs use, so the chat and calculator
  tokens exist) and saves it;
* builds its ``GPT`` from its ``GPTConfig`` and ``init_weights``, trains it on chats rendered by
  its own ``render_conversation`` (the same as the upstream writer's, :mod:`.nanochat`);
* saves a base checkpoint (meta without ``activation``, as its ``base_train`` writes) and an SFT
  checkpoint (every GPTConfig field, as its ``sft_train`` writes) with its ``save_checkpoint``
  and ``model.state_dict()``;
* loads the SFT step back with its ``build_model`` and records ``GPT.generate`` (its full
  forward) and, where it runs on a CPU, its ``Engine.generate``.

Which of the two Nanoscope is held to is in golden.json (``compare_with``): the Engine for
variants whose decoding is the training math; the full forward for Engram and mHC, whose
incremental decode in the fork's Engine differs from its own forward (spec 2.3).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from .common import check_corpus, export, file_commits, imported_from, resolve, write_manifest
from .nanochat import BASE_STEP, SFT_STEP, TAG, make_case

REVISION = "7e9ffe4"  # the fork's main (spec 2)
# variant -> GPTConfig extras
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "engram": {"engram_enabled": True, "engram_layers": "0", "engram_ngram_orders": "2,3"},
    "mhc": {"mhc_enabled": True},
    "engram-mhc-mtp-swiglu": {
        "engram_enabled": True,
        "engram_layers": "-1",
        "engram_ngram_orders": "2,3",
        "mhc_enabled": True,
        "mtp_enabled": True,
        "activation": "swiglu",
    },
}
FULL_FORWARD = (
    "GPT.generate: the fork's Engine decodes Engram and mHC one token at a time with state the "
    "full forward does not have (spec 2.3); Nanoscope computes what the forward computes"
)


def write_variant(repo: Path, variant: str, out: Path) -> dict[str, Any]:
    commit = resolve(repo, REVISION)
    case = out / "fork" / variant
    with tempfile.TemporaryDirectory() as tmp:
        src = export(repo, commit, Path(tmp) / "src", ["nanochat"])
        os.environ["NANOCHAT_BASE_DIR"] = str(case)
        os.environ["NANOCHAT_CPP_TOKENIZER"] = "0"
        case.mkdir(parents=True, exist_ok=True)
        with imported_from(src, "nanochat"):
            # base_train leaves activation out of the meta; sft_train writes every field (spec 2.2)
            fields, cases, used = make_case(
                case, VARIANTS[variant], lambda f: {k: v for k, v in f.items() if k != "activation"}
            )
    extras = VARIANTS[variant]
    full_forward = (
        extras.get("engram_enabled") or extras.get("mhc_enabled") or "engine_greedy" not in cases[0]
    )
    manifest = {
        "family": "nanochat",
        "era": "fork",
        "variant": variant,
        "upstream": "apstenku123/nanochat",
        "commit": commit,
        "file_commits": file_commits(repo, commit, used),
        "source": "sft",
        "tag": TAG,
        "step": SFT_STEP,
        "base_step": BASE_STEP,
        "config": fields,
        "torch": torch.__version__,
        "compare_with": FULL_FORWARD if full_forward else "Engine.generate",
        "load_options": {},
        "cases": cases,
    }
    write_manifest(case, manifest)
    return manifest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.golden fork")
    parser.add_argument("--src", type=Path, required=True, help="apstenku123/nanochat mirror or checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, default: all")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for variant in args.variants.split(","):
        m = write_variant(args.src, variant, args.out)
        gaps = [g for c in m["cases"] for g in c["greedy_top2_gaps"]]
        print(f"{variant}: {m['commit'][:7]}, against {m['compare_with'][:14]}, smallest gap {min(gaps):.4f}")
    print(f"corpus: {check_corpus(args.out)} bytes")
    return 0
