"""CPU the app takes while the user does nothing: the real app (``python -m desktop``) starts
offscreen on a fresh home, where it opens the bundled demo on its own; after ``--wait`` seconds
(no reply, no evaluation) the process's CPU time (its threads, and the children it waited for,
such as a C++ compiler) is read over ``--measure`` seconds with psutil, as an average share of
one CPU. Target: under 2% of a CPU. Writes the section ``idle`` of docs/PERFORMANCE.md.

    python benchmarks/bench_idle.py [--home DIR] [--wait 120] [--measure 60]
    python benchmarks/bench_idle.py --quick    # 10 s + 10 s: proves it runs, not a figure

Run it on a quiet machine: the figure is this process's own CPU time, but a busy machine slows
the start, so the wait may end before the demo has loaded.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from perf_report import write_section  # noqa: E402

from desktop.engine.kernels.machine import cpu_name  # noqa: E402

TARGET_SHARE = 0.02
logger = logging.getLogger("bench_idle")


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def idle_share(home: Path, wait_s: float, measure_s: float, base_dir: Path | None = None) -> float:
    """The app's average share of one CPU over ``measure_s`` seconds, ``wait_s`` after its start
    (``base_dir``: the nanochat base dir it lists and watches; default the environment's)."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    if base_dir is not None:
        env["NANOCHAT_BASE_DIR"] = str(base_dir)
    app = subprocess.Popen(
        [sys.executable, "-m", "desktop", "--home", str(home)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        process = psutil.Process(app.pid)
        time.sleep(wait_s)  # the app starts, opens the demo, and settles
        if app.poll() is not None:
            raise SystemExit(f"the app exited early (code {app.returncode})")
        used, started = cpu_seconds(process), time.monotonic()
        time.sleep(measure_s)
        used = cpu_seconds(process) - used
        logger.info("%.3f s of CPU over %.1f s", used, time.monotonic() - started)
        return used / (time.monotonic() - started)
    finally:
        app.terminate()
        try:
            app.wait(30)
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, default=None, help="settings and history (default: a fresh one)")
    parser.add_argument("--wait", type=float, default=120.0, help="seconds after start before measuring")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--quick", action="store_true", help="10 s + 10 s, and no section written")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    wait_s, measure_s = (10.0, 10.0) if args.quick else (args.wait, args.measure)
    with tempfile.TemporaryDirectory(prefix="nanoscope-idle-") as tmp:
        share = idle_share(args.home or Path(tmp), wait_s, measure_s)
    cpu = cpu_name()
    verdict = "within" if share < TARGET_SHARE else "over"
    body = (
        f"Idle, the bundled demo open and nothing asked: {100 * share:.3f}% of one CPU on average over "
        f"{measure_s:.0f} s, {wait_s:.0f} s after the app's start ({cpu}, {psutil.cpu_count()} logical "
        f"CPUs; the target is under {100 * TARGET_SHARE:.0f}%, {verdict} it)."
    )
    logger.info("%s", body)
    if not args.quick:
        write_section(args.out, "idle", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
