"""Long runs: RSS while streaming 20,000 tokens, and threads after 100 load/stop cycles.

    QT_QPA_PLATFORM=offscreen python benchmarks/bench_soak.py [--tokens 20000] [--cycles 100]

Memory: RSS is sampled every 1,000 tokens of one long generation; beyond the KV cache's own
growth (its pages are taken as positions are written; reported) it must stay flat. Threads: 100
times create a worker host, load a model, start a generation, stop it and shut down; the
process's thread count must come back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

from support import REPO

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = REPO
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def long_stream(ckpt: Path, n_tokens: int) -> dict:
    import torch

    from desktop.engine.backend import LoadOptions
    from desktop.engine.decode.generation import generate_columns
    from desktop.engine.decode.kvcache import KVCache
    from desktop.engine.nanochat.backend import NanochatBackend
    from desktop.engine.params import SamplingParams

    session = NanochatBackend.open(ckpt, LoadOptions(device="cpu"))
    model = session.model
    cache = KVCache(model.config, 1, n_tokens + 16, model.device, torch.float32)
    samples, positions = [], []
    params = SamplingParams(temperature=1.0, max_tokens=n_tokens, seed=1)
    stop_free = _NoStops(session.tok)
    for i, _ in enumerate(generate_columns(model, stop_free, [1, 2, 3], params, cache=cache)):
        if i % 1000 == 0:
            samples.append(rss_mb())
            positions.append(cache.pos)
    growth = samples[-1] - samples[1] if len(samples) > 1 else 0.0
    # What the cache's positions written between the two samples took (its pages come on first touch).
    cache_growth = (
        (positions[-1] - positions[1]) * cache.nbytes() / cache.capacity / 2**20 if len(samples) > 1 else 0.0
    )
    return {
        "tokens": cache.pos,
        "kv_cache_mb": cache.nbytes() / 2**20,
        "rss_mb_every_1000": samples,
        "rss_growth_after_first_1000_mb": growth,
        "kv_cache_growth_after_first_1000_mb": cache_growth,
        "rss_growth_beyond_the_cache_mb": growth - cache_growth,
    }


class _NoStops:
    """The real tokenizer without stop tokens, so one generation runs the whole length."""

    def __init__(self, tok) -> None:
        self._tok = tok
        self.stop_ids = frozenset()

    def __getattr__(self, name):
        return getattr(self._tok, name)


def cycles(ckpt: Path, n: int) -> dict:
    from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer

    from desktop.engine.messages import Message
    from desktop.qt.model.worker import WorkerHost

    app = QCoreApplication.instance() or QCoreApplication([])
    before_py, before_os = threading.active_count(), os_threads()

    def wait_for(signal) -> None:
        loop = QEventLoop()
        signal.connect(loop.quit)
        QTimer.singleShot(60000, loop.quit)
        loop.exec()

    for _ in range(n):
        host = WorkerHost()
        host.load(str(ckpt), {"device": "cpu"})
        wait_for(host.worker.loaded)
        host.generate(1, [Message.of_text("user", "hi")], {"temperature": 1.0, "max_tokens": 100000})
        wait_for(host.worker.token)
        host.shutdown()
        host.deleteLater()
        app.processEvents()
    return {
        "cycles": n,
        "python_threads_before": before_py,
        "python_threads_after": threading.active_count(),
        "os_threads_before": before_os,
        "os_threads_after": os_threads(),
        "rss_mb_after": rss_mb(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    from perf_report import write_section
    from support.checkpoint_factory import default_config, write_checkpoint

    from desktop.config import paths

    tmp = Path(tempfile.mkdtemp(prefix="nanoscope-soak-"))
    paths.set_home(tmp / "home")
    cfg = default_config("E7", sequence_len=4096, vocab_size=4096, n_embd=128, n_layer=4)
    ckpt = write_checkpoint(tmp, "E7", phase="chatsft", cfg=cfg, tokenizer="pkl")
    stream = long_stream(ckpt, args.tokens)
    cyc = cycles(ckpt, args.cycles)
    body = (
        f"Streaming {stream['tokens']:,} tokens in one session (KV cache {stream['kv_cache_mb']:.1f} MB, "
        f"its pages taken as positions are written): RSS grew "
        f"{stream['rss_growth_after_first_1000_mb']:+.1f} MB between token 1,000 and the end, "
        f"{stream['rss_growth_beyond_the_cache_mb']:+.1f} MB beyond the cache's "
        f"{stream['kv_cache_growth_after_first_1000_mb']:.1f} MB (samples every 1,000 tokens: "
        f"{', '.join(f'{x:.0f}' for x in stream['rss_mb_every_1000'])} MB).\n\n"
        f"{cyc['cycles']} load → generate → stop → shutdown cycles: "
        f"OS threads {cyc['os_threads_before']} → "
        f"{cyc['os_threads_after']}, Python threads {cyc['python_threads_before']} → "
        f"{cyc['python_threads_after']}, RSS afterwards {cyc['rss_mb_after']:.0f} MB."
    )
    write_section(args.out, "soak", body)
    print(json.dumps({"stream": stream, "cycles": cyc}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
