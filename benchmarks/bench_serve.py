"""``nanoscope serve`` under 1, 4 and 16 concurrent clients: throughput and time to first token.

A nanochat d12 (random weights in nanochat's format, ``make_checkpoint.write_e7``, or ``--model``)
is served by ``nanoscope serve`` in its own process. The clients run here, on asyncio with httpx:
each of C clients streams R chat completions one after another (T 0.8, top-k 50, its own seed,
``--new-tokens`` each, a prompt of about 60 tokens). Reported per C: the reply tokens per second
over the wall time of the whole round, and the time to the first token (median and 90th
percentile). The baseline, from the same run, is the same checkpoint decoding in this process with
no server (``nanoscope generate``'s path), and every figure is a ratio against it.

The server decodes up to 16 replies side by side (while their caches fit four contexts), a token of
each in turn: more clients share one stream's decode rate.

Usage: ``python benchmarks/bench_serve.py [--model DIR] [--dtype float32] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO), str(REPO / "tests")]

import httpx  # noqa: E402
from bench_hf_peer import write_tokenizer  # noqa: E402
from make_checkpoint import write_e7  # noqa: E402
from perf_report import write_section  # noqa: E402

from desktop.engine.backend import GenerationStats, LoadOptions  # noqa: E402
from desktop.engine.kernels.machine import cpu_name  # noqa: E402
from desktop.engine.messages import Message  # noqa: E402
from desktop.engine.params import SamplingParams  # noqa: E402
from desktop.engine.registry import open_backend  # noqa: E402

QUESTION = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle, and tell it "
    "in the voice of the sea itself, with the waves counting the days until the keeper answers."
)
CONCURRENCY = (1, 4, 16)


def start_server(model: Path, dtype: str, home: Path) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "desktop", "--home", str(home), "serve", str(model), "--port", "0"]
    command += ["--dtype", dtype, "--device", "cpu", "--max-waiting", "64"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ})
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if " at http" not in line:
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return proc, line.split(" at ")[1].split(" ")[0]


async def one_reply(
    client: httpx.AsyncClient, url: str, model: str, seed: int, new: int
) -> tuple[float, int]:
    """(seconds to the first token, reply tokens) of one streamed chat completion."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": new,
        "temperature": 0.8,
        "top_k": 50,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - t0
    return (first if first is not None else time.perf_counter() - t0), tokens


async def round_of(url: str, model: str, clients: int, per_client: int, new: int) -> dict:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), trust_env=False) as client:

        async def one_client(k: int) -> list[tuple[float, int]]:
            return [await one_reply(client, url, model, 1000 * k + r, new) for r in range(per_client)]

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one_client(k) for k in range(clients)))
        wall = time.perf_counter() - t0
    flat = [r for rs in results for r in rs]
    ttfts = sorted(t for t, _ in flat)
    return {
        "clients": clients,
        "requests": len(flat),
        "tok_s": sum(n for _, n in flat) / wall,
        "ttft_median_s": statistics.median(ttfts),
        "ttft_p90_s": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
    }


def direct_tok_s(model: Path, dtype: str, new: int, repeats: int) -> float:
    """The same checkpoint decoding here, with no server: reply tokens per second (median)."""
    backend = open_backend(model, LoadOptions(device="cpu", dtype=dtype))
    try:
        prompt = backend.render([Message.of_text("user", QUESTION)], None, chat=True)
        rates = []
        for r in range(-1, repeats):  # -1: a warm-up, not timed (the first reply allocates its caches)
            stats = GenerationStats()
            params = SamplingParams(temperature=0.8, top_k=50, seed=r + 1, max_tokens=new)
            t0 = time.perf_counter()
            n = sum(
                1 for ev in backend.stream(prompt, params, threading.Event(), stats=stats) if not ev.continues
            )
            if r >= 0:
                rates.append(n / (time.perf_counter() - t0))
        return statistics.median(rates)
    finally:
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", type=Path, default=None, help="a nanochat checkpoint folder (default: a d12)"
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--per-client", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model = args.model
        if model is None:  # a random d12 in nanochat's format, and a tokenizer.pkl of its vocabulary
            model = write_e7(tmp_path / "nc", 12)
            write_tokenizer(tmp_path / "nc" / "tokenizer")
            os.environ["NANOCHAT_BASE_DIR"] = str(tmp_path / "nc")
        base = direct_tok_s(model, args.dtype, args.new_tokens, 5)
        proc, url = start_server(model, args.dtype, tmp_path / "home")
        try:
            name = httpx.get(f"{url}/models", timeout=30).json()["data"][0]["id"]
            asyncio.run(round_of(url, name, 1, 1, 8))  # warm: the first reply allocates its caches
            rows = [
                asyncio.run(round_of(url, name, c, args.per_client, args.new_tokens)) for c in CONCURRENCY
            ]
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
    lines = [
        f"`benchmarks/bench_serve.py` on {cpu_name()} ({os.cpu_count()} CPUs): a nanochat d12 "
        f"({args.dtype}) served by `nanoscope serve`, clients streaming chat completions of "
        f"{args.new_tokens} tokens (T 0.8, top-k 50), {args.per_client} each, all at once. "
        f"Baseline: the same checkpoint decoding in-process with no server, {base:.1f} tok/s.",
        "",
        "| clients | requests | reply tok/s | × no server | TTFT median | TTFT p90 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['requests']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f} | "
            f"{r['ttft_median_s'] * 1000:.0f} ms | {r['ttft_p90_s'] * 1000:.0f} ms |"
        )
    lines += [
        "",
        "One model thread decodes up to 16 replies side by side while their caches fit four contexts, "
        "a token of each in turn (no batching yet): the throughput stays about that of one stream, and "
        "the first token waits for the replies ahead of it to take their turns, not to finish. The "
        "server and the clients share this machine's cores, which the in-process baseline has to itself.",
    ]
    body = "\n".join(lines)
    print(body)
    print(json.dumps({"baseline_tok_s": base, "rows": rows}))
    write_section(args.out, "serve", body)


if __name__ == "__main__":
    main()
