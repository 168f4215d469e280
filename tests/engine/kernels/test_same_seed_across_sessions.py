"""The same seed, prompt and settings give the same reply in the next session, in every mode.

Two processes on one home each ask the demo model for a reply in exact, fast and int8 mode, and
speculatively with every kind of draft (the target's own weights at int8, at the fast precision and
as ``auto`` picks them, an earlier step of its run, the run's smaller depth at int8), and the nanochat
fork's golden model plainly and with its MTP head drafting, with the user's seed and sampling. The
stopwatch is injected: the first session times on a "busy" machine (other programs' share of the
CPU is said to be 90%) and finds other kernels, few-row routes and draft costs fastest than the
second session would; had the second session timed again, it would compute other numbers
(another kernel, another draft length). It must time nothing, and give the same ids.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.golden import GOLDEN, manifest

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "resources" / "demo" / "chatsft_checkpoints" / "demo"
FORK = GOLDEN / "fork" / "engram-mhc-mtp-swiglu"  # a checkpoint with an MTP head
_FORK = manifest(FORK)
TARGETS = {  # name -> (checkpoint folder, step, base_dir)
    "demo": (str(DEMO), 300, None),
    "fork": (str(FORK / "chatsft_checkpoints" / _FORK["tag"]), _FORK["step"], str(FORK)),
}
MODES = {  # mode -> (target, dtype, draft)
    "exact": ("demo", "float32", ""),
    "fast": ("demo", "fast", ""),
    "int8": ("demo", "int8", ""),
    "speculative": ("demo", "float32", "int8"),
    "speculative fast": ("demo", "float32", "fast"),
    "speculative auto": ("demo", "float32", "auto"),
    "speculative earlier step": ("demo", "float32", f"{DEMO}@1000"),
    "speculative smaller depth int8": ("demo", "float32", f"int8:{DEMO.parent / 'demo-d2'}"),
    "fork exact": ("fork", "float32", ""),
    "fork speculative mtp": ("fork", "float32", "mtp"),
}

# One session: the stopwatch and the machine's load as argv says, then a reply in each mode (the
# model loaded as the app loads it). It prints each reply's ids and log-probabilities (the numbers
# a kernel computes), how many candidates its tuner timed, and, after a re-measure, what the
# engine says of the new choices.
SESSION = r"""
import itertools, json, sys, threading
from pathlib import Path
from desktop.engine.backend import GenerationStats, LoadOptions, StreamOptions
from desktop.engine.decode import speculative
from desktop.engine.kernels import stopwatch, tuning
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

cache, busy, prefer, costs = Path(sys.argv[1]), sys.argv[2] == "busy", sys.argv[3].split(","), sys.argv[4]
modes, targets = json.loads(sys.argv[5]), json.loads(sys.argv[6])
stopwatch.OtherLoad.share = lambda self: 0.9 if busy else 0.0

def us(name):
    return 10.0 * (prefer.index(name) + 1) if name in prefer else 1000.0

tuning.stream_times = lambda candidates, part, refused: {c.name: us(c.name) for c in candidates}
tuning.best_us = lambda calls, flush: {name: us(name) for name in calls}
# measure_costs times a target step, a draft step, then a target pass over several rows.
step_ms, draft_ms, wide_ms = map(float, costs.split(","))
timed = itertools.cycle([step_ms, draft_ms, wide_ms])
speculative.timed_ms = lambda model, make_cache, rows: next(timed)
params = SamplingParams(temperature=1.45, top_k=7, max_tokens=16, seed=1722145630)

def reply(mode):
    target, dtype, draft = modes[mode]
    folder, step, base_dir = targets[target]
    base = Path(base_dir) if base_dir else None
    options = LoadOptions(step=step, device="cpu", dtype=dtype, base_dir=base, kernel_cache=cache)
    backend = open_backend(Path(folder), options)
    prompt = backend.render([Message.of_text("user", "What is 23 times 4?")], None, chat=True)
    stats = GenerationStats()
    options = StreamOptions(logprobs=1, draft=draft)
    events = list(backend.stream(prompt, params, threading.Event(), options, stats))
    renewed = [backend.info().choices_renewed, stats.choices_renewed]
    backend.close()
    return [[e.id, e.logprob] for e in events if e.id >= 0], renewed, stats.drafted

first = {mode: reply(mode) for mode in modes}
out = {"replies": {m: r[0] for m, r in first.items()}, "drafted": {m: r[2] for m, r in first.items()}}
out["measured"] = tuning.tuner_for(cache).measured
if sys.argv[7] == "remeasure":  # Settings > Re-measure kernels, then the same replies
    tuning.remeasure(cache)
    out["renewed"] = {mode: reply(mode)[1] for mode in ("exact", "fast", "int8", "speculative")}
print(json.dumps(out))
"""


def _session(cache: Path, busy: bool, prefer: list[str], costs: str, then: str = "") -> dict:
    load = "busy" if busy else "quiet"
    args = [str(cache), load, ",".join(prefer), costs, json.dumps(MODES), json.dumps(TARGETS), then]
    run = subprocess.run(
        [sys.executable, "-c", SESSION, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_the_next_session_gives_the_same_numbers_after_a_busy_first_session(tmp_path):
    cache = tmp_path / "cache" / "kernel_timings.json"
    # Busy: fp32 and F.linear came out fastest, and a cheap draft (it drafts long rounds).
    first = _session(cache, True, ["fp32 exact", "F.linear", "blocks", "rows transposed"], "1.0,0.2,1.2")
    # Quiet, timed again, this machine would pick the packed kernels, another few-row route, and
    # find the draft too dear to draft at all: other numbers, other ids.
    quiet = ["int8 weight-only", "fbgemm int8", "fp16 F.linear", "fbgemm fp16", "rows transposed", "blocks"]
    second = _session(cache, False, quiet, "1.0,0.95,3.0", then="remeasure")
    assert first["measured"] > 0  # the first session timed (its injected stopwatch)
    assert second["measured"] == 0  # the second kept every choice, busy-time ones included
    assert set(first["replies"]) == set(MODES)
    # Every draft drafted in the first session (a cheap draft, by its stopwatch); the second,
    # timed anew, would have found each too dear to draft at all.
    assert all(first["drafted"][mode] > 0 for mode, (_, _, draft) in MODES.items() if draft)
    assert second["replies"] == first["replies"]  # the same ids, and the same log-probabilities
    # After a re-measure the lossy modes' kernels and the draft's costs are chosen anew, and said
    # so: at the load (ModelInfo) and on the first reply (GenerationStats). Exact mode's
    # one-row routes all give F.linear's bits: nothing of it changes, nothing is said.
    renewed = second["renewed"]
    assert renewed["exact"] == [False, False]
    assert renewed["fast"] == renewed["int8"] == [True, True]
    assert renewed["speculative"][1]
