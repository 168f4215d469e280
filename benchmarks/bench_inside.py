"""What the Inside view costs (issue #45): one hooked forward pass over a whole reply, then any
position's logit lens, attention rows and attribution from it.

A random-weight E7 checkpoint of ``--depth`` (nanochat's sizing: C = 64·depth, vocab 32,768) is
written to a temporary folder and loaded in exact float32 mode on the CPU; the benchmark times
``inspect_all`` over ``--tokens`` ids (the pass, off the GUI thread in the app), then
``InsideCache.at`` for positions spread over the reply (a click on a token), and the size of
the cache's JSON once every timed position is in it. Target: a 1,000-token reply at depth 12
opens within 1 s on a 2-core CPU (pass + first position). Writes the section ``inside`` of
docs/PERFORMANCE.md (not with ``--quick``, a tiny model for checking that this script runs).

    python benchmarks/bench_inside.py [--depth 12] [--tokens 1000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from make_checkpoint import write_e7  # noqa: E402
from perf_report import write_section  # noqa: E402

from desktop.engine.inside import inspect_all  # noqa: E402
from desktop.engine.kernels.machine import machine_id  # noqa: E402
from desktop.engine.nanochat.loader import load_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--positions", type=int, default=10, help="positions timed after the pass")
    parser.add_argument("--quick", action="store_true", help="a depth-2 model, 100 tokens; no report written")
    args = parser.parse_args()
    vocab, seq = 32768, 2048
    if args.quick:
        args.depth, args.tokens, args.positions, vocab, seq = 2, 100, 3, 512, 256
    with tempfile.TemporaryDirectory() as tmp:
        directory = write_e7(Path(tmp), args.depth, vocab=vocab, seq=seq)
        loaded = load_model(directory, device="cpu", dtype="float32")
    model = loaded.model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (args.tokens,), generator=g).tolist()
    with torch.inference_mode():  # the model's own pass, no hooks, for comparison
        model(torch.tensor([ids]), None, last_only=True)
        t0 = time.perf_counter()
        model(torch.tensor([ids]), None, last_only=True)
        plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    cache = inspect_all(model, ids)
    hooked = time.perf_counter() - t0
    step = max(1, (args.tokens - 1) // args.positions)
    positions = list(range(args.tokens - 2, 0, -step))[: args.positions]
    clicks = []
    for p in positions:
        t0 = time.perf_counter()
        cache.at(p)
        clicks.append(time.perf_counter() - t0)
    kept = len(json.dumps(cache.to_dict()).encode())
    first, median = clicks[0], statistics.median(clicks)
    verdict = "met" if hooked + first < 1 else "not met"
    report = "\n".join(
        [
            f"Machine: {machine_id()} ({platform.machine()}), {torch.get_num_threads()} threads. "
            f"A random-weight E7 checkpoint of depth {args.depth} (n_embd {model.config.n_embd}, "
            f"vocab {vocab}), exact float32, a {args.tokens}-token sequence.",
            "",
            "| measure | time |",
            "|---|---|",
            f"| the model's own pass over the sequence (no hooks) | {plain * 1e3:.0f} ms |",
            f"| the hooked pass (`inspect_all`) | {hooked * 1e3:.0f} ms |",
            f"| one position's Inside (`InsideCache.at`), the last one | {first * 1e3:.1f} ms |",
            f"| one position's Inside, median of {len(clicks)} over the reply | {median * 1e3:.1f} ms |",
            f"| the cache's JSON with those {len(clicks)} positions | {kept / 1e3:.0f} KB |",
            "",
            f"Target: a {args.tokens}-token reply opens within 1 s (hooked pass + one position): {verdict}.",
        ]
    )
    print(report)
    if not args.quick:
        write_section(REPO / "docs" / "PERFORMANCE.md", "inside", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
