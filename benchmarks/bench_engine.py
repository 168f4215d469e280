"""Decode/prefill speed of Nanoscope against a nanochat-style Engine baseline, in one run.

    python benchmarks/bench_engine.py [--depths 4,8,12,20] [--repeats 3] [--out docs/PERFORMANCE.md]

For each depth it writes a random-weight nanochat checkpoint (current E7 architecture, vocab
32768, sequence_len 2048) and measures, alternating A/B so drift hits both sides:
* decode tok/s (temperature 0.8, top-k 50, batch 1) for the baseline, exact mode (fp32) and
  fast mode (bf16 weights and compute);
* TTFT at 16/256/1024 prompt tokens;
* bytes streamed per decode step and MBU against the copy and matrix-vector bandwidth measured
  in the same run;
* turn-N TTFT with 1,000 tokens of history plus 20 new ones, with and without the prefix cache.
The figures go to stdout (last line JSON) and into the PERFORMANCE.md section between markers.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from make_checkpoint import write_e7
from nanochat_baseline import NanochatE7
from perf_report import write_section

from desktop.engine.bench import IdsOnlyTokenizer, decode_bytes_per_step, measure_bandwidth
from desktop.engine.generation import generate_columns
from desktop.engine.loader import load_model
from desktop.engine.sampling import SamplingParams

STEP = 1000


def _rate(gen) -> tuple[float, float]:
    """(seconds to first token, decode tok/s after it) for a token generator."""
    t0 = time.perf_counter()
    n, t_first = 0, 0.0
    for _ in gen:
        n += 1
        if n == 1:
            t_first = time.perf_counter()
    end = time.perf_counter()
    return t_first - t0, (n - 1) / max(end - t_first, 1e-9)


def ours(model, prompt: list[int], new: int, temperature: float = 0.8, top_k: int = 50):
    params = SamplingParams(temperature=temperature, top_k=top_k, max_tokens=new, seed=1)
    return (c.tokens[0] for c in generate_columns(model, IdsOnlyTokenizer(), prompt, params))


def bench_depth(base: Path, depth: int, repeats: int, new: int) -> dict:
    ckpt = write_e7(base, depth, STEP)
    exact = load_model(ckpt, dtype="float32").model
    fast = load_model(ckpt, dtype="bfloat16").model
    baseline = NanochatE7(ckpt, STEP)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 32000, (16,), generator=g).tolist()
    same_ids = list(ours(exact, prompt, 24)) == list(baseline.generate(prompt, 24, 0.8, 50, seed=1))
    runs: dict[str, list[float]] = {"baseline": [], "exact": [], "fast": []}
    gens = {
        "baseline": lambda: baseline.generate(prompt, new, 0.8, 50, seed=1),
        "exact": lambda: ours(exact, prompt, new),
        "fast": lambda: ours(fast, prompt, new),
    }
    for make in gens.values():  # warm-up
        _rate(make())
    for _ in range(repeats):  # A/B/C alternating
        for name, make in gens.items():
            runs[name].append(_rate(make())[1])
    decode = {k: statistics.median(v) for k, v in runs.items()}

    ttft: dict[str, dict[int, float]] = {"baseline": {}, "exact": {}}
    for n in (16, 256, 1024):
        p = torch.randint(0, 32000, (n,), generator=g).tolist()
        b, e = [], []
        for _ in range(max(1, repeats - 1) if depth < 20 else 1):
            b.append(_rate(baseline.generate(p, 1, 0.8, 50))[0])
            e.append(_rate(ours(exact, p, 1))[0])
        ttft["baseline"][n], ttft["exact"][n] = statistics.median(b) * 1000, statistics.median(e) * 1000

    turn = turn_ttft(exact, g)
    step_bytes = decode_bytes_per_step(exact)
    return {
        "depth": depth,
        "params": sum(p.numel() for p in exact.parameters()),
        "same_ids": same_ids,
        "decode": decode,
        "ttft_ms": ttft,
        "bytes_per_step": step_bytes,
        "turn": turn,
    }


def turn_ttft(model, g: torch.Generator) -> dict:
    from desktop.engine.kvcache import KVCache

    history = torch.randint(0, 32000, (1000,), generator=g).tolist()
    follow = history + torch.randint(0, 32000, (20,), generator=g).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1)
    full, cached = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        list(generate_columns(model, IdsOnlyTokenizer(), follow, params))
        full.append(time.perf_counter() - t0)
        cache = KVCache(model.config, 1, 1100, model.device, torch.float32)
        list(generate_columns(model, IdsOnlyTokenizer(), history, params, cache=cache))
        cache.truncate(len(history))
        t0 = time.perf_counter()
        list(generate_columns(model, IdsOnlyTokenizer(), follow, params, cache=cache))
        cached.append(time.perf_counter() - t0)
    return {"full_ms": statistics.median(full) * 1000, "cached_ms": statistics.median(cached) * 1000}


def markdown(results: list[dict], bw: dict, meta: dict) -> str:
    lines = [
        f"Machine: {meta['machine']}; torch {meta['torch']}; {meta['threads']} threads; "
        f"measured {meta['date']}. Same-run bandwidth: copy {bw['copy_gbs']:.1f} GB/s, "
        f"fp32 matrix-vector {bw['matvec_gbs']:.1f} GB/s.",
        "",
        "| depth | params | nanochat-style tok/s | exact tok/s (×) | fast bf16 tok/s (×) "
        "| exact MBU vs matvec | TTFT@16/256/1024 nanochat → exact (ms) "
        "| turn-N TTFT full → cached (ms) | same ids |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d, t = r["decode"], r["ttft_ms"]
        mbu = r["bytes_per_step"] * d["exact"] / 1e9 / bw["matvec_gbs"]
        tt = " / ".join(f"{t['baseline'][n]:.0f}→{t['exact'][n]:.0f}" for n in (16, 256, 1024))
        lines.append(
            f"| {r['depth']} | {r['params'] / 1e6:.0f}M | {d['baseline']:.1f} | {d['exact']:.1f} "
            f"({d['exact'] / d['baseline']:.2f}×) | {d['fast']:.1f} ({d['fast'] / d['baseline']:.2f}×) | "
            f"{mbu:.2f} | {tt} | {r['turn']['full_ms']:.0f} → {r['turn']['cached_ms']:.0f} "
            f"({r['turn']['cached_ms'] / r['turn']['full_ms']:.2f}) | {r['same_ids']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depths", default="4,8,12,20")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--base", type=Path, default=Path("/tmp/nanoscope-bench"))
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "PERFORMANCE.md"
    )
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    bw = measure_bandwidth(torch.device("cpu"), torch.float32)
    results = []
    for depth in (int(d) for d in args.depths.split(",")):
        r = bench_depth(args.base, depth, args.repeats, args.new_tokens)
        print(json.dumps(r), flush=True)
        results.append(r)
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
    }
    write_section(args.out, "engine", markdown(results, bw, meta))
    print(json.dumps({"bandwidth": bw, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
