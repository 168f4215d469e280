"""Speculative decoding (issue #22): decode speed with a draft against exact-mode plain decoding,
each ratio from the same run, the acceptance of every pair, the fallback's overhead when the
draft is never right, and the peak memory. Writes the section ``speculative`` of
docs/PERFORMANCE.md, naming the CPU.

Pairs:

* the int8 self-draft, and ``auto`` (the cheaper of int8 and fp16 as timed), of random-weight d12
  and d20 models (nanochat's current architecture, vocabulary 32768), target in exact fp32;
* the demo's four steps (one trained run): steps 300, 1000 and 1700 drafting for step 2400, and
  step 2400's own int8 copy; and the demo miniseries' depth-2 model (demo-d2, same data and
  tokenizer) drafting for its depth-4 one;
* demo-d2 again with its forward compiled in the background (engine/decode/compiled_draft.py),
  as the app does where a C++ compiler is found;
* d12 with another random d12's int8 copy as the draft: acceptance about 0, the adaptive length
  must fall back to plain decoding by itself.

    python benchmarks/bench_speculative.py [--tokens 64] [--depths 12,20] [--out docs/PERFORMANCE.md]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from make_checkpoint import write_e7  # noqa: E402
from perf_report import write_section  # noqa: E402

from desktop.engine.backend import GenerationStats, LoadOptions  # noqa: E402
from desktop.engine.bench import IdsOnlyTokenizer, current_rss_bytes, peak_rss_bytes, reset_peak_rss  # noqa: E402
from desktop.engine.decode.compiled_draft import why_not_compiled  # noqa: E402
from desktop.engine.decode.drafts import DraftSpec  # noqa: E402
from desktop.engine.decode.generation import stream_reply  # noqa: E402
from desktop.engine.decode.kvcache import KVCache  # noqa: E402
from desktop.engine.decode.speculative import Draft, ready_draft, stream_speculative  # noqa: E402
from desktop.engine.decode.verifier import Verifier  # noqa: E402
from desktop.engine.kernels.machine import machine_id  # noqa: E402
from desktop.engine.kernels.memory import release_freed_memory  # noqa: E402
from desktop.engine.messages import Message  # noqa: E402
from desktop.engine.nanochat.drafts import make_draft  # noqa: E402
from desktop.engine.nanochat.loader import LoadedModel, load_model  # noqa: E402
from desktop.engine.params import CHAT_DEFAULTS, SamplingParams  # noqa: E402
from desktop.engine.registry import open_backend  # noqa: E402

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
DEMO_D2 = DEMO.parent / "demo-d2"  # the miniseries' smaller depth: same data, same tokenizer
VOCAB = 32768
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = CHAT_DEFAULTS  # T 0.8, top-k 50: what Chat starts with
# Rounds of the demo's prompts per row: a demo reply takes a fifth of a second, and the plain speed
# of one model moved 250-440 tok/s within one run of one round on a shared 2-core machine.
DEMO_ROUNDS = 4
DEMO_PROMPTS = ("What is 12 times 7?", "How many r are in strawberry?", "Tell me about yourself.")


@dataclass
class Run:
    tok_s: float
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    passes: int = 0  # target passes: rounds, each ending on a token the target sampled itself
    kv: int = 0  # bytes of both caches at the end


def _cache(model) -> KVCache:
    return KVCache(model.config, 1, 64, model.device, model.compute_dtype)


def plain(model, tok, prompt, params) -> Run:
    cache = _cache(model)
    started = time.perf_counter()
    n = sum(1 for e in stream_reply(model, tok, prompt, params, cache=cache) if e.id >= 0)
    return Run(n / (time.perf_counter() - started), tokens=n, passes=n, kv=cache.nbytes())


def speculative(
    model, tok, prompt, params, draft: Draft, k: int = 0, verifier: Verifier | None = None
) -> Run:
    """As a backend streams with ``StreamOptions.draft``: plainly where no draft length pays;
    ``verifier``: what computes the target's passes (default: the target itself)."""
    if not draft.pays(k, verifier):
        return plain(model, tok, prompt, params)
    stats = GenerationStats()
    draft.cache = None
    cache = _cache(model)
    limit = model.config.rope_len
    started = time.perf_counter()
    events = stream_speculative(
        model, tok, prompt, params, draft, cache=cache, limit=limit, stats=stats, draft_k=k, verifier=verifier
    )
    marks = [e.draft for e in events if e.id >= 0]
    tok_s = len(marks) / (time.perf_counter() - started)
    passes = sum(mark != "accepted" for mark in marks)
    kv = cache.nbytes() + draft.cache.nbytes()
    return Run(tok_s, stats.drafted, stats.accepted, len(marks), passes, kv)


