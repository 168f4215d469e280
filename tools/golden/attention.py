"""Golden attention rows, computed by each nanochat revision's own attention code.

``python -m tools.golden attention --src NANOCHAT_MIRROR --fork-src FORK_MIRROR [--out tests/golden]
[--cases nanochat-E7,gqa-E7,...]``

For every golden nanochat era (E0, E0pad, E1 … E7) and every fork variant, the case's revision
(``commit`` in its golden.json) is exported and imported as ``nanochat``; its own ``build_model``
loads the case's SFT step on the CPU in float32, and one forward pass of its own ``GPT`` runs over
a fixed sequence: the case's recorded prompts and greedy replies, one after the other, cut to
:data:`LENGTH` ids.

**Where the weights come from.** Upstream never materialises attention weights (it calls
``F.scaled_dot_product_attention``, directly in ``gpt.py`` up to E1, through its
``flash_attention`` module's SDPA fallback from E2 and in the fork). For the forward pass the name
``F`` of that module (``nanochat.gpt`` or ``nanochat.flash_attention``) is swapped for a namespace
whose ``scaled_dot_product_attention`` records the very arguments upstream passes (q and k after
its rotary, QK norm and any q/k scaling; ``is_causal`` or its own boolean sliding-window mask;
``enable_gqa``), then calls the real function, whose output the forward goes on with. A forward
pre-hook on each block's ``CausalSelfAttention`` says which layer a call belongs to. From the
recorded arguments, in float64: ``softmax(q·kᵀ·scale + mask)`` with SDPA's default scale
``1/sqrt(head_dim)`` (no revision passes ``scale``), query head ``h`` against kv head
``h // (n_head / n_kv_head)`` as ``enable_gqa`` repeats them. As a check, those weights times the
recorded v equal SDPA's own output to 1e-5, or the writer stops.

Nanochat's golden cases all have ``n_head == n_kv_head`` and no window that cuts within 128 ids
but in E3–E5 (a short window of 64 on layer 0). So the writer also makes its own GQA cases
(``gqa/<era>/``: 4 query heads sharing 2 kv heads, a layer of short window that cuts within the
sequence): that revision's tokenizer, ``GPT`` and ``init_weights``, a short training on the
golden writers' chats, its ``save_checkpoint`` (an SFT step only, to stay small), then the same
``build_model`` and capture.

Each case's rows land in ``<out>/attention/<family>-<case>.json``; the GQA checkpoints in
``<out>/attention/gqa/<era>/`` with a golden.json naming their commit and files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .common import check_corpus, export, file_commits, imported_from, resolve, write_manifest
from .nanochat import SFT_STEP, TAG, VOCAB, chat_rows, conversations, tokenizer_text, train

LENGTH = 100  # ids of the golden cases' sequence (their sequence_len is 128)
DIGITS = 9  # significant digits kept of every weight
CPP_FILES = ["scripts/tok_train_cpp.py", "tokenizer.json"]  # as the fork writer exports
# The GQA cases: (upstream, revision, sequence_len, length of the sequence, GPTConfig extras)
# E1: SDPA's own enable_gqa in gpt.py; E3: the first windows (short = sequence_len // 2), value
# embeddings gated per kv head; E7: master (q and k scaled by 1.2; short window ceil(len/4) to 128,
# so a sequence_len of 256 and 160 ids); fork: its flash_attention fallback with SSSL.
GQA: dict[str, tuple[str, str, int, int, dict[str, Any]]] = {
    "E1": ("nanochat", "aa530cd", 128, LENGTH, {}),
    "E3": ("nanochat", "a91743c", 128, LENGTH, {"window_pattern": "SSSL"}),
    "E7": ("nanochat", "92d63d4", 256, 160, {"window_pattern": "SSSL"}),
    "fork": ("fork", "7e9ffe4", 128, LENGTH, {"window_pattern": "SSSL"}),
}
GQA_SIZES = {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32}
GQA_STEPS = 100
WRITTEN_BY = (
    "{commit}: its build_model (CPU, float32) and one forward of its GPT; its module's "
    "F.scaled_dot_product_attention recorded (q, k after rotary, QK norm and scaling; is_causal or "
    "its window mask; enable_gqa) and softmax(q k^T / sqrt(head_dim) + mask) computed in float64, "
    "query head h against kv head h // (n_head / n_kv_head)"
)


def golden_cases(golden: Path) -> list[tuple[str, Path]]:
    """(name, case folder) of every golden nanochat era and fork variant."""
    out = [
        (f"nanochat-{p.parent.name}", p.parent) for p in sorted((golden / "nanochat").glob("*/golden.json"))
    ]
    for p in sorted((golden / "fork").rglob("golden.json")):
        rel = p.parent.relative_to(golden / "fork")
        out.append(("fork-" + "-".join(rel.parts), p.parent))
    return out


def sequence(manifest: dict[str, Any], length: int) -> list[int]:
    """The case's prompts, each followed by the greedy and sampled replies it recorded, cut to
    ``length``."""
    ids: list[int] = []
    for c in manifest["cases"]:
        ids += c["prompt_ids"] + c.get("engine_greedy", c["naive_greedy"])
        for reply in c.get("engine_sampled", c["naive_sampled"]).values():
            ids += reply
    assert len(ids) >= length, len(ids)
    return ids[:length]


def weights(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """(B, n_head, Tq, Tk) float64 attention weights of one SDPA call's arguments."""
    q, k = args[0].double(), args[1].double()
    assert kwargs.get("scale") is None and not kwargs.get("dropout_p"), kwargs
    group = q.size(1) // k.size(1)
    assert group == 1 or kwargs.get("enable_gqa"), kwargs
    k = k.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    tq, tk = scores.shape[-2:]
    mask = kwargs.get("attn_mask")
    if kwargs.get("is_causal"):
        assert mask is None
        allowed = torch.ones(tq, tk, dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, -math.inf)
    elif mask is not None:
        assert mask.dtype == torch.bool, mask.dtype
        scores = scores.masked_fill(~mask, -math.inf)
    return torch.softmax(scores, dim=-1)


