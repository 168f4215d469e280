"""What the Inside view costs (issue #45): one hooked forward pass over a whole reply, then any
position's logit lens, attention rows and attribution from it, shown in the real view.

A random-weight E7 checkpoint of ``--depth`` (nanochat's sizing: C = 64·depth, vocab 32,768) is
written to a temporary folder and loaded in exact float32 mode on the CPU. Over ``--tokens`` ids
the benchmark times:

* the model's own pass (no hooks), for comparison, and the hooked pass ``inspect_all``: the app
  runs it on the model's thread as soon as a reply ends while the raw tokens are shown (its
  "prepared" pass), and warms the position kernels with the last position;
* a click: ``ReplyInside.at`` for a position and the ``InsideView`` built and shown (offscreen),
  for positions spread over the reply. Target: a 1,000-token reply at depth 12 opens within 1 s
  on a 2-core CPU;
* how soon a prepared pass gives way once the user asks the model for something else
  (a stop set at random points of the pass, until ``PassYielded``);
* what history keeps: the positions' JSON as stored (attention rows packed) and as lists.

Writes the section ``inside`` of docs/PERFORMANCE.md (not with ``--quick``, a tiny model for
checking that this script runs).

    python benchmarks/bench_inside.py [--depth 12] [--tokens 1000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from make_checkpoint import write_e7  # noqa: E402
from perf_report import write_section  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from desktop.engine.inside import PassYielded, inspect_all, kept_bytes  # noqa: E402
from desktop.engine.kernels.machine import machine_id  # noqa: E402
from desktop.engine.nanochat.loader import load_model  # noqa: E402
from desktop.qt.widgets.inside_view import InsideView  # noqa: E402
from desktop.session.conversation import ReplyInside  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--positions", type=int, default=10, help="positions clicked after the pass")
    parser.add_argument("--quick", action="store_true", help="a depth-2 model, 100 tokens; no report written")
    args = parser.parse_args()
    vocab, seq = 32768, 2048
    if args.quick:
        args.depth, args.tokens, args.positions, vocab, seq = 2, 100, 3, 512, 256
    app = QApplication.instance() or QApplication([])
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

    # The prepared pass, as the model's thread runs it when a reply ends (warm included).
    t0 = time.perf_counter()
    cache = inspect_all(model, ids)
    hooked = time.perf_counter() - t0
    t0 = time.perf_counter()
    cache.at(len(ids) - 2)
    warm = time.perf_counter() - t0
    cache.reply_start = args.tokens // 2
    cache.labels = [f"tok{i}" for i in range(vocab)]
    source = ReplyInside.of_cache(cache)

    # Clicks: a position's numbers and the view built and shown.
    step = max(1, (args.tokens - 3) // args.positions)
    positions = list(range(args.tokens - 3, 0, -step))[: args.positions]
    clicks, views = [], []
    for p in positions:
        t0 = time.perf_counter()
        view = InsideView(source, p)
        view.show()
        app.processEvents()
        clicks.append(time.perf_counter() - t0)
        views.append(view)
    for view in views:
        view.close()
        view.deleteLater()
    app.processEvents()

    lags = _lags(model, ids, hooked)  # how soon a prepared pass gives way

    stored = len(json.dumps(source.to_meta()).encode())
    lists = len(json.dumps([source.saved[k].to_dict() for k in source.saved]).encode())
    median, worst = statistics.median(clicks), max(clicks)
    verdict = "met" if worst < 1 else "not met"
    report = "\n".join(
        [
            f"Machine: {machine_id()} ({platform.machine()}), {torch.get_num_threads()} threads. "
            f"A random-weight E7 checkpoint of depth {args.depth} (n_embd {model.config.n_embd}, "
            f"vocab {vocab}), exact float32, a {args.tokens}-token sequence.",
            "",
            "| measure | time |",
            "|---|---|",
            f"| the model's own pass over the sequence (no hooks) | {plain * 1e3:.0f} ms |",
            f"| the hooked pass (`inspect_all`), prepared on the model's thread as the reply ends | "
            f"{hooked * 1e3:.0f} ms |",
            f"| then the last position, which warms the position kernels (same thread) | "
            f"{warm * 1e3:.0f} ms |",
            f"| a click: a position's numbers and the Inside view built and shown, median of "
            f"{len(clicks)} over the reply | {median * 1e3:.0f} ms |",
            f"| a click, the slowest of those | {worst * 1e3:.0f} ms |",
            "| a prepared pass giving way once asked (stop set at 20/50/80% of it; the longest) | "
            + (f"{max(lags) * 1e3:.0f} ms |" if lags else "(the pass ended first) |"),
            "",
            f"What a pass keeps in memory while held (one at a time): about "
            f"{kept_bytes(model, args.tokens) / 2**20:.0f} MB. History keeps the {len(source.saved)} "
            f"positions seen in {stored / 1e3:.0f} KB (attention rows packed; as JSON lists "
            f"{lists / 1e3:.0f} KB).",
            "",
            f"Target: a {args.tokens}-token reply's Inside view opens within 1 s of the click, its pass "
            f"prepared: {verdict}. Clicked before its pass is ready (or with the raw tokens hidden), "
            f"the view waits for the rest of the pass: at most {(hooked + warm + worst) * 1e3:.0f} ms.",
        ]
    )
    print(report)
    if not args.quick:
        write_section(REPO / "docs" / "PERFORMANCE.md", "inside", report)
    return 0


def _lags(model, ids: list[int], hooked: float) -> list[float]:
    """For a stop set at 20, 50 and 80% of a pass: seconds from the stop until the pass ended."""
    lags = []
    for share in (0.2, 0.5, 0.8):
        asked: list[float] = []

        def ask(asked: list[float] = asked) -> None:
            asked.append(time.perf_counter())

        timer = threading.Timer(share * hooked, ask)
        timer.start()
        try:
            inspect_all(model, ids, lambda asked=asked: bool(asked))
        except PassYielded:
            lags.append(time.perf_counter() - asked[0])
        timer.join()
    return lags


if __name__ == "__main__":
    sys.exit(main())
