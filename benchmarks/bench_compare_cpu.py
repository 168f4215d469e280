"""How Compare panes should share the CPU: all at once with fewer threads each, or one token at a time.

    python benchmarks/bench_compare_cpu.py [--depths 4,8] [--panes 2,3] [--tokens 48] [--repeats 5]

For each depth it writes random-weight nanochat checkpoints (current E7 architecture, vocab
32768), one per pane at different steps so no two panes share weights in the cache, gives each to
a real :class:`WorkerHost` (its own QThread, as in the app) and times N panes each generating
``--tokens`` tokens from the same prompt, through the worker's Compare request, under:

* ``parallel``: every pane computes at once, each thread set to ``cores // N`` intra-op threads;
* ``interleaved``: every pane keeps all cores, a first-come lock around each token step.

Runs alternate A/B (the order flips every repeat) so drift from other jobs on the machine hits
both sides, and the spread of the repeats is reported with the medians. It also prints whether
``torch.set_num_threads`` is per thread in this torch. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

from make_checkpoint import write_e7  # noqa: E402
from PySide6.QtCore import QCoreApplication, QEventLoop, Qt, QTimer  # noqa: E402

from desktop.engine.backend import StreamOptions  # noqa: E402
from desktop.engine.bench import IdsOnlyTokenizer  # noqa: E402
from desktop.engine.messages import Message  # noqa: E402
from desktop.engine.nanochat.backend import NanochatBackend  # noqa: E402
from desktop.engine.nanochat.loader import load_model  # noqa: E402
from desktop.engine.params import SamplingParams  # noqa: E402
from desktop.qt.model.worker import TurnLock, WorkerHost  # noqa: E402
from desktop.session.compare.analysis import cpu_cores, cpu_threads  # noqa: E402

MODES = ("parallel", "interleaved")
PROMPT = "Compare these checkpoints on one prompt, token by token, " * 2


class ByteTokenizer(IdsOnlyTokenizer):
    """Prompt text → byte ids, so the worker renders a real prompt; replies need no text."""

    def encode(self, text: str, cancel: threading.Event | None = None) -> list[int]:
        return list(text.encode("utf-8"))


def threads_are_per_thread() -> dict[str, int]:
    """Set 1 thread on a helper thread; see what the helper, the main thread and a new thread get."""
    seen: dict[str, int] = {"main_before": torch.get_num_threads()}

    def helper() -> None:
        torch.set_num_threads(1)
        seen["helper"] = torch.get_num_threads()

    def newcomer() -> None:
        seen["thread_started_after"] = torch.get_num_threads()

    for target in (helper, newcomer):
        t = threading.Thread(target=target)
        t.start()
        t.join()
    seen["main_after"] = torch.get_num_threads()
    torch.set_num_threads(seen["main_before"])  # the global default again, for the runs below
    return seen


def run_panes(hosts: list[WorkerHost], mode: str, tokens: int) -> tuple[float, list[float]]:
    """Wall seconds until every pane has finished, and each pane's own finish time."""
    finish: list[float] = [0.0] * len(hosts)
    done = QEventLoop()
    remaining = [len(hosts)]
    t0 = time.perf_counter()

    def finished() -> None:
        remaining[0] -= 1
        if remaining[0] == 0:
            done.quit()

    def stamp(index: int) -> None:  # runs on the worker thread: the moment the pane really ended
        finish[index] = time.perf_counter() - t0

    connections = []
    for i, host in enumerate(hosts):
        on_worker = lambda _rid, _stats, i=i: stamp(i)  # noqa: E731
        on_gui = lambda _rid, _stats: finished()  # noqa: E731
        host.worker.finished.connect(on_worker, Qt.ConnectionType.DirectConnection)
        host.worker.finished.connect(on_gui)
        connections += [(host, on_worker), (host, on_gui)]
    messages = [Message.of_text("user", PROMPT)]
    params = SamplingParams(temperature=0.8, top_k=50, max_tokens=tokens, seed=1)
    # As the Compare controller schedules CPU panes: threads per pane, and a shared turn lock
    # when they interleave.
    threads = cpu_threads(mode, len(hosts), cpu_cores())
    lock = TurnLock() if mode == "interleaved" and len(hosts) > 1 else None
    t0 = time.perf_counter()
    for i, host in enumerate(hosts):
        host.generate(i + 1, messages, params, StreamOptions(threads=threads[i], reuse_cache=False), lock)
    QTimer.singleShot(600_000, done.quit)  # a stuck worker ends the run instead of hanging it
    done.exec()
    wall = time.perf_counter() - t0
    for host, slot in connections:
        host.worker.finished.disconnect(slot)
    if remaining[0]:
        raise RuntimeError(f"{remaining[0]} pane(s) did not finish")
    return wall, finish


