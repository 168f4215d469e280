"""How fast a reply streams while a background compile would otherwise run (issue "Numbers you can
trust": a reply streamed during a compile once ran at 5.7 tokens/s instead of ~100).

The bundled demo is opened twice through its backend, as the app opens it, and asked the demo's
prompts with demo-d2 (the miniseries' depth 2) drafting:

* without compiles: the baseline;
* with ``compile_drafts`` and demo-d2 named as its draft, on an empty inductor cache, so both
  compiles (the draft's forward and the target's verifying passes) start cold on their threads.
  The same replies are then asked one after another, with a pause between them as a user reading
  leaves, until the draft's compile has ended (later replies would draft with its code). Each
  reply holds the compiles while it streams (desktop/engine/foreground.py).

Reported: the replies' decode speeds (median and slowest) with and without a compile under way,
and how long the compiles took with the replies between them. Writes the section
``polite-compile`` of docs/PERFORMANCE.md.

    python benchmarks/bench_polite_compile.py [--pause 1.0] [--limit 600]

Run it on a quiet machine: it measures what a compile takes from a reply, not from other programs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# A cold compile, as a user's first: inductor reads its cache folder at the process's first compile.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="nanoscope-inductor-")

from perf_report import write_section  # noqa: E402

from desktop.engine.backend import GenerationStats, LoadOptions, StreamOptions  # noqa: E402
from desktop.engine.decode.compiled_draft import why_not_compiled  # noqa: E402
from desktop.engine.kernels.machine import cpu_name  # noqa: E402
from desktop.engine.messages import Message  # noqa: E402
from desktop.engine.params import SamplingParams  # noqa: E402
from desktop.engine.registry import open_backend  # noqa: E402

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
DEMO_D2 = DEMO.parent / "demo-d2"
PROMPTS = ("What is 12 times 7?", "How many r are in strawberry?", "Tell me about yourself.")
PARAMS = SamplingParams(temperature=0.0, max_tokens=64)
# Replies drafted by demo-d2, as the user who named it gets them: its eager form while it compiles
# (a reply without the draft would let it go, and its compile with it).
DRAFTED = StreamOptions(reuse_cache=False, draft=str(DEMO_D2))


def reply_speed(backend, question: str) -> float:
    """One reply to ``question``, drafted by demo-d2; its decode speed in tokens/s."""
    prompt = backend.render([Message.of_text("user", question)], PARAMS.max_tokens)
    stats = GenerationStats()
    for _ in backend.stream(prompt, PARAMS, threading.Event(), DRAFTED, stats):
        pass
    return stats.decode_tok_s


def baseline(rounds: int) -> list[float]:
    backend = open_backend(DEMO, LoadOptions(dtype="float32"))
    try:
        reply_speed(backend, PROMPTS[0])  # first-call costs
        return [reply_speed(backend, q) for _ in range(rounds) for q in PROMPTS]
    finally:
        backend.close()


def during_compile(pause_s: float, limit_s: float) -> tuple[list[tuple[float, float]], float, str]:
    """Replies while the draft compiles (the verifier's compile beside it): when each started
    (seconds into the compile) and its speed, the compile's time, and how it ended. Replies end
    with the draft's compile: from then on a reply may draft with the compiled code, faster than
    the baseline's eager draft."""
    home = Path(tempfile.mkdtemp(prefix="nanoscope-polite-"))
    options = LoadOptions(dtype="float32", compile_drafts=True, kernel_cache=home / "kernels.json")
    backend = open_backend(DEMO, options)
    try:
        started = time.perf_counter()
        draft = backend.draft(str(DEMO_D2))  # starts the draft's compile; opening started the verifier's
        twins = [t for t in (draft.twin, getattr(backend.verifier, "twin", None)) if t is not None]
        speeds: list[tuple[float, float]] = []
        while not all(t.done.is_set() for t in twins) and time.perf_counter() - started < limit_s:
            at = time.perf_counter() - started
            if twins[0].done.is_set():  # the draft's compile ended: later replies may use its code
                break
            speeds.append((at, reply_speed(backend, PROMPTS[len(speeds) % len(PROMPTS)])))
            time.sleep(pause_s)  # the user reads the reply; the compiles go on
        compile_s = time.perf_counter() - started
        ended = "ended" if twins[0].done.is_set() else f"still running after {limit_s:.0f} s"
        if twins[0].error:
            ended += f" (failed: {twins[0].error})"
        return speeds, compile_s, ended
    finally:
        backend.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between replies")
    parser.add_argument("--limit", type=float, default=600.0, help="longest wait for the compiles")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the prompts for the baseline")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    why = why_not_compiled()
    if why is not None:
        print(f"nothing to measure: {why}")
        return 1
    quiet = baseline(args.rounds)
    replies, compile_s, ended = during_compile(args.pause, args.limit)
    busy = [speed for _, speed in replies]
    if not busy:
        print("the compiles ended before a reply was asked (a warm cache?)")
        return 1
    slow = [at for at, speed in replies if speed < statistics.median(quiet) / 2]
    when = f", all within {max(slow):.0f} s of the compiles' start" if slow else ""
    body = (
        f"The demo's replies drafted by demo-d2 (greedy, up to {PARAMS.max_tokens} tokens) on {cpu_name()}, "
        f"{os.cpu_count()} logical CPUs. Without a compile: median {statistics.median(quiet):.0f} "
        f"tokens/s (slowest {min(quiet):.0f}, {len(quiet)} replies). While demo-d2's draft and the "
        f"target's verifying passes compiled cold in the background (the draft's compile {ended} in "
        f"{compile_s:.0f} s, "
        f"a reply every {args.pause:.1f} s between): median {statistics.median(busy):.0f} tokens/s "
        f"(slowest {min(busy):.0f}; {len(slow)} of {len(busy)} replies under half the speed without a "
        f"compile{when}), "
        f"{statistics.median(busy) / statistics.median(quiet):.2f}x the speed without one. "
        f"Before the compile made way (issue #40): 5.7 tokens/s against ~100."
    )
    print(body)
    write_section(args.out, "polite-compile", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
