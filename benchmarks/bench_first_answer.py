"""Time to the first answer on a new machine: ``nanoscope generate`` on the bundled demo from a
fresh home (no kernel timings yet, so the load times this CPU's kernels within its budget), then
again from the same home (timings read back), each idle and with every core kept busy by other
processes. The figure is the wall time from starting the process to its exit after a 4-token
answer: Python, torch and the app starting, loading, tuning, and answering. Writes the section
``first answer`` of docs/PERFORMANCE.md.

    python benchmarks/bench_first_answer.py [--dtype int8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from perf_report import write_section  # noqa: E402

from desktop.engine.kernels.machine import machine_id  # noqa: E402
from desktop.engine.kernels.tuning import TUNING_BUDGET_S  # noqa: E402

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
SPIN = "while True: pass"


def answer_seconds(home: Path, dtype: str) -> float:
    cmd = [sys.executable, "-m", "desktop", "--home", str(home), "generate", str(DEMO)]
    cmd += ["--prompt", "What is 12 times 7?", "--max-tokens", "4", "--dtype", dtype, "--json"]
    started = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - started


@contextmanager
def busy(cores: int):
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(cores)]
    try:
        time.sleep(1.0)  # let them take the cores
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def measure(dtype: str, repeats: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"fresh": [], "again": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            figures["fresh"].append(answer_seconds(Path(tmp), dtype))
            figures["again"].append(answer_seconds(Path(tmp), dtype))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="int8", help="int8 and fast time the most candidates")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    idle = measure(args.dtype, args.repeats)
    with busy(cores):
        loaded = measure(args.dtype, args.repeats)

    def cell(values: list[float]) -> str:
        return " / ".join(f"{v:.1f} s" for v in values)

    body = "\n".join(
        [
            f"Machine: {machine_id()}, {cores} cores; the demo in {args.dtype}, a 4-token answer from",
            "`nanoscope generate` (process start to exit), each of "
            f"{args.repeats} runs in its own fresh home. Tuning budget {TUNING_BUDGET_S:.0f} s.",
            "",
            "| | fresh home (kernels timed) | same home again (timings read) |",
            "|---|---|---|",
            f"| idle | {cell(idle['fresh'])} | {cell(idle['again'])} |",
            f"| every core busy ({cores} spinning processes) | {cell(loaded['fresh'])} "
            f"| {cell(loaded['again'])} |",
        ]
    )
    print(body)
    write_section(REPO / "docs" / "PERFORMANCE.md", "first answer", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