@contextmanager
def recording(modules: list[Any], model: Any) -> Iterator[dict[int, dict[str, Any]]]:
    """While the block runs, every SDPA call of ``modules`` (by their name ``F``) inside block
    ``i``'s ``CausalSelfAttention`` lands in ``calls[i]``: the weights and how it was masked."""
    calls: dict[int, dict[str, Any]] = {}
    current: list[int | None] = [None]
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa(*args: Any, **kwargs: Any) -> torch.Tensor:
        y = real(*args, **kwargs)
        layer = current[0]
        if layer is not None:
            assert layer not in calls, f"two attention calls in layer {layer}"
            w = weights(args, kwargs)
            v = args[2].double().repeat_interleave(args[0].size(1) // args[2].size(1), dim=1)
            err = float((w @ v - y.double()).abs().max())
            assert err < 1e-5, f"layer {layer}: the weights give SDPA's output to {err}"
            mask = kwargs.get("attn_mask")
            calls[layer] = {
                "weights": w,
                "mask": "is_causal" if kwargs.get("is_causal") else "bool attn_mask",
                "masked_in_causal": 0
                if mask is None
                else int((~mask).sum() - (~torch.ones_like(mask).tril()).sum()),
                "enable_gqa": bool(kwargs.get("enable_gqa", False)),
            }
        return y

    proxy = types.SimpleNamespace(**{n: getattr(torch.nn.functional, n) for n in dir(torch.nn.functional)})
    proxy.scaled_dot_product_attention = sdpa
    saved = [m.F for m in modules]
    hooks = []
    for i, block in enumerate(model.transformer.h):

        def enter(_module: Any, _args: Any, i: int = i) -> None:
            current[0] = i

        def leave(_module: Any, _args: Any, _out: Any) -> None:
            current[0] = None

        hooks.append(block.attn.register_forward_pre_hook(enter))
        hooks.append(block.attn.register_forward_hook(leave))
    for m in modules:
        m.F = proxy
    try:
        yield calls
    finally:
        for m, f in zip(modules, saved, strict=True):
            m.F = f
        for h in hooks:
            h.remove()


def rounded(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def capture(ckpt: Path, step: int, ids: list[int], positions: list[int]) -> dict[str, Any]:
    """With a revision imported as ``nanochat``: its ``build_model`` of ``ckpt`` and one forward
    of ``ids``, every layer's attention rows at ``positions``."""
    from nanochat.checkpoint_manager import build_model

    model, _tok, meta = build_model(str(ckpt), step, torch.device("cpu"), "eval")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    modules = [sys.modules[n] for n in ("nanochat.gpt", "nanochat.flash_attention") if n in sys.modules]
    modules = [m for m in modules if getattr(m, "F", None) is torch.nn.functional]
    with torch.no_grad(), recording(modules, model) as calls:
        model(torch.tensor([ids]))
    n_layer = len(model.transformer.h)
    assert sorted(calls) == list(range(n_layer)), sorted(calls)
    config = meta["model_config"]
    windows = [list(w) for w in model.window_sizes] if hasattr(model, "window_sizes") else None
    rows = {
        str(p): [
            [
                [rounded(x) for x in calls[i]["weights"][0, h, p, : p + 1].tolist()]
                for h in range(config["n_head"])
            ]
            for i in range(n_layer)
        ]
        for p in positions
    }
    return {
        "n_layer": n_layer,
        "n_head": config["n_head"],
        "n_kv_head": config.get("n_kv_head", config["n_head"]),
        "sequence_len": config["sequence_len"],
        "window": {
            "window_sizes": windows,  # the model's (left, right) per layer; None before E2
            "masks": [calls[i]["mask"] for i in range(n_layer)],
            "cut": [calls[i]["masked_in_causal"] > 0 for i in range(n_layer)],
        },
        "gqa": [calls[i]["enable_gqa"] for i in range(n_layer)],
        "rows": rows,
    }


def positions_for(length: int, first_prompt: int, windows: list[int]) -> list[int]:
    """The first prompt's last id, the middle, the last, and the first position each cutting
    window drops a token at."""
    chosen = {first_prompt - 1, length // 2, length - 1}
    chosen |= {w + 1 for w in windows if 0 <= w + 1 < length}
    return sorted(chosen)


def short_windows(src: Path, config: dict[str, Any]) -> list[int]:
    """The left windows of the model ``config`` makes (before the forward, to pick positions)."""
    from nanochat.gpt import GPT, GPTConfig

    with torch.device("meta"):
        model = GPT(GPTConfig(**config))
    return [w[0] for w in getattr(model, "window_sizes", [])]


@contextmanager
def revision(repo: Path, commit: str, case: Path, fork: bool, cpp: bool = False) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        paths = ["nanochat", *(CPP_FILES if cpp else [])] if fork else []
        src = export(repo, commit, Path(tmp) / "src", paths)
        os.environ["NANOCHAT_BASE_DIR"] = str(case)
        os.environ["NANOCHAT_CPP_TOKENIZER"] = "1" if cpp else "0"
        with imported_from(src, "nanochat"):
            yield src


def write_golden(repo: Path, name: str, case: Path, out: Path) -> dict[str, Any]:
    m = json.loads((case / "golden.json").read_text(encoding="utf-8"))
    ids = sequence(m, LENGTH)
    fork = m["upstream"] != "karpathy/nanochat"
    cpp = "tokenizer.json" in " ".join(m["files"])
    with revision(repo, m["commit"], case, fork, cpp) as src:
        windows = [w for w in short_windows(src, m["config"]) if w < len(ids) - 1]
        positions = positions_for(len(ids), len(m["cases"][0]["prompt_ids"]), windows)
        got = capture(case / "chatsft_checkpoints" / m["tag"], m["step"], ids, positions)
        used = sorted(
            f"nanochat/{n.split('.', 1)[1]}.py" for n in list(sys.modules) if n.startswith("nanochat.")
        )
    return {
        "case": case.relative_to(out).as_posix(),  # under the golden corpus
        "upstream": m["upstream"],
        "commit": m["commit"],
        "file_commits": file_commits(repo, m["commit"], used),
        "step": m["step"],
        "load_options": m.get("load_options", {}),
        "ids": ids,
        "positions": positions,
        **got,
        "written_by": WRITTEN_BY.format(commit=m["commit"][:7]),
    }


def make_gqa_case(repo: Path, era: str, out: Path) -> dict[str, Any]:
    """A GQA checkpoint written by the era's own code, then its rows as :func:`write_golden`."""
    upstream, rev, seq_len, length, extras = GQA[era]
    commit = resolve(repo, rev)
    case = out / "attention" / "gqa" / era
    case.mkdir(parents=True, exist_ok=True)
    with revision(repo, commit, case, upstream == "fork") as src:
        from nanochat.checkpoint_manager import save_checkpoint
        from nanochat.gpt import GPT, GPTConfig
        from nanochat.tokenizer import RustBPETokenizer

        rng = random.Random(0)
        tok = RustBPETokenizer.train_from_iterator(iter(tokenizer_text(rng)), VOCAB)
        tok.save(str(case / "tokenizer"))
        rows = chat_rows(tok, conversations(rng, 400))
        torch.manual_seed(0)
        model = GPT(GPTConfig(sequence_len=seq_len, vocab_size=tok.get_vocab_size(), **GQA_SIZES, **extras))
        model.init_weights()
        train(model, rows, GQA_STEPS, seed=1)
        fields = dict(model.config.__dict__)
        ckpt = case / "chatsft_checkpoints" / TAG
        meta = {"step": SFT_STEP, "val_loss": 0.0, "model_config": fields}
        save_checkpoint(str(ckpt), SFT_STEP, model.state_dict(), None, meta)
        # a chat and its continuation, from the tokenizer's own rendering, cut to the length
        ids = [i for r in rows[:8] for i in r][:length]
        windows = [w for w in short_windows(src, fields) if w < len(ids) - 1]
        prompt = len(rows[0])
        positions = positions_for(len(ids), min(prompt, length // 4), windows)
        got = capture(ckpt, SFT_STEP, ids, positions)
        used = sorted(
            f"nanochat/{n.split('.', 1)[1]}.py" for n in list(sys.modules) if n.startswith("nanochat.")
        )
    assert not fields.get("window_pattern") or any(got["window"]["cut"]), "no window cuts"
    manifest = {
        "family": "nanochat",
        "era": era,
        "variant": "gqa",
        "upstream": "karpathy/nanochat" if upstream == "nanochat" else "apstenku123/nanochat",
        "commit": commit,
        "file_commits": file_commits(repo, commit, used),
        "source": "sft",
        "tag": TAG,
        "step": SFT_STEP,
        "config": fields,
        "torch": torch.__version__,
        "load_options": {},
        "written_by": (
            f"{commit[:7]}: its RustBPETokenizer, GPT, init_weights, {GQA_STEPS} AdamW steps on the golden "
            "writers' chats (tools/golden/nanochat.py), save_checkpoint (SFT step only)"
        ),
    }
    write_manifest(case, manifest)
    return {
        "case": case.relative_to(out).as_posix(),  # under the golden corpus
        "upstream": manifest["upstream"],
        "commit": commit,
        "file_commits": manifest["file_commits"],
        "step": SFT_STEP,
        "load_options": {},
        "ids": ids,
        "positions": positions,
        **got,
        "written_by": WRITTEN_BY.format(commit=commit[:7]),
    }


def save(out: Path, name: str, record: dict[str, Any]) -> Path:
    path = out / "attention" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    path.write_text(text + "\n", encoding="utf-8")
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.golden attention")
    parser.add_argument("--src", type=Path, required=True, help="karpathy/nanochat mirror or checkout")
    parser.add_argument(
        "--fork-src", type=Path, required=True, help="apstenku123/nanochat mirror or checkout"
    )
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument(
        "--cases", default="", help="comma-separated names (nanochat-E7, gqa-E7, …); default: all"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    wanted = set(filter(None, args.cases.split(",")))
    jobs: list[tuple[str, Any]] = []
    for name, case in golden_cases(args.out):
        repo = args.fork_src if name.startswith("fork-") else args.src
        jobs.append((name, lambda repo=repo, name=name, case=case: write_golden(repo, name, case, args.out)))
    for era, (upstream, *_rest) in GQA.items():
        repo = args.fork_src if upstream == "fork" else args.src
        jobs.append((f"gqa-{era}", lambda repo=repo, era=era: make_gqa_case(repo, era, args.out)))
    for name, job in jobs:
        if wanted and name not in wanted:
            continue
        record = job()
        path = save(args.out, name, record)
        cut = [i for i, c in enumerate(record["window"]["cut"]) if c]
        print(
            f"{name}: {record['commit'][:7]}, heads {record['n_head']}/{record['n_kv_head']}, "
            f"positions {record['positions']}, windows cut in layers {cut}, {path.stat().st_size} bytes"
        )
    print(f"corpus: {check_corpus(args.out)} bytes")
    return 0
