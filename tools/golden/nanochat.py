"""Golden nanochat checkpoints, one per era, written by that revision's own code.

``python -m tools.golden nanochat --src MIRROR_OR_CHECKOUT [--out tests/golden] [--eras E0,E7]``

For each era (docs/ARCHITECTURE.md's table) the revision below is exported from the mirror and
imported as the package ``nanochat``. Its own code then

* trains a tiny tokenizer (``RustBPETokenizer.train_from_iterator``, the ``rustbpe`` package)
  and saves ``tokenizer/tokenizer.pkl`` with its own ``save``;
* builds a tiny ``GPT`` from its own ``GPTConfig`` and ``init_weights``, and trains it for a few
  hundred steps on chat conversations rendered by its own ``render_conversation`` (calculator
  calls included), so that greedy decoding is decided by real logit gaps and the model calls
  the calculator on its own;
* saves a base checkpoint and a chat SFT checkpoint with its own ``save_checkpoint`` and
  ``model.state_dict()``, metas as its training scripts write them (``model.config.__dict__``);
* loads the SFT checkpoint back with its own ``build_model`` and records what its own
  ``Engine.generate`` produces: greedy, two seeded samplings, and the per-step top-2 logit gap.

Nothing of nanochat is copied: only what its code writes lands in ``<out>/nanochat/<era>/``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .common import check_corpus, export, file_commits, imported_from, resolve, write_manifest

# The revision each era is written by. E2's own commits need FlashAttention 3 from a hub;
# b62a5bc (2026-01-16) is the first with the SDPA fallback, still before value embeddings.
ERAS: dict[str, str] = {
    "E0": "f1bf69d~1",  # the original GPT, vocab not padded (the first commit ran on CUDA only)
    "E0pad": "aa530cd~1",  # the same keys, vocab padded to a multiple of 64
    "E1": "aa530cd",  # resid/x0 lambdas
    "E2": "b62a5bc",  # sliding windows (SSSL)
    "E3": "a91743c",  # value embeddings
    "E4": "c88bbf8",  # bigram "engram-lite"
    # softcap 20, after 1076f97 (03-04) made the rotary tables fp32 on the CPU: the E5 Nanoscope
    # runs with --softcap 20. aba30cb itself (03-03, one day) still had bf16 tables.
    "E5": "6ed7d1d~1",
    "E6": "6ed7d1d",  # autoresearch-1
    "E7": "92d63d4",  # smear + backout (master)
}
VOCAB = 300  # not a multiple of 64: the padded eras pad it
SEQ = 128
DEPTH = 2
TAG = f"d{DEPTH}"
BASE_STEP, SFT_STEP = 10, 20
MAX_NEW = 40
SAMPLED = ((1.0, None, 42), (0.8, 20, 7))  # (temperature, top_k, seed)
WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "mat",
    "hat",
    "red",
    "blue",
    "big",
    "small",
    "one",
    "two",
    "three",
    "four",
    "five",
]


def conversations(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Tiny chats: small talk, and sums answered through the calculator."""
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            a, b = rng.randint(1, 30), rng.randint(1, 30)
            parts = [
                {"type": "text", "text": "Let me add. "},
                {"type": "python", "text": f"{a}+{b}"},
                {"type": "python_output", "text": str(a + b)},
                {"type": "text", "text": f" So it is {a + b}."},
            ]
            out.append(
                {
                    "messages": [
                        {"role": "user", "content": f"What is {a} plus {b}?"},
                        {"role": "assistant", "content": parts},
                    ]
                }
            )
        else:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
            out.append(
                {
                    "messages": [
                        {"role": "user", "content": f"Say: {words}"},
                        {"role": "assistant", "content": f"Sure: {words}."},
                    ]
                }
            )
    return out


def asking(text: str) -> dict[str, Any]:
    """A conversation for ``render_for_completion``, which drops the (empty) last assistant turn."""
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]}


def tokenizer_text(rng: random.Random) -> list[str]:
    texts = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(200)]
    texts += [
        f"What is {a} plus {b}? Let me add. {a}+{b} So it is {a + b}."
        for a in range(30)
        for b in range(0, 30, 7)
    ]
    return texts


