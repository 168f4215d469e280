"""What a round of hardening costs the normal case: this tree against an earlier commit, on the
golden files, in the same run.

Each side runs in a process of its own, importing its own ``desktop`` package (the earlier commit
is checked out into a temporary git worktree), and times, on files the real tools wrote:

* ``timeline``: the golden nanochat experiment (stage logs, metas) and the golden KempnerForge
  run (DCP steps, TensorBoard events, its training TOML);
* ``eval``: bits per byte at every step of the experiment, asked (computed, kept in a fresh
  eval-results store) and asked again (read back from the store);
* ``load``: the golden nanochat E7 SFT checkpoint and the KempnerForge run's latest step.

The two sides alternate, ``--rounds`` times each, and each reports medians; the ratio of the
medians of the rounds is printed and written to the section ``guard-cost`` of
docs/PERFORMANCE.md.

    python benchmarks/bench_guard_cost.py --before REV [--rounds 5] [--repeat 7]

Run it on a quiet machine: the differences measured are a few percent of a few milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from perf_report import write_section  # noqa: E402

from desktop.engine.kernels.machine import cpu_name  # noqa: E402

GOLDEN = REPO / "tests" / "golden"
EXPERIMENT = GOLDEN / "nanochat-experiment" / "pr800" / "experiments" / "golden" / "d2"
KF_RUN = GOLDEN / "kempnerforge" / "dense-gqa-qknorm" / "run"
E7_SFT = GOLDEN / "nanochat" / "E7" / "chatsft_checkpoints"
TEXT = "The quick brown fox jumps over the lazy dog. " * 8

# Times each measure ``repeat`` times in the tree whose folder is sys.argv[1]; prints medians (ms).
SIDE = r"""
import json, statistics, sys, tempfile, threading, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import desktop
assert Path(desktop.__file__).resolve().parent == Path(sys.argv[1]).resolve() / "desktop", desktop.__file__
from desktop.engine.backend import LoadOptions
from desktop.engine.registry import open_backend
from desktop.engine.runs.timeline import timeline_of
from desktop.store.eval_results import EvalResults, kept_bits

experiment, kf_run, e7 = (Path(a) for a in sys.argv[2:5])
text, repeat = sys.argv[5], int(sys.argv[6])
OPTIONS = LoadOptions(device="cpu", dtype="float32")

def ms(work):
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)

def load(folder, step=None):
    open_backend(folder, LoadOptions(step=step, device="cpu", dtype="float32")).close()

def bits(points):
    with tempfile.TemporaryDirectory() as tmp:
        store = EvalResults(Path(tmp) / "eval_results.sqlite")
        asked = lambda: list(kept_bits(store, points, text, False, OPTIONS, threading.Event()))
        started = time.perf_counter()
        first = asked()
        computed = 1000 * (time.perf_counter() - started)
        assert not any(kept for _, kept in first)
        started = time.perf_counter()
        again = asked()
        read_back = 1000 * (time.perf_counter() - started)
        assert all(kept for _, kept in again), "the second ask was not read back"
        store.close()
        return computed, read_back

points = timeline_of(experiment).points
kf_points = timeline_of(kf_run).points
evals = [bits(points) for _ in range(repeat)]
out = {
    "timeline: golden nanochat experiment": ms(lambda: timeline_of(experiment)),
    "timeline: golden KempnerForge run": ms(lambda: timeline_of(kf_run)),
    f"eval: bits per byte at {len(points)} steps, computed and kept": statistics.median(e[0] for e in evals),
    f"eval: the same, read back from the store": statistics.median(e[1] for e in evals),
    "load: golden nanochat E7 SFT checkpoint": ms(lambda: load(next(e7.iterdir()))),
    "load: golden KempnerForge run, latest step": ms(lambda: load(kf_run)),
}
print(json.dumps(out))
"""


def side(tree: Path, repeat: int) -> dict[str, float]:
    args = [str(tree), str(EXPERIMENT), str(KF_RUN), str(E7_SFT), TEXT, str(repeat)]
    run = subprocess.run(
        [sys.executable, "-c", SIDE, *args], cwd=tempfile.gettempdir(), capture_output=True, text=True
    )
    if run.returncode != 0:
        raise SystemExit(f"{tree}: {run.stderr.strip().splitlines()[-1]}")
    return json.loads(run.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="the commit to compare with (e.g. main~5)")
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the two sides")
    parser.add_argument("--repeat", type=int, default=7, help="timings of each measure per side and round")
    parser.add_argument("--label", default="", help="what changed between the two (for the report)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.before], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="nanoscope-before-") as tmp:
        before_tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(before_tree), rev], cwd=REPO, check=True
        )
        try:
            rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for _ in range(args.rounds):
                rounds["before"].append(side(before_tree, args.repeat))
                rounds["after"].append(side(REPO, args.repeat))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before_tree)], cwd=REPO, check=False)
    lines = [
        f"{args.label or 'This tree'} against {rev}, on {cpu_name()}: medians over {args.rounds} "
        f"alternating rounds of {args.repeat} timings each, each side in a process of its own.",
        "",
        "| what | before | after | ratio |",
        "|---|---|---|---|",
    ]
    for name in rounds["after"][0]:
        before = statistics.median(r[name] for r in rounds["before"])
        after = statistics.median(r[name] for r in rounds["after"])
        lines.append(f"| {name} | {before:.2f} ms | {after:.2f} ms | {after / before:.2f}x |")
    body = "\n".join(lines)
    print(body)
    write_section(args.out, "guard-cost", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
