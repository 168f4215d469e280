"""Seconds per step per eval task, at depth 4 (the demo's trained step) and depth 12 (random
weights of nanochat's d12 shape with the demo's tokenizer: the cost depends on the shape, not on
what was learnt). One step each, the sweep's own code, results not kept. Writes the section
``evals`` of docs/PERFORMANCE.md.

    python benchmarks/bench_evals.py
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_checkpoint import write_e7  # noqa: E402
from perf_report import write_section  # noqa: E402

from desktop.engine.backend import LoadOptions  # noqa: E402
from desktop.engine.kernels.machine import machine_id  # noqa: E402
from desktop.engine.runs.bits_per_byte import bpb_sweep  # noqa: E402
from desktop.engine.runs.checked_answers import answer_sweep, bundled_problems  # noqa: E402
from desktop.engine.runs.evals import SAMPLE_PROMPTS, sample_sweep  # noqa: E402
from desktop.engine.runs.multiple_choice import Question, mc_sweep  # noqa: E402
from desktop.engine.runs.timeline import timeline_of  # noqa: E402

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
QUESTIONS = [
    Question(i + 1, f"What is {a} plus {b}?", (str(a + b - 1), str(a + b), str(a + b + 1)), 1)
    for i, (a, b) in enumerate((3, 4) for _ in range(20))
]
TEXT = (REPO / "README.md").read_text(encoding="utf-8")[:8000]


def time_tasks(point: object, options: LoadOptions) -> dict[str, float]:
    cancel = threading.Event()
    tasks = {
        f"samples ({len(SAMPLE_PROMPTS)} prompts, 16 tokens)": lambda: list(
            sample_sweep([point], options=options, cancel=cancel)
        ),
        f"multiple choice ({len(QUESTIONS)} questions)": lambda: list(
            mc_sweep([point], QUESTIONS, options=options, cancel=cancel)
        ),
        "checked answers (40 problems, up to 64 tokens)": lambda: list(
            answer_sweep([point], bundled_problems(), options=options, cancel=cancel)
        ),
        f"bits per byte ({len(TEXT):,} characters)": lambda: list(
            bpb_sweep([point], TEXT, options=options, cancel=cancel)
        ),
    }
    seconds = {}
    for name, run in tasks.items():
        started = time.perf_counter()
        run()
        seconds[name] = time.perf_counter() - started
    return seconds


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        shutil.copytree(DEMO.parent.parent / "tokenizer", base / "tokenizer")
        d12 = write_e7(base, 12, vocab=1024, seq=1024)
        options = LoadOptions(device="cpu", base_dir=base)
        rows = {
            "d4 (demo, trained)": time_tasks(timeline_of(DEMO).points[-1], LoadOptions(device="cpu")),
            "d12 (random weights)": time_tasks(timeline_of(d12).points[-1], options),
        }
    cpu = platform.processor() or platform.machine()
    lines = [
        f"Machine: {machine_id()} ({cpu}), {os.cpu_count()} cores. One step per task, loading included",
        "(each task opens the step once), the demo's tokenizer, nothing else running.",
        "",
        "| task | " + " | ".join(rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for task in next(iter(rows.values())):
        lines.append(f"| {task} | " + " | ".join(f"{rows[r][task]:.1f} s" for r in rows) + " |")
    body = "\n".join(lines)
    print(body)
    write_section(REPO / "docs" / "PERFORMANCE.md", "evals", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