def chat_rows(tok: Any, chats: list[dict[str, Any]]) -> list[list[int]]:
    """The chats as the revision's own ``render_conversation`` renders them, cut to ``SEQ + 1``."""
    return [tok.render_conversation(chat)[0][: SEQ + 1] for chat in chats]


def train(model: Any, rows: list[list[int]], steps: int, seed: int) -> None:
    """A few hundred AdamW steps of next-token loss on ``rows`` (token ids), through the
    revision's own forward: each step a batch of 8 rows cut to the shortest."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        batch = [rows[int(i)] for i in torch.randint(len(rows), (8,), generator=gen)]
        width = min(len(r) for r in batch) - 1
        x = torch.tensor([r[:width] for r in batch])
        y = torch.tensor([r[1 : width + 1] for r in batch])
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()


def _greedy_gaps(model: Any, prompt: list[int], ids: list[int]) -> list[float]:
    """The top-2 logit gap at each greedy step (a full forward of the sequence so far)."""
    gaps = []
    with torch.no_grad():
        seq = list(prompt)
        for token in ids:
            logits = model(torch.tensor([seq]))[0, -1].float()
            top = torch.topk(logits, 2).values
            gaps.append(float(top[0] - top[1]))
            seq.append(token)
    return gaps


def _engine_run(
    engine: Any, prompt: list[int], temperature: float, top_k: int | None, seed: int
) -> tuple[list[int], list[int]]:
    ids, forced = [], []
    for column, masks in engine.generate(
        prompt, num_samples=1, max_tokens=MAX_NEW, temperature=temperature, top_k=top_k, seed=seed
    ):
        ids.append(int(column[0]))
        forced.append(0 if masks[0] else 1)
    return ids, forced


# What Nanoscope is compared with, where not nanochat's Engine (golden.json says why).
COMPARE_WITH = {
    "E4": (
        "GPT.generate: nanochat's Engine hashes a decoded token's bigram with the reserved index "
        "(spec 1.7); Nanoscope follows the training math, which the full forward computes"
    ),
}
LOAD_OPTIONS = {"E5": {"softcap": 20.0}}  # what a user passes for a checkpoint of that era


def expected(engine: Any, model: Any, prompt_ids: list[int]) -> dict[str, Any]:
    """What the revision's own code produces for ``prompt_ids``: ``Engine.generate`` (greedy
    with its forced calculator tokens, seeded samples) where it runs on a CPU (from 2026-01-11
    to 2026-07-03 minus the eras that fixed it, its KV cache is bf16 and it does not), and its
    full-forward ``GPT.generate`` always (no calculator: it has no tool use)."""
    out: dict[str, Any] = {}
    naive = {
        f"{t}|{k}|{s}": [int(i) for i in model.generate(prompt_ids, MAX_NEW, temperature=t, top_k=k, seed=s)]
        for t, k, s in ((0.0, None, 42), *SAMPLED)
    }
    out["naive_greedy"] = naive.pop("0.0|None|42")
    out["naive_sampled"] = naive
    try:
        greedy, forced = _engine_run(engine, prompt_ids, 0.0, None, 42)
    except RuntimeError as exc:
        if "dtype" not in str(exc):
            raise
        out["engine"] = f"cannot run on a CPU at this revision ({' '.join(str(exc).split())[:120]})"
        greedy = out["naive_greedy"]
    else:
        out["engine_greedy"] = greedy
        out["engine_greedy_forced"] = forced
        out["engine_sampled"] = {
            f"{t}|{k}|{s}": _engine_run(engine, prompt_ids, t, k, s)[0] for t, k, s in SAMPLED
        }
    out["greedy_top2_gaps"] = _greedy_gaps(model, prompt_ids, greedy)
    return out


QUESTIONS = ("What is 12 plus 7?", "Say: the red cat")


def make_case(
    case: Path, extras: dict[str, Any], base_config: Callable[[dict[str, Any]], dict[str, Any]] = dict
) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """With a revision imported as ``nanochat`` (``NANOCHAT_BASE_DIR`` = ``case``): its own
    ``RustBPETokenizer`` trained and saved, chats rendered by it, then :func:`train_and_record`."""
    from nanochat.tokenizer import RustBPETokenizer

    rng = random.Random(0)
    tok = RustBPETokenizer.train_from_iterator(iter(tokenizer_text(rng)), VOCAB)
    tok.save(str(case / "tokenizer"))
    rows = chat_rows(tok, conversations(rng, 400))
    prompts = {text: tok.render_for_completion(asking(text)) for text in QUESTIONS}
    return train_and_record(case, tok, rows, prompts, extras, base_config)


def train_and_record(
    case: Path,
    tok: Any,
    rows: list[list[int]],
    prompts: dict[str, list[int]],
    extras: dict[str, Any],
    base_config: Callable[[dict[str, Any]], dict[str, Any]] = dict,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """With a revision imported as ``nanochat``: its ``GPT`` (``GPTConfig`` plus ``extras``, vocab
    of ``tok``) trained on ``rows``, base and SFT saves (the base meta's model_config through
    ``base_config``), reload by ``build_model``, and what it generates from each of ``prompts``
    (text -> prompt ids). Returns (the model's config fields, the prompt cases, the files of
    nanochat run)."""
    from nanochat.checkpoint_manager import build_model, save_checkpoint
    from nanochat.engine import Engine
    from nanochat.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    sizes = dict(sequence_len=SEQ, vocab_size=tok.get_vocab_size(), n_layer=DEPTH, n_head=2, n_kv_head=2)
    model = GPT(GPTConfig(**sizes, n_embd=64, **extras))
    model.init_weights()  # bf16 weights on CUDA only: a CPU run keeps fp32 master weights
    train(model, rows, 150, seed=1)
    fields = dict(model.config.__dict__)
    base_dir, sft_dir = case / "base_checkpoints" / TAG, case / "chatsft_checkpoints" / TAG
    meta_base = {"step": BASE_STEP, "val_bpb": 0.0, "model_config": base_config(fields), "user_config": {}}
    save_checkpoint(str(base_dir), BASE_STEP, model.state_dict(), None, meta_base)
    train(model, rows, 150, seed=2)
    meta_sft = {"step": SFT_STEP, "val_loss": 0.0, "model_config": fields}
    save_checkpoint(str(sft_dir), SFT_STEP, model.state_dict(), None, meta_sft)

    loaded, _tok, _meta = build_model(str(sft_dir), SFT_STEP, torch.device("cpu"), "eval")
    engine = Engine(loaded, tok)
    cases = [
        {"text": text, "prompt_ids": ids, **expected(engine, loaded, ids)} for text, ids in prompts.items()
    ]
    used = sorted(f"nanochat/{m.split('.', 1)[1]}.py" for m in list(sys.modules) if m.startswith("nanochat."))
    return fields, cases, used


def write_era(repo: Path, era: str, out: Path) -> dict[str, Any]:
    commit = resolve(repo, ERAS[era])
    case = out / "nanochat" / era
    with tempfile.TemporaryDirectory() as tmp:
        src = export(repo, commit, Path(tmp) / "src")
        os.environ["NANOCHAT_BASE_DIR"] = str(case)
        case.mkdir(parents=True, exist_ok=True)
        with imported_from(src, "nanochat"):
            fields, cases, used = make_case(case, {})
    manifest = {
        "family": "nanochat",
        "era": era,
        "upstream": "karpathy/nanochat",
        "commit": commit,
        "file_commits": file_commits(repo, commit, used),
        "source": "sft",
        "tag": TAG,
        "step": SFT_STEP,
        "base_step": BASE_STEP,
        "config": fields,
        "torch": torch.__version__,
        "compare_with": COMPARE_WITH.get(
            era, "Engine.generate" if "engine_greedy" in cases[0] else "GPT.generate"
        ),
        "load_options": LOAD_OPTIONS.get(era, {}),
        "cases": cases,
    }
    write_manifest(case, manifest)
    return manifest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.golden nanochat")
    parser.add_argument("--src", type=Path, required=True, help="karpathy/nanochat mirror or checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--eras", default=",".join(ERAS), help="comma-separated, default: all")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for era in args.eras.split(","):
        manifest = write_era(args.src, era, args.out)
        calls = sum(sum(c.get("engine_greedy_forced", ())) for c in manifest["cases"])
        print(
            f"{era}: {manifest['commit'][:7]}, against {manifest['compare_with'][:20]}, {calls} forced tokens"
        )
    print(f"corpus: {check_corpus(args.out)} bytes")
    return 0
