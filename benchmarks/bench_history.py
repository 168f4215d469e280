"""Scale benchmark for the history store: start-up cost and search time on a large history.

Builds a temporary history of N conversations / M messages (default 10,000 / 500,000, the
size of years of heavy use), then measures what the user waits for:

* start: open the store (a fresh connection, as at app start) and list the first 200 conversations;
* search: the median time of a few queries (common word, rare word, two words, a prefix, no match).

Targets: start < 2 s, search < 100 ms. Prints the figures and, last, one JSON line.

    python benchmarks/bench_history.py                      # full size (a few minutes)
    python benchmarks/bench_history.py --conversations 500 --messages 20000   # quick run
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from support import REPO

sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from perf_report import write_section

from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, Part
from desktop.store import HistoryStore

# Words the queries look for, mixed into a synthetic vocabulary with a Zipf-like spread,
# so common words match hundreds of thousands of messages and rare ones a handful.
COMMON = ["the", "model", "loss", "token"]
RARE = ["zanzibar", "quokka"]
QUERIES = {
    "common word": "model",
    "rare word": "zanzibar",
    "two words": "learning rate",
    "prefix": "gradi",
    "no match": "xylophonist",
}


def vocabulary(rng: random.Random, size: int = 6000) -> list[str]:
    syllables = ["ka", "lo", "mi", "ner", "to", "va", "shi", "qu", "ex", "dra", "pon", "li", "ster", "gu"]
    words = {"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(size * 2)}
    made = sorted(words - {"xylophonist"})[: size - 10]
    return [*COMMON, "learning", "rate", "gradient", "gradients", *made, *RARE]


def messages_for(rng: random.Random, words: list[str], weights: list[float], count: int) -> Iterator[Message]:
    for i in range(count):
        text = " ".join(rng.choices(words, cum_weights=weights, k=rng.randint(8, 60)))
        if i % 2 == 0:
            yield Message.of_text("user", text)
            continue
        parts = [Part(TEXT, text)]
        if rng.random() < 0.1:
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            parts += [Part(PYTHON, f"{a}*{b}"), Part(PYTHON_OUTPUT, str(a * b))]
        meta = {
            "checkpoint": "/data/nanochat/chatsft_checkpoints/d20",
            "step": 650,
            "seed": rng.randint(0, 2**31),
            "sampling": {"temperature": 0.8, "top_k": 50},
            "tokens_per_s": round(rng.uniform(20, 200), 1),
        }
        yield Message("assistant", parts, meta)


def generate(path: Path, n_conv: int, n_msg: int, seed: int = 0) -> float:
    rng = random.Random(seed)
    words = vocabulary(rng)
    weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))
    ticks = itertools.count(1_600_000_000)  # distinct, increasing times for the list order
    started = time.perf_counter()
    store = HistoryStore(path, clock=lambda: float(next(ticks)))
    per_conv, extra = divmod(n_msg, n_conv)
    for c in range(n_conv):
        count = per_conv + (1 if c < extra else 0)
        title = " ".join(rng.choices(words, cum_weights=weights, k=rng.randint(2, 6)))
        store.import_conversation(title, messages_for(rng, words, weights, count))
    store.close()
    return time.perf_counter() - started


def measure_start(path: Path) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    store = HistoryStore(path)
    t1 = time.perf_counter()
    rows = store.list_conversations(limit=200)
    t2 = time.perf_counter()
    store.close()
    return t1 - t0, t2 - t1, len(rows)


def measure_search(path: Path, repeats: int) -> dict[str, tuple[float, int]]:
    store = HistoryStore(path)
    results = {}
    for label, query in QUERIES.items():
        times, hits = [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            hits = len(store.search(query, limit=50))
            times.append(time.perf_counter() - t0)
        results[label] = (statistics.median(times), hits)
    store.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=15, help="runs per search query")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="nanoscope-bench-") as tmp:
        path = Path(tmp) / "history.sqlite3"
        gen_s = generate(path, args.conversations, args.messages)
        size_mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 1e6
        print(f"generated {args.conversations} conversations, {args.messages} messages in {gen_s:.1f} s")
        print(f"database size: {size_mb:.0f} MB")
        open_s, list_s, listed = measure_start(path)
        print(f"start: open {open_s * 1000:.1f} ms + list {listed} conversations {list_s * 1000:.1f} ms")
        search = measure_search(path, args.repeats)
        for label, (seconds, hits) in search.items():
            print(f"search {label:12} {QUERIES[label]!r:15} median {seconds * 1000:7.2f} ms  ({hits} hits)")

    start_s = open_s + list_s
    worst_ms = max(s for s, _ in search.values()) * 1000
    print(f"targets: start {start_s:.3f} s (< 2 s), slowest search median {worst_ms:.1f} ms (< 100 ms)")
    medians = ", ".join(f"{QUERIES[k]!r} {s * 1000:.2f} ms" for k, (s, _) in search.items())
    write_section(
        args.out,
        "history-scale",
        f"{args.conversations:,} conversations / {args.messages:,} messages ({size_mb:.0f} MB): "
        f"open + list the first 200 conversations {start_s * 1000:.1f} ms (target < 2 s); "
        f"search medians {medians} (target < 100 ms).",
    )
    print(
        json.dumps(
            {
                "conversations": args.conversations,
                "messages": args.messages,
                "generate_s": round(gen_s, 2),
                "db_mb": round(size_mb, 1),
                "open_ms": round(open_s * 1000, 2),
                "list_200_ms": round(list_s * 1000, 2),
                "start_s": round(start_s, 4),
                "search_median_ms": {label: round(s * 1000, 2) for label, (s, _) in search.items()},
                "start_ok": start_s < 2.0,
                "search_ok": worst_ms < 100.0,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
