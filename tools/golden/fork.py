"""Golden checkpoints of the C++ fork (apstenku123/nanochat), written by the fork's own code.

``python -m tools.golden fork --src MIRROR_OR_CHECKOUT [--out tests/golden] [--variants plain,cpp/engram]``

The fork's ``main`` is exported and imported as the package ``nanochat``; for each variant
(its GPTConfig extras) its own code

* makes the tokenizer, by one of the fork's two paths (spec 2.4):

  * ``tokenizer.pkl`` (``NANOCHAT_CPP_TOKENIZER=0``, as the fork's non-C++ runs use, so the chat
    and calculator tokens exist): its ``RustBPETokenizer`` trained and saved, and the model
    trained on chats its ``render_conversation`` renders (the upstream writer's
    :func:`~.nanochat.make_case`);
  * ``tokenizer.json`` (variants under ``cpp/``; the fork's default path, ``get_tokenizer()``
    returning its ``CppTokenizer``): ``scripts/tok_train_cpp.py``'s own ``main`` trains a tiny one
    with the committed ``tokenizer.json``'s first :data:`FIXED_IDS` tokens (its control tokens and
    C++ keywords) as the fixed vocabulary, and the model is trained on tool-SFT texts in the
    format of ``scripts/data/generate_tool_sft.py``, encoded by the ``CppTokenizer``;

* builds its ``GPT`` from its ``GPTConfig`` and ``init_weights`` and trains it briefly;
* saves a base checkpoint (meta without ``activation``, as its ``base_train`` writes) and an SFT
  checkpoint (every GPTConfig field, as its ``sft_train`` writes) with its ``save_checkpoint``
  and ``model.state_dict()``;
* loads the SFT step back with its ``build_model`` and records ``GPT.generate`` (its full
  forward) and, where it runs on a CPU, its ``Engine.generate``.

Which of the two Nanoscope is held to is in golden.json (``compare_with``, with the reason). At
7e9ffe4 the Engine's KV cache is bfloat16 whatever the model's dtype, so on a CPU (fp32 weights,
as ``build_model`` makes them) it stops at its first attention and every variant is held to the
full forward. For Engram and mHC the Engine's incremental decode would differ from the forward
anyway (spec 2.3); Nanoscope computes the forward's Engram averages (it keeps the last ``z``s),
and pools mHC over the current chunk as the Engine does, which gives the forward's weights since
they are uniform (spec 2.1).

The ``cpp/`` variants sit one folder deeper than the others on purpose: the shared golden
helpers (``tests/support/golden.py``) assume the upstream special tokens, which a
``tokenizer.json`` case has not; ``tests/engine/nanochat/test_golden_fork.py`` checks them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from .common import check_corpus, export, file_commits, imported_from, resolve, write_manifest
from .nanochat import BASE_STEP, SEQ, SFT_STEP, TAG, make_case, train_and_record

REVISION = "7e9ffe4"  # the fork's main (spec 2)
CPP = "cpp/"  # variants with the fork's C++ tokenizer.json
# variant -> GPTConfig extras
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "engram": {"engram_enabled": True, "engram_layers": "0", "engram_ngram_orders": "2,3"},
    "mhc": {"mhc_enabled": True},
    "engram-mhc-mtp-swiglu": {
        "engram_enabled": True,
        "engram_layers": "-1",
        "engram_ngram_orders": "2,3",
        "mhc_enabled": True,
        "mtp_enabled": True,
        "activation": "swiglu",
    },
    CPP + "engram-swiglu": {
        "engram_enabled": True,
        "engram_layers": "1",
        "engram_ngram_orders": "2,3,4",
        "activation": "swiglu",
    },
}
# The tokenizer.json cases: the committed file's ids 0-19 (control tokens, 19 is <RESERVED_19>)
# and 20-119 (C++ keywords and their reserved slots) fixed, BPE learned up to CPP_VOCAB.
FIXED_IDS = 120
CPP_VOCAB = 400
TOKENIZERS = {
    False: "tokenizer/tokenizer.pkl (RustBPE)",
    True: "tokenizer/tokenizer.json (CppTokenizer)",
}
CPP_FILES = ["scripts/tok_train_cpp.py", "tokenizer.json"]  # run or read besides nanochat/
CPP_PROMPTS = (
    "// return the sum of x and y\nint add_xy(int x, int y)",
    "// return the product of p and q\ndouble mul_pq(double p, double q)",
)

NO_ENGINE = (
    "the fork's Engine cannot run on a CPU: its KV cache is always bfloat16, and build_model gives "
    "fp32 weights there"
)
DECODE = (
    "its Engine's Engram/mHC decode differs from its forward (spec 2.3): Nanoscope keeps the last "
    "z's for Engram's averages, as the forward computes them, and pools mHC over the current chunk "
    "as the Engine does, which gives the forward's weights as they are uniform"
)


def base_train_config(fields: dict[str, Any]) -> dict[str, Any]:
    """The base meta's model_config: base_train leaves ``activation`` out, sft_train writes every
    field (spec 2.2)."""
    return {k: v for k, v in fields.items() if k != "activation"}


def cpp_task(rng: random.Random) -> str:
    """One tool-SFT text in the fork's format (``scripts/data/generate_tool_sft.py``): the task
    and signature (what :data:`CPP_PROMPTS` are like), sometimes a search call, then the code."""
    what, op, verb = rng.choice((("sum", "+", "add"), ("difference", "-", "sub"), ("product", "*", "mul")))
    kind = rng.choice(("int", "long", "double"))
    a, b = rng.sample(("a", "b", "x", "y", "n", "m", "p", "q"), 2)
    name = f"{verb}_{a}{b}"
    signature = f"{kind} {name}({kind} {a}, {kind} {b})"
    prompt = f"// return the {what} of {a} and {b}\n{signature}"
    tool = ""
    if rng.random() < 0.5:
        tool = (
            f'<THOUGHT_START>\n// look for {name}\n<THOUGHT_END>\n<QUERY_TOOL> search("{name}") <CODE_END>\n'
        )
    code = f"<CODE_START>\n{signature} {{\nreturn {a} {op} {b};\n}}\n<CODE_END>\n<EOS>"
    return f"<BOS>\n{prompt}\n{tool}{code}"


def make_cpp_case(
    src: Path, case: Path, extras: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """The ``tokenizer.json`` path (``NANOCHAT_CPP_TOKENIZER`` on, the fork's default), with the
    fork imported as ``nanochat`` from ``src``."""
    from nanochat.tokenizer import get_tokenizer

    rng = random.Random(0)
    texts = [cpp_task(rng) for _ in range(400)]
    committed = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    fixed = {t["content"]: t["id"] for t in committed["added_tokens"] if t["id"] < FIXED_IDS}
    with tempfile.TemporaryDirectory() as tmp:
        data, fixed_vocab = Path(tmp) / "tool_sft.jsonl", Path(tmp) / "fixed_vocab.json"
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        fixed_vocab.write_text(json.dumps(fixed), encoding="utf-8")
        spec = importlib.util.spec_from_file_location("tok_train_cpp", src / "scripts" / "tok_train_cpp.py")
        assert spec is not None and spec.loader is not None
        tok_train_cpp = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tok_train_cpp)
        # absolute: the script joins relative paths to the fork's own root
        argv = ["--input", str(data), "--output_dir", str((case / "tokenizer").resolve())]
        argv += ["--vocab_size", str(CPP_VOCAB), "--fixed_vocab", str(fixed_vocab)]
        saved_argv, sys.argv = sys.argv, ["tok_train_cpp", *argv]
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its validation report
                tok_train_cpp.main()
        finally:
            sys.argv = saved_argv
    tok = get_tokenizer()
    assert type(tok).__name__ == "CppTokenizer", type(tok)
    rows = [tok.encode(text)[: SEQ + 1] for text in texts]
    # as the fork's C++ eval prompts its Engine (nanochat/cpp_eval.py)
    prompts = {text: tok(text, prepend="<|bos|>") for text in CPP_PROMPTS}
    fields, cases, used = train_and_record(case, tok, rows, prompts, extras, base_train_config)
    for c in cases:
        c["stop_ids"] = [tok.eos_token_id, tok.get_bos_token_id()]  # where its Engine ends a row
    return fields, cases, used


def write_variant(repo: Path, variant: str, out: Path) -> dict[str, Any]:
    commit = resolve(repo, REVISION)
    case = out / "fork" / variant
    extras = VARIANTS[variant]
    cpp = variant.startswith(CPP)
    with tempfile.TemporaryDirectory() as tmp:
        src = export(repo, commit, Path(tmp) / "src", ["nanochat", *(CPP_FILES if cpp else [])])
        os.environ["NANOCHAT_BASE_DIR"] = str(case)
        os.environ["NANOCHAT_CPP_TOKENIZER"] = "1" if cpp else "0"
        case.mkdir(parents=True, exist_ok=True)
        with imported_from(src, "nanochat"):
            if cpp:
                fields, cases, used = make_cpp_case(src, case, extras)
                used += CPP_FILES
            else:
                fields, cases, used = make_case(case, extras, base_train_config)
    engine = "engine_greedy" in cases[0]
    decode_differs = bool(extras.get("engram_enabled") or extras.get("mhc_enabled"))
    reasons = [*([] if engine else [NO_ENGINE]), *([DECODE] if decode_differs else [])]
    compare_with = "GPT.generate: " + "; ".join(reasons) if reasons else "Engine.generate"
    manifest = {
        "family": "nanochat",
        "era": "fork",
        "variant": variant,
        "upstream": "apstenku123/nanochat",
        "commit": commit,
        "file_commits": file_commits(repo, commit, used),
        "source": "sft",
        "tag": TAG,
        "step": SFT_STEP,
        "base_step": BASE_STEP,
        "config": fields,
        "tokenizer": TOKENIZERS[cpp],
        "torch": torch.__version__,
        "compare_with": compare_with,
        "load_options": {},
        "cases": cases,
    }
    write_manifest(case, manifest)
    return manifest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.golden fork")
    parser.add_argument("--src", type=Path, required=True, help="apstenku123/nanochat mirror or checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, default: all")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for variant in args.variants.split(","):
        m = write_variant(args.src, variant, args.out)
        gaps = [g for c in m["cases"] for g in c["greedy_top2_gaps"]]
        print(f"{variant}: {m['commit'][:7]}, against {m['compare_with'][:14]}, smallest gap {min(gaps):.4f}")
    print(f"corpus: {check_corpus(args.out)} bytes")
    return 0
