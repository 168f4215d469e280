"""Decode and prefill speed of Nanoscope against a nanochat-style Engine, in one run.

    python benchmarks/bench_engine.py [--depths 4,8,12,20] [--repeats 5] [--out docs/PERFORMANCE.md]
        [--nanochat-src PATH] [--stream-tokens 2048]

For each depth it writes a random-weight nanochat checkpoint (current E7 architecture, vocab
32768, sequence_len 2048) and measures, in rounds whose order rotates so that drift on a shared
machine hits every contender alike:

* decode tok/s at temperature 0.8, top-k 50, batch 1, for the baseline, exact mode (fp32), fast
  mode and, on x86, int8. The baseline is nanochat's own ``Engine.generate`` imported from a
  source checkout when ``--nanochat-src`` (or ``$NANOCHAT_SRC``) names one (``nanochat_real.py``),
  else ``nanochat_baseline.py``'s re-implementation; which one is printed, in the JSON and in
  PERFORMANCE.md;
* whether exact mode produced the baseline's tokens in every round (same seed);
* bytes streamed per decode step, and MBU: streamed bytes per second over the matrix-vector
  bandwidth measured in the same run (the better of torch's ``F.linear`` and exact mode's row
  split) and over ``F.linear`` alone;
* TTFT at 16/256/1024 prompt tokens, and the turn-N TTFT (1,000 tokens of history plus 20 new
  ones) with and without the prefix cache;
* in a fresh process per depth and mode (``nanoscope bench``): load time, RSS after loading, and
  peak RSS while a reply streams to ``--stream-tokens`` positions, each against its budget.

The figures go to stdout (the last line is JSON) and into PERFORMANCE.md between markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from support import REPO

ROOT = REPO
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

from make_checkpoint import nanochat_e7, write_e7  # noqa: E402
from nanochat_baseline import NanochatE7  # noqa: E402
from nanochat_real import NanochatSourceError, RealEngine, load_real_engine  # noqa: E402
from perf_report import write_section  # noqa: E402

from desktop.engine.bench import IdsOnlyTokenizer, measure_bandwidth, turn_ttft  # noqa: E402
from desktop.engine.decode.generation import generate_columns  # noqa: E402
from desktop.engine.kernels.gemv import fbgemm_available  # noqa: E402
from desktop.engine.nanochat.backend import NanochatBackend  # noqa: E402
from desktop.engine.nanochat.loader import load_model  # noqa: E402
from desktop.engine.params import SamplingParams  # noqa: E402

STEP = 1000
TEMPERATURE, TOP_K, SEED = 0.8, 50, 1
REIMPLEMENTATION = "benchmarks/nanochat_baseline.py (re-implementation)"


def timed_tokens(gen) -> tuple[float, float, list[int]]:
    """(seconds to the first token, decode tok/s after it, the tokens) of a token generator."""
    t0 = time.perf_counter()
    tokens: list[int] = []
    t_first = 0.0
    for token in gen:
        tokens.append(token)
        if len(tokens) == 1:
            t_first = time.perf_counter()
    end = time.perf_counter()
    return t_first - t0, (len(tokens) - 1) / max(end - t_first, 1e-9), tokens


def ours(model, prompt: list[int], new: int) -> Iterator[int]:
    params = SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, max_tokens=new, seed=SEED)
    return (c.tokens[0] for c in generate_columns(model, IdsOnlyTokenizer(), prompt, params))


def theirs(baseline: NanochatE7 | RealEngine, prompt: list[int], new: int) -> Iterator[int]:
    return baseline.generate(prompt, new, TEMPERATURE, TOP_K, seed=SEED)


def make_baseline(src: Path | None, ckpt: Path, depth: int) -> tuple[NanochatE7 | RealEngine, str]:
    """nanochat's real Engine from ``src`` when that works, else the re-implementation; and its label."""
    if src is not None:
        meta = json.loads((ckpt / f"meta_{STEP:06d}.json").read_text())["model_config"]
        known = dataclasses.asdict(nanochat_e7(depth))
        try:
            real = load_real_engine(src, ckpt / f"model_{STEP:06d}.pt", meta, known)
        except NanochatSourceError as exc:
            print(f"bench_engine: {exc}; falling back to {REIMPLEMENTATION}", file=sys.stderr)
        else:
            for note in real.mapped:
                print(f"bench_engine: GPTConfig mapping: {note}", flush=True)
            return real, real.label
    return NanochatE7(ckpt, STEP), REIMPLEMENTATION


