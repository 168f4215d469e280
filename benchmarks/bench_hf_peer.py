"""Nanoscope against transformers' ``NanoChatForCausalLM.generate`` on the same model, in one run.

    python benchmarks/bench_hf_peer.py [--depth 12] [--new-tokens 64] [--repeats 5] [--sample]

A script of its own rather than a part of ``bench_engine.py``: the transformers port represents
only E0-E2 checkpoints exactly (the export refuses E7's smear, value embeddings and windows), so the
model is not bench_engine's E7; and importing transformers would weigh on bench_engine's memory
figures.

The model is a random-weight E0 checkpoint at nanochat's sizing for ``--depth`` (vocab 32768,
sequence_len 2048) with a made-up tokenizer of the same vocabulary (every byte, byte pairs, then
nanochat's nine special tokens), exported by ``export_to_hf`` (which checks the export's logits
against transformers'). Contenders, CPU, float32, batch 1, in rounds whose order rotates:

* ``transformers``: ``generate(use_cache=True)`` on the export, with the stop tokens switched off
  so that every run makes ``--new-tokens``; a streamer stamps each token, so prefill (up to the
  first new token) and decode (after it) are timed apart, as well as the whole call;
* ``exact``: Nanoscope's exact mode on the original checkpoint;
* ``hf-backend``: Nanoscope's own HF backend on the exported folder.

Greedy by default, so ids can be compared. ``--sample`` uses temperature 0.8 and top-k 50 for all;
the ids then differ by construction (transformers draws from the filtered full vocabulary, nanochat
from the top-k values).
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tiktoken
import torch
from support import REPO

ROOT = REPO
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

from bench_engine import cpu_name  # noqa: E402
from perf_report import write_section  # noqa: E402

from desktop.engine.backend import LoadOptions  # noqa: E402
from desktop.engine.bench import IdsOnlyTokenizer  # noqa: E402
from desktop.engine.decode.generation import generate_columns  # noqa: E402
from desktop.engine.export.hf_export import export_to_hf  # noqa: E402
from desktop.engine.hf.backend import HFBackend  # noqa: E402
from desktop.engine.nanochat.classify import expected_shapes  # noqa: E402
from desktop.engine.nanochat.config import ModelConfig, padded_vocab  # noqa: E402
from desktop.engine.nanochat.loader import load_model  # noqa: E402
from desktop.engine.nanochat.special_tokens import SPECIAL_TOKENS  # noqa: E402
from desktop.engine.params import SamplingParams  # noqa: E402

STEP, VOCAB, SEQ, SEED = 1000, 32768, 2048, 1
TEMPERATURE, TOP_K = 0.8, 50
# Words, numbers, punctuation runs, whitespace: any split works for a model fed with ids.
SPLIT = r"""\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+"""


def e0_config(depth: int) -> ModelConfig:
    """nanochat's sizing (C = 64 * depth rounded up to 128, head_dim 128), in the E0 architecture."""
    C = -(-64 * depth // 128) * 128
    return ModelConfig(
        SEQ, VOCAB, depth, C // 128, C // 128, C, padded_vocab(VOCAB), "E0", long_window=10 * SEQ
    )


def write_tokenizer(out: Path) -> None:
    """A tiktoken ``tokenizer.pkl`` of exactly VOCAB ids: bytes, then byte pairs, then the specials."""
    ranks = {bytes([b]): b for b in range(256)}
    pairs = (bytes([a, b]) for a in range(256) for b in range(256))
    while len(ranks) < VOCAB - len(SPECIAL_TOKENS):
        ranks[next(pairs)] = len(ranks)
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    enc = tiktoken.Encoding("rustbpe", pat_str=SPLIT, mergeable_ranks=ranks, special_tokens=specials)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tokenizer.pkl", "wb") as f:
        pickle.dump(enc, f)


def write_e0(base: Path, depth: int, seed: int = 0) -> Path:
    """A random-weight E0 checkpoint under ``base`` (and its tokenizer); kept between runs."""
    out = base / "base_checkpoints" / f"d{depth}"
    if (out / f"model_{STEP:06d}.pt").exists():
        return out
    cfg = e0_config(depth)
    write_tokenizer(base / "tokenizer")
    g = torch.Generator().manual_seed(seed)
    sd = {k: torch.randn(s, generator=g) / s[-1] ** 0.5 for k, s in expected_shapes(cfg).items()}
    out.mkdir(parents=True, exist_ok=True)
    torch.save(sd, out / f"model_{STEP:06d}.pt")
    keys = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
    meta = {"step": STEP, "model_config": {k: getattr(cfg, k) for k in keys}}  # no window_pattern: E0
    (out / f"meta_{STEP:06d}.json").write_text(json.dumps(meta))
    return out


def export(ckpt: Path, out: Path) -> None:
    if not (out / "model.safetensors").exists():
        report = export_to_hf(ckpt, out, LoadOptions(device="cpu", dtype="float32"))
        print(report.summary(), flush=True)


class Stamps:
    """A transformers streamer that notes when each new token arrives (its first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.tokens += value.reshape(-1).tolist()

    def end(self) -> None:
        pass


Run = tuple[float, float, float, list[int]]  # (ttft s, decode tok/s after the first token, total s, ids)


def timed(gen: Iterator[int]) -> Run:
    t0 = time.perf_counter()
    tokens, t_first = [], 0.0
    for token in gen:
        tokens.append(token)
        if len(tokens) == 1:
            t_first = time.perf_counter()
    end = time.perf_counter()
    return t_first - t0, (len(tokens) - 1) / max(end - t_first, 1e-9), end - t0, tokens


def transformers_contender(out: Path, sample: bool) -> tuple[Callable[[list[int], int], Run], str]:
    from transformers import GenerationConfig, NanoChatForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = NanoChatForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True).eval()
    pad = model.generation_config.pad_token_id

    def run(prompt: list[int], new: int) -> Run:
        config = GenerationConfig(
            max_new_tokens=new,
            do_sample=sample,
            temperature=TEMPERATURE if sample else None,
            top_k=TOP_K if sample else None,
            use_cache=True,
            eos_token_id=None,  # every run makes ``new`` tokens, as the other contenders do
            pad_token_id=pad,
        )
        ids = torch.tensor([prompt])
        stamps = Stamps()
        torch.manual_seed(SEED)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=config, streamer=stamps
            )
        end = time.perf_counter()
        first = stamps.times[0]
        return first - t0, (len(stamps.tokens) - 1) / max(end - first, 1e-9), end - t0, stamps.tokens

    return run, model.config._attn_implementation


def nanoscope_contender(model: Any, sample: bool) -> Callable[[list[int], int], Run]:
    def run(prompt: list[int], new: int) -> Run:
        params = SamplingParams(
            temperature=TEMPERATURE if sample else 0.0,
            top_k=TOP_K if sample else 0,
            max_tokens=new,
            seed=SEED,
        )
        columns = generate_columns(model, IdsOnlyTokenizer(), prompt, params)
        return timed(c.tokens[0] for c in columns)

    return run


def rounds(contenders: dict[str, Callable[[list[int], int], Run]], prompt: list[int], new: int, repeats: int):
    """Every contender's runs; one warm-up each, then rounds whose order rotates."""
    names = list(contenders)
    for name in names:
        contenders[name](prompt, new)
    out: dict[str, list[Run]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run = contenders[name](prompt, new)
            if len(run[3]) != new:  # a rate over fewer tokens would not compare
                raise SystemExit(f"bench_hf_peer: {name} made {len(run[3])} tokens, not {new}")
            out[name].append(run)
    return out


def summary(runs: dict[str, list[Run]]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "ttft_ms": statistics.median(r[0] for r in rs) * 1000,
            "decode_tok_s": statistics.median(r[1] for r in rs),
            "total_s": statistics.median(r[2] for r in rs),
        }
        for name, rs in runs.items()
    }


def markdown(res: dict) -> str:
    s, hf = res["summary"], res["summary"]["transformers"]
    mode = f"sampled (temperature {TEMPERATURE}, top-k {TOP_K})" if res["sample"] else "greedy"
    lines = [
        f"Machine: {res['machine']}; torch {res['torch']}, transformers {res['transformers']} "
        f"(attention: {res['attn']}); {res['threads']} threads; measured {res['date']}. Depth {res['depth']} "
        f"E0 model ({res['params'] / 1e6:.0f}M parameters, random weights), float32, batch 1, {mode}; "
        f"{res['prompt_tokens']}-token prompt, {res['new_tokens']} new tokens; {res['repeats']} rounds, "
        "medians. transformers: `NanoChatForCausalLM.generate(use_cache=True)` on the export, stop "
        "tokens off; decode is timed after the first new token, TTFT up to it. Same ids: as "
        "transformers' (greedy only); the original checkpoint runs with nanochat's bf16 rotary "
        "tables (E0), the export with float32 ones, so those ids may part after a while.",
        "",
        "| contender | decode tok/s | × transformers | TTFT ms | total s | × transformers (total) "
        "| same ids |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {
        "transformers": "transformers `generate`",
        "exact": "Nanoscope exact, original checkpoint",
        "hf-backend": "Nanoscope HF backend, exported folder",
    }
    for key, label in names.items():
        f = s[key]
        same = "—" if key == "transformers" or res["sample"] else str(res["same_ids"][key])
        lines.append(
            f"| {label} | {f['decode_tok_s']:.1f} | {f['decode_tok_s'] / hf['decode_tok_s']:.2f}× | "
            f"{f['ttft_ms']:.0f} | {f['total_s']:.2f} | {hf['total_s'] / f['total_s']:.2f}× | {same} |"
        )
    ratio = s["exact"]["decode_tok_s"] / hf["decode_tok_s"]
    lines += [
        "",
        f"Target: Nanoscope exact ≥ 2× transformers' decode: {ratio:.2f}×, "
        f"{'met' if ratio >= 2 else 'not met'}.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sample", action="store_true", help="temperature 0.8, top-k 50 instead of greedy")
    parser.add_argument("--base", type=Path, default=Path("/tmp/nanoscope-bench-hf"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    import transformers

    ckpt = write_e0(args.base, args.depth)
    hf_dir = args.base / "hf" / f"d{args.depth}"
    export(ckpt, hf_dir)
    exact = load_model(ckpt, dtype="float32")
    backend = HFBackend.open(hf_dir, LoadOptions(device="cpu", dtype="float32"))
    hf_run, attn = transformers_contender(hf_dir, args.sample)
    contenders = {
        "transformers": hf_run,
        "exact": nanoscope_contender(exact.model, args.sample),
        "hf-backend": nanoscope_contender(backend.model, args.sample),
    }
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, VOCAB - 256, (args.prompt_tokens,), generator=g).tolist()
    runs = rounds(contenders, prompt, args.new_tokens, args.repeats)
    reference = runs["transformers"][0][3]
    res = {
        "depth": args.depth,
        "params": exact.n_params,
        "sample": args.sample,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "machine": cpu_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn": attn,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
        "summary": summary(runs),
        "same_ids": {k: all(r[3] == reference for r in runs[k]) for k in ("exact", "hf-backend")},
        "rounds": {k: [round(r[1], 2) for r in rs] for k, rs in runs.items()},
    }
    write_section(args.out, "hf-peer", markdown(res))
    print(markdown(res), flush=True)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