def compare(
    model, tok, prompts, params, draft: Draft, k: int = 0, rounds: int = 1, verifier: Verifier | None = None
) -> dict:
    """Plain and speculative replies to each prompt, alternated, ``rounds`` times, which of the two
    goes first swapping each round (after one of each untimed, for first-call costs); speeds are
    medians."""

    def first(prompt: list) -> Run:
        return plain(model, tok, prompt, params)

    def second(prompt: list) -> Run:
        return speculative(model, tok, prompt, params, draft, k, verifier)

    first(prompts[0])
    second(prompts[0])
    base, spec = [], []
    for r in range(rounds):
        for prompt in prompts:
            if r % 2:
                spec.append(second(prompt))
                base.append(first(prompt))
            else:
                base.append(first(prompt))
                spec.append(second(prompt))
    drafted, accepted = sum(r.drafted for r in spec), sum(r.accepted for r in spec)
    return {
        "replies": len(spec),
        "plain": statistics.median(r.tok_s for r in base),
        "spec": statistics.median(r.tok_s for r in spec),
        "acceptance": accepted / drafted if drafted else None,
        "per_pass": sum(r.tokens for r in spec) / max(1, sum(r.passes for r in spec)),
        "drafted": drafted,
        "tokens": sum(r.tokens for r in spec),
    }


def costs(draft: Draft, verifier: Verifier | None = None) -> str:
    """What a row keeps of a draft (not the draft: its model would stay in memory), with the
    verifier's costs where it is compiled."""
    if verifier is None or not verifier.compiled:
        return f"{draft.cost:.2f}, {draft.verify_cost:.2f}"
    base, verify = verifier.costs(draft.verify_cost)
    return f"{draft.cost:.2f}, {verify:.2f} (base {base:.2f})"


def self_draft(loaded: LoadedModel, precision: str = "int8") -> Draft:
    return make_draft(
        loaded, IdsOnlyTokenizer(), DraftSpec(precision, precision), lambda *_: IdsOnlyTokenizer()
    )


def random_pair(tmp: Path, depth: int, tokens: int, rows: list, memory: list) -> None:
    ckpt = write_e7(tmp / f"d{depth}", depth, vocab=VOCAB)
    loaded = load_model(ckpt, dtype="float32")
    tok = IdsOnlyTokenizer(VOCAB)
    before = current_rss_bytes()
    draft = self_draft(loaded)
    own = current_rss_bytes() - before  # what the draft added: its packed matrices
    prompts = [list(range(100 + 64 * i, 164 + 64 * i)) for i in range(2)]
    for label, params in (("greedy", GREEDY), ("T 0.8, top-k 50", SAMPLED)):
        row = compare(loaded.model, tok, prompts, params.with_values(max_tokens=tokens), draft)
        rows.append((f"d{depth} random, int8 self-draft", label, costs(draft), row))
    auto = self_draft(loaded, "auto")  # the cheaper of the int8 and fp16 copies, as timed here
    row = compare(loaded.model, tok, prompts, GREEDY.with_values(max_tokens=tokens), auto)
    rows.append((f"d{depth} random, auto self-draft: {auto.name}", "greedy", costs(auto), row))
    del auto
    release_freed_memory()
    reset_peak_rss()
    run = speculative(loaded.model, tok, prompts[0], GREEDY.with_values(max_tokens=tokens), draft)
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    memory.append((f"d{depth}", peak_rss_bytes(), weights, own, run.kv))
    if depth == 12:
        # Another random d12 in int8: its proposals are about never right.
        stranger = load_model(write_e7(tmp / "stranger", depth, seed=1, vocab=VOCAB), dtype="int8").model
        limit = stranger.config.rope_len
        wrong = ready_draft(
            stranger,
            "stranger",
            limit,
            lambda _n: _cache(stranger),
            loaded.model,
            lambda _n: _cache(loaded.model),
        )
        row = compare(loaded.model, tok, prompts, GREEDY.with_values(max_tokens=tokens), wrong)
        rows.append(("d12 random, another d12's int8 copy", "greedy", costs(wrong), row))


