"""A fork's time to first token (issue #25): a reply is forked at its middle token with the
runner-up, once with the prefix cache the reply left behind (the app's path: only the fork point
is computed again) and once from an empty cache (the whole prompt and the reply up to the fork
are prefilled). Both stream the same ids (tests/engine/decode/test_fork.py). Writes the section
``fork`` of docs/PERFORMANCE.md, naming the CPU.

    python benchmarks/bench_fork.py [--repeats 5] [--prompt-words 300]
"""

from __future__ import annotations

import argparse
import statistics
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

from desktop.engine.backend import GenerationStats, LoadOptions, ReplyStart, StreamOptions  # noqa: E402
from desktop.engine.kernels.machine import machine_id  # noqa: E402
from desktop.engine.messages import Message  # noqa: E402
from desktop.engine.nanochat.backend import NanochatBackend  # noqa: E402
from desktop.engine.nanochat.loader import load_model  # noqa: E402
from desktop.engine.params import SamplingParams  # noqa: E402
from desktop.engine.registry import open_backend  # noqa: E402

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
REPLY = 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=REPLY)


def first_token_ms(backend: NanochatBackend, prompt, start: ReplyStart, reuse: bool) -> tuple[float, int]:
    stats = GenerationStats()
    options = StreamOptions(logprobs=5, start=start, reuse_cache=reuse)
    events = backend.stream(
        prompt, SamplingParams(temperature=0.0, max_tokens=1), threading.Event(), options, stats
    )
    started = time.perf_counter()
    next(iter(events))
    elapsed = (time.perf_counter() - started) * 1000
    for _ in events:
        pass
    return elapsed, stats.prefilled_tokens


def measure(backend: NanochatBackend, words: int, repeats: int) -> dict[str, float]:
    text = " ".join(["the sea is wide and the ship is small"] * (words // 9 + 1))
    prompt = backend.render([Message.of_text("user", text + "\nWhat is 12 times 7?")], REPLY)
    reply = list(backend.stream(prompt, GREEDY, threading.Event(), StreamOptions(logprobs=5)))
    reply = [e for e in reply if not e.continues]
    at = len(reply) // 2
    alt = next(t for t, _label, _lp in reply[at].top or () if t != reply[at].id)
    start = ReplyStart(said_ids=tuple(e.id for e in reply[:at]), given_ids=(alt,))
    cached, fresh = [], []
    prefill = {}
    for _ in range(repeats):
        # The app's path: the cache holds the reply just streamed, then the user forks it.
        list(backend.stream(prompt, GREEDY, threading.Event(), StreamOptions(logprobs=5)))
        ms, prefill["cached"] = first_token_ms(backend, prompt, start, reuse=True)
        cached.append(ms)
        ms, prefill["fresh"] = first_token_ms(backend, prompt, start, reuse=False)
        fresh.append(ms)
    return {
        "prompt": prompt.tokens,
        "at": at,
        "cached": statistics.median(cached),
        "fresh": statistics.median(fresh),
        "prefill_cached": prefill["cached"],
        "prefill_fresh": prefill["fresh"],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-words", type=int, default=300)
    args = parser.parse_args()
    demo = open_backend(DEMO, LoadOptions(dtype="float32"))
    assert isinstance(demo, NanochatBackend)
    rows = [("demo (d4, trained)", measure(demo, args.prompt_words, args.repeats))]
    with tempfile.TemporaryDirectory() as tmp:
        for depth in (12, 20):
            # Random weights over the demo's tokenizer: a fork's cost does not depend on what it says.
            ckpt = write_e7(Path(tmp), depth, vocab=demo.tok.vocab_size)
            big = NanochatBackend(load_model(ckpt, dtype="float32"), demo.tok)
            big.warm_up()
            rows.append((f"d{depth} (random weights)", measure(big, args.prompt_words, args.repeats)))
            big.close()
    demo.close()
    lines = [
        f"Machine: {machine_id()}. A {REPLY}-token greedy reply forked at its middle token with the",
        "runner-up; time to the fork's first token (median of "
        f"{args.repeats}), float32. *Cached* is the app's path: the prefix cache holds the reply,",
        "so only the fork point is computed again; *fresh* prefills the prompt and the reply up to the fork.",
        "",
        "| model | prompt tokens | fork at | cached: prefilled, TTFT | fresh: prefilled, TTFT "
        "| fresh / cached |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['prompt']} | {r['at']} | {r['prefill_cached']}, {r['cached']:.1f} ms "
            f"| {r['prefill_fresh']}, {r['fresh']:.1f} ms | {r['fresh'] / r['cached']:.1f}x |"
        )
    body = "\n".join(lines)
    print(body)
    write_section(REPO / "docs" / "PERFORMANCE.md", "fork", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
