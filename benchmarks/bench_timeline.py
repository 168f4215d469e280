"""How long a run's timeline takes: reading a run of N saved steps (metas only) and drawing it.

A nanochat run of ``--steps`` saves (base_train metas with loop_state, a few KB each, next to
model files that are never opened) is written to a temporary folder; the benchmark times
``timeline_of`` (cold: the first read, and warm) and the Run tab drawing it offscreen. Target:
200 checkpoints in under 1 s. Writes the section ``timeline`` of docs/PERFORMANCE.md.

    python benchmarks/bench_timeline.py [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
from perf_report import write_section  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from desktop.engine.kernels.machine import machine_id  # noqa: E402
from desktop.engine.runs.timeline import timeline_of  # noqa: E402
from desktop.qt.run.view import RunView  # noqa: E402


def write_run(root: Path, steps: int) -> Path:
    run = root / "base_checkpoints" / "d12"
    run.mkdir(parents=True)
    config = {
        "sequence_len": 2048,
        "vocab_size": 32768,
        "n_layer": 12,
        "n_head": 6,
        "n_kv_head": 6,
        "n_embd": 768,
    }
    for i in range(1, steps + 1):
        step = i * 250
        meta = {
            "step": step,
            "val_bpb": 1.2 / (1 + i / 50),
            "model_config": config,
            "user_config": {"depth": 12, "device_batch_size": 32},
            "total_batch_size": 524288,
            "loop_state": {
                "min_val_bpb": 1.2 / (1 + i / 50),
                "smooth_train_loss": 3.0 / (1 + i / 60),
                "total_training_time": 12.5 * step,
            },
        }
        (run / f"meta_{step:06d}.json").write_text(json.dumps(meta, indent=2))
        (run / f"model_{step:06d}.pt").write_bytes(b"")  # never opened: only its size is asked
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp), args.steps)
        t0 = time.perf_counter()
        timeline = timeline_of(run)
        first = time.perf_counter() - t0
        reads = []
        for _ in range(5):
            t0 = time.perf_counter()
            timeline_of(run)
            reads.append(time.perf_counter() - t0)
        view = RunView()
        view.resize(1440, 900)
        draws = []
        for _ in range(5):
            t0 = time.perf_counter()
            view.show_timeline(timeline)
            view.grab()  # painted, not only laid out
            app.processEvents()
            draws.append(time.perf_counter() - t0)
    draw = statistics.median(draws)
    verdict = "met" if first + draw < 1 else "not met"
    report = "\n".join(
        [
            f"Machine: {machine_id()} ({platform.machine()}). A run of {args.steps} saved steps "
            "(base_train metas with loop_state; the model files are never opened).",
            "",
            "| measure | time |",
            "|---|---|",
            f"| read the timeline, first time | {first * 1e3:.0f} ms |",
            f"| read it again (median of 5) | {statistics.median(reads) * 1e3:.0f} ms |",
            f"| draw it in the Run tab, 1440x900 offscreen (median of 5) | {draw * 1e3:.0f} ms |",
            "",
            f"Target: under 1 s for 200 checkpoints (first read + draw): {verdict}.",
        ]
    )
    print(report)
    write_section(REPO / "docs" / "PERFORMANCE.md", "timeline", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