def bench_depth(base: Path, depth: int, panes: list[int], tokens: int, repeats: int) -> dict:
    most = max(panes)
    steps = [1000 * (i + 1) for i in range(most)]
    for i, step in enumerate(steps):
        directory = write_e7(base, depth, step=step, seed=i)
    hosts = []
    n_params = 0
    for step in steps:
        # Loaded on this thread with the default thread count, as a worker thread would load it.
        loaded = load_model(directory, step, device="cpu", dtype="float32")
        n_params = sum(p.numel() for p in loaded.model.parameters())
        host = WorkerHost()
        host.worker.backend = NanochatBackend(loaded, ByteTokenizer(loaded.config.vocab_size))
        hosts.append(host)
    try:
        single, _ = run_panes(hosts[:1], "parallel", tokens)  # warm-up, then the one-pane baseline
        single = statistics.median(run_panes(hosts[:1], "parallel", tokens)[0] for _ in range(3))
        walls: dict[str, dict[int, list[float]]] = {m: {n: [] for n in panes} for m in MODES}
        spreads: dict[str, dict[int, list[float]]] = {m: {n: [] for n in panes} for m in MODES}
        for r in range(repeats):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for n in panes:
                for mode in order:
                    wall, finish = run_panes(hosts[:n], mode, tokens)
                    walls[mode][n].append(wall)
                    spreads[mode][n].append(max(finish) - min(finish))
    finally:
        for host in hosts:
            host.shutdown()
    result: dict = {"depth": depth, "tokens": tokens, "single_pane_s": round(single, 3), "params": n_params}
    for n in panes:
        row = {}
        for mode in MODES:
            xs = walls[mode][n]
            med = statistics.median(xs)
            row[mode] = {
                "median_s": round(med, 3),
                "min_s": round(min(xs), 3),
                "max_s": round(max(xs), 3),
                "noise_pct": round(100 * (max(xs) - min(xs)) / med, 1),
                "finish_spread_s": round(statistics.median(spreads[mode][n]), 3),
                "tok_s_total": round(n * tokens / med, 1),
            }
        wins = sum(
            p < i for p, i in zip(walls["parallel"][n], walls["interleaved"][n], strict=True)
        )  # paired by repeat: both ran back to back
        medians = {m: row[m]["median_s"] for m in MODES}
        result[f"{n}_panes"] = {
            **row,
            "parallel_wins_paired": f"{wins}/{repeats}",
            "winner": min(MODES, key=lambda m: medians[m]),
        }
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="4,8")
    ap.add_argument("--panes", default="2,3")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--base", type=Path, default=None, help="where to write the checkpoints (default: a tmp dir)"
    )
    args = ap.parse_args()
    app = QCoreApplication.instance() or QCoreApplication(sys.argv[:1])
    semantics = threads_are_per_thread()
    print(f"torch {torch.__version__}, {cpu_cores()} cores, {platform.processor() or platform.machine()}")
    print(f"set_num_threads(1) on a helper thread: {semantics}")
    panes = [int(x) for x in args.panes.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="nanoscope-bench-compare-") as tmp:
        base = args.base or Path(tmp)
        for depth in (int(d) for d in args.depths.split(",")):
            res = bench_depth(base, depth, panes, args.tokens, args.repeats)
            results.append(res)
            print(f"\ndepth {depth}: one pane alone {res['single_pane_s']:.3f} s for {args.tokens} tokens")
            for n in panes:
                row = res[f"{n}_panes"]
                for mode in MODES:
                    m = row[mode]
                    print(
                        f"  {n} panes {mode:11s}: median {m['median_s']:.3f} s "
                        f"(min {m['min_s']:.3f}, max {m['max_s']:.3f}, spread {m['noise_pct']:.0f}%), "
                        f"{m['tok_s_total']:.1f} tok/s in all, "
                        f"last pane done {m['finish_spread_s']:.3f} s after the first"
                    )
                wins = row["parallel_wins_paired"]
                print(f"  {n} panes: parallel faster in {wins} paired runs -> {row['winner']}")
    del app
    print(json.dumps({"torch_threads": semantics, "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