def demo_pairs(tokens: int, rows: list, notes: list) -> None:
    backend = open_backend(DEMO, LoadOptions(dtype="float32"))
    prompts = [list(backend.render([Message.of_text("user", q)], tokens).ids or ()) for q in DEMO_PROMPTS]
    model, tok = backend.model, backend.tok
    drafts = [(f"step {s} drafting for 2400", backend.draft(f"{DEMO}@{s}")) for s in (300, 1000, 1700)]
    drafts.append(("step 2400's int8 copy", backend.draft("int8")))
    drafts.append(("depth 2 (demo-d2) drafting for depth 4", backend.draft(str(DEMO_D2))))
    for name, draft in drafts:
        for label, params in (("greedy", GREEDY), ("T 0.8, top-k 50", SAMPLED)):
            run = params.with_values(max_tokens=tokens)
            rows.append(
                (
                    f"demo {name}, k=4",
                    label,
                    costs(draft),
                    compare(model, tok, prompts, run, draft, k=4, rounds=DEMO_ROUNDS),
                )
            )
        adaptive = compare(
            model, tok, prompts, GREEDY.with_values(max_tokens=tokens), draft, rounds=DEMO_ROUNDS
        )
        rows.append((f"demo {name}, adaptive", "greedy", costs(draft), adaptive))
    backend.close()
    compiled_pair(tokens, prompts, rows, notes)


def compiled_pair(tokens: int, prompts: list, rows: list, notes: list) -> None:
    """demo-d2 drafting for the demo with its forward compiled in the background, as the app
    does: the bench waits for the compile (nothing else runs meanwhile), then the draft settles
    (timed eager against compiled) as a reply's start does."""
    why = why_not_compiled()
    if why is not None:
        notes.append(f"The compiled draft was not measured: {why}.")
        return
    before = current_rss_bytes()
    backend = open_backend(DEMO, LoadOptions(dtype="float32", compile_drafts=True))
    draft = backend.draft(str(DEMO_D2))
    started = time.perf_counter()
    verifier = backend.verifier
    assert draft.twin is not None and verifier is not None and verifier.twin is not None
    draft.twin.done.wait()
    compile_s = time.perf_counter() - started
    verifier.twin.done.wait()
    both_s = time.perf_counter() - started
    eager_cost = draft.cost
    draft.settle()
    verifier.settle()
    extra_row = verifier.costs(draft.verify_cost)[1]
    grown = current_rss_bytes() - before
    notes.append(
        f"demo-d2 compiled: the background compile took {compile_s:.0f} s after the draft was made "
        f"(inductor's on-disk cache {'warm' if compile_s < 30 else 'cold'}); the draft's cost went "
        f"{eager_cost:.2f} -> {draft.cost:.2f} of a target step "
        f"({'adopted' if draft.compiled else 'not adopted: the eager step was faster'}). The target's "
        f"verifying passes were compiled {both_s - compile_s:.0f} s later "
        f"({'adopted' if verifier.compiled else 'not adopted: the eager passes were faster'}: a one-row "
        f"pass {verifier.base:.2f} of a plain step, each extra row {extra_row:.2f}). "
        f"The process grew {grown / 2**20:.0f} MB from opening the pair to the end of both compiles."
    )
    form = "compiled" if draft.compiled else "eager (compile not adopted)"
    model, tok = backend.model, backend.tok
    for checker, check_name in ((None, ""), (verifier, ", target's passes compiled")):
        name = f"depth 2 (demo-d2) {form} drafting for depth 4{check_name}"
        for label, params in (("greedy", GREEDY), ("T 0.8, top-k 50", SAMPLED)):
            run = params.with_values(max_tokens=tokens)
            row = compare(model, tok, prompts, run, draft, k=4, rounds=DEMO_ROUNDS, verifier=checker)
            rows.append((f"demo {name}, k=4", label, costs(draft, checker), row))
        run = GREEDY.with_values(max_tokens=tokens)
        adaptive = compare(model, tok, prompts, run, draft, rounds=DEMO_ROUNDS, verifier=checker)
        rows.append((f"demo {name}, adaptive", "greedy", costs(draft, checker), adaptive))
    # The model's own int8 copy, as the app drafts with it once the target's passes are compiled.
    own = backend.draft("int8")
    name = "demo step 2400's int8 copy, target's passes compiled"
    for label, params in (("greedy", GREEDY), ("T 0.8, top-k 50", SAMPLED)):
        run = params.with_values(max_tokens=tokens)
        row = compare(model, tok, prompts, run, own, 4, DEMO_ROUNDS, verifier)
        rows.append((f"{name}, k=4", label, costs(own, verifier), row))
    run = GREEDY.with_values(max_tokens=tokens)
    adaptive = compare(model, tok, prompts, run, own, 0, DEMO_ROUNDS, verifier)
    rows.append((f"{name}, adaptive", "greedy", costs(own, verifier), adaptive))
    backend.close()