def decode_rounds(contenders: dict, prompt: list[int], new: int, repeats: int) -> dict[str, list]:
    """Each contender's decode tok/s per round and its tokens; the order rotates every round."""
    names = list(contenders)
    for name in names:  # warm-up
        timed_tokens(contenders[name](prompt, new))
    out: dict[str, list] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            _, rate, tokens = timed_tokens(contenders[name](prompt, new))
            out[name].append((rate, tokens))
    return out


def load_figures(ckpt: Path, dtype: str, stream_tokens: int) -> dict:
    """``nanoscope bench`` in a fresh process: load time and memory, nothing else running."""
    cmd = [sys.executable, "-m", "desktop", "bench", str(ckpt), "--dtype", dtype, "--json"]
    cmd += ["--prompt-tokens", "16", "--new-tokens", "8", "--repeats", "1"]
    cmd += ["--stream-tokens", str(stream_tokens)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_depth(base: Path, depth: int, repeats: int, new: int, src: Path | None) -> dict:
    ckpt = write_e7(base, depth, STEP)
    exact = load_model(ckpt, dtype="float32")
    models = {"exact": exact.model, "fast": load_model(ckpt, dtype="fast").model}
    if fbgemm_available():
        models["int8"] = load_model(ckpt, dtype="int8").model
    baseline, label = make_baseline(src, ckpt, depth)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 32000, (16,), generator=g).tolist()
    contenders: dict[str, Callable[[list[int], int], Iterator[int]]]
    contenders = {"baseline": lambda p, n: theirs(baseline, p, n)}
    contenders.update({name: functools.partial(ours, m) for name, m in models.items()})
    rounds = decode_rounds(contenders, prompt, new, repeats)
    decode = {name: statistics.median(rate for rate, _ in runs) for name, runs in rounds.items()}
    same_ids = all(a == b for (_, a), (_, b) in zip(rounds["exact"], rounds["baseline"], strict=True))

    ttft: dict[str, dict[int, float]] = {"baseline": {}, "exact": {}}
    for n in (16, 256, 1024):
        p = torch.randint(0, 32000, (n,), generator=g).tolist()
        b, e = [], []
        for _ in range(max(1, repeats // 2) if depth < 20 else 1):
            b.append(timed_tokens(theirs(baseline, p, 1))[0])
            e.append(timed_tokens(ours(models["exact"], p, 1))[0])
        ttft["baseline"][n], ttft["exact"][n] = statistics.median(b) * 1000, statistics.median(e) * 1000
    session = NanochatBackend(exact, IdsOnlyTokenizer(exact.config.vocab_size))
    cached, full = turn_ttft(session, exact.config.vocab_size, history_len=1000)
    turn = {"full_ms": full, "cached_ms": cached}
    step_bytes = {name: m.decode_bytes() for name, m in models.items()}
    return {
        "depth": depth,
        "baseline": label,
        "params": exact.n_params,
        "same_ids": same_ids,
        "decode": decode,
        "decode_rounds": {name: [round(rate, 2) for rate, _ in runs] for name, runs in rounds.items()},
        "ttft_ms": ttft,
        "bytes_per_step": step_bytes,
        "turn": turn,
    }


def _x(a: float, b: float) -> str:
    return f"{a:.1f} ({a / b:.2f}×)"


MODES = {"float32": "exact", "fast": "fast", "int8": "int8"}


def baselines_line(results: list[dict]) -> str:
    """Which baseline each depth was measured against (one name when they all agree)."""
    labels = {r["baseline"] for r in results}
    if len(labels) == 1:
        return f"Baseline: {labels.pop()}."
    return "Baselines: " + "; ".join(f"depth {r['depth']}: {r['baseline']}" for r in results) + "."


def markdown(results: list[dict], bw: dict, meta: dict) -> str:
    int8 = all("int8" in r["decode"] for r in results)
    lines = [
        f"Machine: {meta['machine']}; torch {meta['torch']}; {meta['threads']} threads; measured "
        f"{meta['date']}; {meta['repeats']} rounds of {meta['new']} new tokens per contender, medians. "
        f"Same-run bandwidth (GB/s, mean of the start and the end): copy {bw['copy_gbs']:.1f}, "
        f"read {bw['read_gbs']:.1f}, fp32 matrix-vector {bw['linear_gbs']:.1f} with `F.linear`, "
        f"{bw['split_gbs']:.1f} with exact mode's row split (the ceiling below: "
        f"{bw['matvec_gbs']:.1f}).",
        "",
        baselines_line(results),
        "",
        "**Decode** (tok/s; × is against the baseline unless noted):",
        "",
        "| depth | params | MB/step exact | baseline | exact | fast (fp16 weights) "
        + ("| int8 " if int8 else "")
        + "| exact GB/s | MBU vs ceiling | MBU vs `F.linear` | same ids |",
        "|---|---|---|---|---|---|" + ("---|" if int8 else "") + "---|---|---|---|",
    ]
    for r in results:
        d, nbytes = r["decode"], r["bytes_per_step"]
        gbs = nbytes["exact"] * d["exact"] / 1e9
        row = (
            f"| {r['depth']} | {r['params'] / 1e6:.0f}M | {nbytes['exact'] / 1e6:.0f} | "
            f"{d['baseline']:.1f} | {_x(d['exact'], d['baseline'])} | "
            f"{_x(d['fast'], d['baseline'])}, {d['fast'] / d['exact']:.2f}× exact | "
        )
        if int8:
            row += f"{_x(d['int8'], d['baseline'])}, {d['int8'] / d['exact']:.2f}× exact | "
        row += f"{gbs:.1f} | {gbs / bw['matvec_gbs']:.2f} | {gbs / bw['linear_gbs']:.2f} | {r['same_ids']} |"
        lines.append(row)
    lines += [
        "",
        "**Prefill and follow-up turns** (ms; baseline → exact):",
        "",
        "| depth | TTFT @16 | TTFT @256 | TTFT @1024 | turn-N TTFT, full re-prefill → prefix cache |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        t, turn = r["ttft_ms"], r["turn"]
        cells = " | ".join(f"{t['baseline'][n]:.0f} → {t['exact'][n]:.0f}" for n in (16, 256, 1024))
        lines.append(
            f"| {r['depth']} | {cells} | {turn['full_ms']:.0f} → {turn['cached_ms']:.0f} "
            f"({turn['cached_ms'] / turn['full_ms']:.2f}) |"
        )
    lines += [
        "",
        "**Loading and memory** (`nanoscope bench` in a fresh process per mode; after load the budget is "
        "checkpoint + 15% + 300 MB; while streaming, checkpoint + the KV cache for the positions "
        "streamed, in the model's dtype, + 300 MB; the prompt is the first half of them):",
        "",
        "| depth | mode | checkpoint MB | load s | RSS after load MB (budget) | positions streamed "
        "| peak RSS streaming MB | budget MB (KV cache MB) | within |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for dtype, f in r["load"].items():
            lines.append(
                f"| {r['depth']} | {MODES[dtype]} | {f['checkpoint_mb']:.0f} | {f['load_s']:.2f} | "
                f"{f['rss_after_load_mb']:.0f} ({f['rss_budget_mb']:.0f}) | {f['stream_positions']} | "
                f"{f['stream_peak_rss_mb']:.0f} | {f['stream_rss_budget_mb']:.0f} ({f['kv_cache_mb']:.0f}) | "
                f"{'yes' if f['stream_within_budget'] else 'no'} |"
            )
    return "\n".join(lines)


def cpu_name() -> str:
    """The processor's model name and the widest vector ISA torch uses on it."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depths", default="4,8,12,20")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--base", type=Path, default=Path("/tmp/nanoscope-bench"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    parser.add_argument(
        "--nanochat-src",
        type=Path,
        default=Path(os.environ["NANOCHAT_SRC"]) if os.environ.get("NANOCHAT_SRC") else None,
        help="a nanochat source checkout: race its real Engine.generate (default: $NANOCHAT_SRC)",
    )
    parser.add_argument("--stream-tokens", type=int, default=2048, help="positions of the memory stream")
    args = parser.parse_args()
    cpu = torch.device("cpu")
    before = measure_bandwidth(cpu)
    results = []
    dtypes = ["float32", "fast"] + (["int8"] if fbgemm_available() else [])
    for depth in (int(d) for d in args.depths.split(",")):
        r = bench_depth(args.base, depth, args.repeats, args.new_tokens, args.nanochat_src)
        print(f"depth {depth}: baseline: {r['baseline']}; same ids: {r['same_ids']}", flush=True)
        ckpt = write_e7(args.base, depth, STEP)  # already written: its directory
        r["load"] = {dtype: load_figures(ckpt, dtype, args.stream_tokens) for dtype in dtypes}
        print(json.dumps(r), flush=True)
        results.append(r)
    after = measure_bandwidth(cpu)
    bw = {k: (before[k] + after[k]) / 2 for k in before}
    meta = {
        "machine": cpu_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
        "repeats": args.repeats,
        "new": args.new_tokens,
    }
    write_section(args.out, "engine", markdown(results, bw, meta))
    summary = {"baseline": baselines_line(results), "bandwidth": {"start": before, "end": after}}
    print(json.dumps({**summary, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
