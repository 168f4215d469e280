"""Plain replies with compiled steps against eager ones (issue #42): fast and int8 mode.

A random-weight E7 checkpoint of ``--depth`` (nanochat's sizing, C = 64·depth) with a BPE
tokenizer of ``--vocab`` ids (the test suite's tokenizer factory; it makes up to 8,192) is
written to a temporary folder and opened in each ``--modes`` on the CPU, its one-row step
compiled in the background as the app does (``compile_drafts``; inductor's cache in ``--home``).
Then, alternated in ``--rounds`` rounds: a greedy ``--tokens``-token reply through the eager
forward and through the compiled step (``stream_reply``, as a plain reply runs; its decode
speed after the first token, as the footer gives it), and one step timed alone each way.
Also counted: how many of a reply's passes ran compiled code (a guard that fails sends a pass
to the eager forward, silently). Writes the section ``compiled-step``
of docs/PERFORMANCE.md (not with ``--quick``: a depth-2 model, one round).

    python benchmarks/bench_compiled_step.py [--depth 12] [--modes int8,fast] [--home DIR] [--quick]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(Path(__file__).resolve().parent)]
import torch  # noqa: E402
from make_checkpoint import write_e7  # noqa: E402
from perf_report import write_section  # noqa: E402
from support.tokenizer_factory import write_tiktoken_pkl  # noqa: E402

from desktop.config import paths  # noqa: E402
from desktop.engine.backend import GenerationStats, LoadOptions  # noqa: E402
from desktop.engine.decode.generation import stream_reply  # noqa: E402
from desktop.engine.decode.kvcache import KVCache  # noqa: E402
from desktop.engine.kernels.machine import machine_id  # noqa: E402
from desktop.engine.params import SamplingParams  # noqa: E402
from desktop.engine.registry import open_backend  # noqa: E402

COMPILE_WAIT_S = 1800


def reply(model, tok, prompt: list[int], params: SamplingParams) -> tuple[float, list[int], int]:
    """(decode tok/s after the first token, as the footer says; the ids) of one greedy reply
    through ``model``, and how many of an 8-token
    reply's 7 steps ran compiled code."""
    stats = GenerationStats()
    ids = [ev.id for ev in stream_reply(model, tok, prompt, params, stats=stats)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        list(stream_reply(model, tok, prompt, SamplingParams(temperature=0.0, max_tokens=8)))
    compiled = sum(e.count for e in prof.key_averages() if e.key.startswith("Torch-Compiled Region"))
    return stats.decode_tok_s, ids, compiled


@torch.inference_mode()
def step_ms(model, prompt: list[int], steps: int = 32) -> float:
    """One row's step, timed alone over ``steps`` steps after the prompt."""
    cfg = model.config
    cache = KVCache(cfg, 1, len(prompt) + steps + 8, model.device, model.compute_dtype)
    model(torch.tensor([prompt]), cache, last_only=True)
    ids = torch.tensor([[5]])
    model(ids, cache)
    t0 = time.perf_counter()
    for _ in range(steps):
        model(ids, cache)
    return (time.perf_counter() - t0) / steps * 1e3


def bench_mode(directory: Path, mode: str, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    options = LoadOptions(
        device="cpu",
        dtype=mode,
        kernel_cache=paths.kernel_timings_file(),
        compile_drafts=True,
        compile_wait_s=COMPILE_WAIT_S,
    )
    backend = open_backend(directory, options)
    compile_s = time.perf_counter() - t0
    try:
        step = backend._step
        step.settle(None)
        eager, compiled = step.eager, step.model
        if not step.compiled:
            return {"mode": mode, "why": step.why or "not compiled"}
        tok = backend.tok
        prompt = [tok.special_id("<|bos|>"), *tok.encode("The quick brown fox jumps over the lazy dog. " * 4)]
        params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
        rows: dict[str, list] = {"eager": [], "compiled": [], "eager_step": [], "compiled_step": []}
        ids: dict[str, list[int]] = {}
        passes = 0
        for _ in range(args.rounds):
            for name, model in (("eager", eager), ("compiled", compiled)):
                speed, ids[name], ran = reply(model, tok, prompt, params)
                rows[name].append(speed)
                rows[f"{name}_step"].append(step_ms(model, prompt))
                passes = ran if name == "compiled" else passes
        return {
            "mode": mode,
            "compile_s": compile_s,
            "same_ids": ids["eager"] == ids["compiled"],
            "compiled_passes": passes,
            **{k: statistics.median(v) for k, v in rows.items()},
            "rounds": rows,
        }
    finally:
        backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--modes", default="int8,fast")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--home", type=Path, default=None, help="keeps kernel timings and inductor's cache")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.depth, args.vocab, args.tokens, args.rounds = 2, 512, 16, 1
    paths.set_home(args.home or Path(tempfile.mkdtemp(prefix="nanoscope-bench-")))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        write_e7(base, args.depth, vocab=args.vocab, seq=2048)
        write_tiktoken_pkl(base / "tokenizer", vocab_size=args.vocab)
        directory = next(p for p in base.rglob("model_*.pt")).parent
        for mode in args.modes.split(","):
            results.append(bench_mode(directory, mode, args))
            print(results[-1], flush=True)
    lines = [
        f"Machine: {machine_id()} ({platform.machine()}), {torch.get_num_threads()} threads. A random-weight "
        f"E7 checkpoint of depth {args.depth} (n_embd {64 * args.depth}, vocab {args.vocab}), greedy "
        f"{args.tokens}-token replies, eager and compiled alternated in {args.rounds} rounds (medians).",
        "",
        "| mode | eager decode | compiled decode | × | step alone, eager → compiled | same ids "
        "| steps compiled (of 7) | compile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "why" in r:
            lines.append(f"| {r['mode']} | — | {r['why']} | | | | | |")
            continue
        lines.append(
            f"| {r['mode']} | {r['eager']:.1f} tok/s | {r['compiled']:.1f} tok/s | "
            f"{r['compiled'] / r['eager']:.2f} | {r['eager_step']:.1f} → {r['compiled_step']:.1f} ms | "
            f"{'yes' if r['same_ids'] else 'no'} | {r['compiled_passes']} | {r['compile_s']:.0f} s |"
        )
    report = "\n".join(lines)
    print(report)
    if not args.quick:
        write_section(REPO / "docs" / "PERFORMANCE.md", "compiled-step", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