def report(rows: list, memory: list, notes: list, tokens: int, seconds: float, baseline: int) -> str:
    lines = [
        f"Machine: {machine_id()}, {torch.get_num_threads()} threads. Target in exact fp32; "
        f"replies of up to {tokens} tokens to two or three prompts, plain and speculative alternated "
        "(*replies*: how many of each were timed); speeds are tokens per second of the whole reply, "
        "prompt included (median), each ratio from the same run. *Acceptance*: drafted tokens "
        "kept; *tokens/pass*: tokens streamed per target pass (1.0 is plain decoding). *cost* and "
        "*verify*: the draft's measured step and each extra verified row, as shares of a target step; "
        "*base*: a one-row pass of the target's compiled twin, likewise, where it verifies. "
        f"The whole run took {seconds:.0f} s.",
        "",
        "| pair | sampling | cost, verify | replies | acceptance | tokens/pass | plain tok/s "
        "| speculative tok/s | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pair, label, cost_verify, r in rows:
        acc = (
            f"{100 * r['acceptance']:.0f}% of {r['drafted']}"
            if r["acceptance"] is not None
            else "none drafted"
        )
        lines.append(
            f"| {pair} | {label} | {cost_verify} | {r['replies']} | {acc} | {r['per_pass']:.2f} "
            f"| {r['plain']:.1f} | {r['spec']:.1f} | {r['spec'] / r['plain']:.2f}x |"
        )
    lines += ["", *notes] if notes else []
    lines += [
        "",
        "Peak memory while a speculative reply decodes, less what the process held before any model "
        f"was loaded (Python, torch and the app: {baseline / 2**20:.0f} MB), against the issue's bound: "
        "target + draft + both KV caches + 300 MB. The draft's own memory is what making it added.",
        "",
        "| model | peak RSS less the bare process | target weights | draft's own | both caches "
        "| under the bound by |",
        "|---|---|---|---|---|---|",
    ]
    for name, peak, weights, own, kv in memory:
        used = peak - baseline
        budget = weights + own + kv + (300 << 20)
        lines.append(
            f"| {name} | {used / 2**20:.0f} MB | {weights / 2**20:.0f} MB | {own / 2**20:.0f} MB "
            f"| {kv / 2**20:.0f} MB | {(budget - used) / 2**20:+.0f} MB |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--depths", default="12,20")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    started = time.perf_counter()
    baseline = current_rss_bytes()
    rows: list = []
    memory: list = []
    with tempfile.TemporaryDirectory() as tmp:
        for depth in (int(d) for d in args.depths.split(",") if d):  # --depths "": the demo only
            random_pair(Path(tmp), depth, args.tokens, rows, memory)
            gc.collect()  # the previous pair's models go before the next loads
            release_freed_memory()
    notes: list = []
    demo_pairs(args.tokens, rows, notes)
    body = report(rows, memory, notes, args.tokens, time.perf_counter() - started, baseline)
    print(body)
    write_section(args.out, "speculative", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
