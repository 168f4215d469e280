"""A golden nanochat *experiment* (upstream PR #800, "the experiment refactor"), written by that
branch's own code.

``python -m tools.golden experiment --src MIRROR [--out tests/golden] [--rev experiment_refactor]``
(run it in a venv that also has ``pyarrow``: the branch's dataset and dataloader modules import it
and Nanoscope does not depend on it; e.g. ``python -m venv /tmp/ncvenv``, a ``.pth`` file naming the
project venv's site-packages, ``/tmp/ncvenv/bin/pip install pyarrow``).

The branch keeps everything one experiment produces in ``$NANOCHAT_BASE_DIR/experiments/<name>/``:
``meta.json``, ``tokenizer/``, and per model tag ``<tag>/<stage>/model_<step>.pt`` + metas and
the stage logs (``base_train.log``, ``sft.log``, …: stdout tee'd by ``runs/run.sh``, whose lines of
``<tag> key=value …`` are the machine contract of ``nanochat/logfmt.py``), then ``curve.log``.

The revision is cloned from the mirror (a shared clone on the branch, so its own
``nanochat.experiment.init_experiment`` records a real commit and a clean tree) and imported as the
package ``nanochat``. In one process on the CPU its own code

* writes ``meta.json`` (``init_experiment``);
* trains the tokenizer: ``scripts/tok_train.py`` itself runs (``runpy``) on a small named dataset
  of parquet shards (the branch's dataset contract: a ``text`` column, the last shard is
  validation), writing ``tokenizer.pkl``, ``token_bytes.pt`` and ``tok_train.log``;
* pretrains a tiny ``GPT`` (``GPTConfig``, ``init_weights``) on batches of its own dataloader
  (``tokenizing_distributed_data_loader_with_state_bos_bestfit``), evaluates with its own
  ``evaluate_bpb``, and saves with its own ``save_checkpoint`` into ``get_checkpoint_dir`` every
  ``SAVE_EVERY`` steps, metas as ``base_train.py`` writes them;
* finetunes it as SFT (loaded back by its own ``load_model``) on chats rendered by its own
  ``render_conversation``, evaluated by ``evaluate_bpb`` on masked targets as ``chat_sft.py``
  does, saved into ``<tag>/sft``;
* prints each stage's records with its own ``format_record`` and ``print0`` into the stage's log,
  the fields ``base_train.py`` / ``chat_sft.py`` print (``params``, ``eval``, ``summary``);
* aggregates ``curve.log``: ``scripts/curve.py`` itself runs;
* loads the SFT checkpoint with its own ``build_model`` and records what its ``Engine.generate``
  produces (as :mod:`tools.golden.nanochat` does).

The training loops are ours (AdamW, a few dozen steps): ``base_train.py`` and ``chat_sft.py``
compile the model, need wandb, and ``chat_sft.py`` downloads its task data. So are the prose lines
between records. Nothing of a real run's timing is written (no ``train_time_sec``,
``total_training_time``), so the case reruns byte for byte except for what the branch's own code
stamps: ``meta.json``'s ``created`` and ``tok_train.log``'s ``Training time`` and ``train_time_sec``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import runpy
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .common import check_corpus, file_commits, imported_from, resolve, story_documents, write_manifest
from .nanochat import QUESTIONS, WORDS, asking, conversations, expected

CASE = "pr800"
NAME = "golden"  # the experiment
DATASET = "golden-story"  # a user-provided named dataset (the branch's contract)
DEPTH = 2
TAG = f"d{DEPTH}"  # run.sh's model tag: d<depth>
VOCAB = 300
SEQ = 128
N_EMBD = 32
BATCH = 8
BASE_STEPS, SAVE_EVERY, BASE_EVAL_EVERY = 60, 30, 10
SFT_STEPS, SFT_EVAL_EVERY = 150, 25
EVAL_BATCHES = 2
# Files the branch's own code stamps with the time, named in golden.json.
NOT_REPRODUCIBLE = {
    f"experiments/{NAME}/meta.json": "created (init_experiment's datetime.now())",
    f"experiments/{NAME}/tok_train.log": "Training time, summary train_time_sec (tok_train's timer)",
}


def dataset_texts(rng: random.Random, n: int) -> list[str]:
    """Story documents and chat-like lines: the words the SFT chats use, as plain text."""
    texts = story_documents(rng, n)
    texts += [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(n // 2)]
    texts += [f"What is {a} plus {b}? So it is {a + b}." for a in range(30) for b in range(0, 30, 7)]
    rng.shuffle(texts)
    return texts


def write_dataset(folder: Path) -> None:
    """Two parquet shards with a ``text`` column: train, then validation (the last)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for index, n in ((0, 600), (1, 120)):
        table = pa.table({"text": dataset_texts(rng, n)})
        pq.write_table(table, folder / f"shard_{index:05d}.parquet", row_group_size=256)


def clone(mirror: Path, commit: str, dest: Path) -> Path:
    """A shared clone of ``mirror`` with the branch checked out at ``commit`` (clean tree)."""
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(mirror), str(dest)], check=True)
    subprocess.run(
        ["git", "-C", str(dest), "checkout", "-q", "-B", "experiment_refactor", commit], check=True
    )
    return dest


@contextlib.contextmanager
def tee(path: Path):
    """Stdout and stderr into the stage's log, as ``runs/run.sh`` tees them (``2>&1 | tee``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(path, "w", encoding="utf-8") as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
        yield


@contextlib.contextmanager
def forgotten(package: str):
    """Every module of ``package`` dropped from ``sys.modules`` afterwards (the branch's
    ``scripts``, imported from the same root as its ``nanochat``)."""
    try:
        yield
    finally:
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]


def run_script(module: str, argv: list[str]) -> None:
    """One of the branch's scripts, run as ``python -m <module> <argv>``."""
    saved = sys.argv
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def chat_batches(tok: Any, chats: list[dict[str, Any]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of rendered chats cut to the shortest row, targets masked to the assistant's
    tokens (-1 elsewhere) as chat_sft's loader masks them."""
    rows = []
    for chat in chats:
        ids, mask = tok.render_conversation(chat)
        rows.append((ids[: SEQ + 1], mask[: SEQ + 1]))
    batches = []
    for i in range(0, len(rows) - BATCH + 1, BATCH):
        group = rows[i : i + BATCH]
        width = min(len(ids) for ids, _ in group) - 1
        x = torch.tensor([ids[:width] for ids, _ in group])
        y = torch.tensor(
            [
                [t if m else -1 for t, m in zip(ids[1 : width + 1], mask[1 : width + 1], strict=True)]
                for ids, mask in group
            ]
        )
        batches.append((x, y))
    return batches


def pretrain() -> dict[str, Any]:
    """The base stage: our AdamW loop on the branch's dataloader, its evals, records and saves."""
    from nanochat.checkpoint_manager import get_checkpoint_dir, save_checkpoint
    from nanochat.common import print0
    from nanochat.dataloader import (
        tokenizing_distributed_data_loader_bos_bestfit,
        tokenizing_distributed_data_loader_with_state_bos_bestfit,
    )
    from nanochat.gpt import GPT, GPTConfig
    from nanochat.logfmt import format_record
    from nanochat.loss_eval import evaluate_bpb
    from nanochat.tokenizer import get_token_bytes, get_tokenizer

    tok = get_tokenizer()
    token_bytes = get_token_bytes("cpu")
    user_config = {
        "depth": DEPTH,
        "n_embd": N_EMBD,
        "max_seq_len": SEQ,
        "device_batch_size": BATCH,
        "num_iterations": BASE_STEPS,
        "eval_every": BASE_EVAL_EVERY,
        "save_every": SAVE_EVERY,
        "optimizer": "AdamW",
        "lr": 0.01,
    }
    torch.manual_seed(0)
    config = GPTConfig(
        sequence_len=SEQ, vocab_size=tok.get_vocab_size(), n_layer=DEPTH, n_head=2, n_kv_head=2, n_embd=N_EMBD
    )
    model = GPT(config)
    model.init_weights()
    model_config = asdict(config)
    counts = model.num_scaling_params()
    flops_per_token = model.estimate_flops()
    total_batch = BATCH * SEQ
    print0(format_record("config", **user_config))
    print0(format_record("params", **counts))
    train_loader = tokenizing_distributed_data_loader_with_state_bos_bestfit(
        tok, BATCH, SEQ, split="train", device="cpu", tokenizer_threads=1
    )
    x, y, loader_state = next(train_loader)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    checkpoint_dir = get_checkpoint_dir(TAG, "base")
    min_val_bpb, smooth, val_bpb = float("inf"), 0.0, None
    for step in range(BASE_STEPS + 1):
        if step % BASE_EVAL_EVERY == 0 or step == BASE_STEPS:
            model.eval()
            val_loader = tokenizing_distributed_data_loader_bos_bestfit(
                tok, BATCH, SEQ, split="val", device="cpu", tokenizer_threads=1
            )
            val_bpb = evaluate_bpb(model, val_loader, EVAL_BATCHES, token_bytes)
            print0(
                format_record(
                    "eval",
                    step=step,
                    eflops=round(flops_per_token * total_batch * step / 1e18, 4),
                    val_bpb=round(val_bpb, 6),
                )
            )
            min_val_bpb = min(min_val_bpb, val_bpb)
            model.train()
        if step > 0 and step % SAVE_EVERY == 0:
            meta = {
                "step": step,
                "val_bpb": val_bpb,
                "model_config": model_config,
                "user_config": user_config,
                "device_batch_size": BATCH,
                "max_seq_len": SEQ,
                "total_batch_size": total_batch,
                "dataloader_state_dict": loader_state,
                "loop_state": {"min_val_bpb": min_val_bpb, "smooth_train_loss": smooth},
            }
            save_checkpoint(checkpoint_dir, step, model.state_dict(), None, meta)
        if step == BASE_STEPS:
            break
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        x, y, loader_state = next(train_loader)
        smooth = 0.9 * smooth + 0.1 * loss.item()
        print0(f"step {step:05d}/{BASE_STEPS:05d} | loss: {smooth / (1 - 0.9 ** (step + 1)):.6f}")
    tokens = total_batch * BASE_STEPS
    print0(
        format_record(
            "summary",
            model_tag=TAG,
            depth=DEPTH,
            model_dim=N_EMBD,
            num_params=counts["total"],
            num_iterations=BASE_STEPS,
            total_batch_size=total_batch,
            tokens_trained=tokens,
            eflops=round(flops_per_token * tokens / 1e18, 3),
            val_bpb=round(val_bpb, 6),
            min_val_bpb=round(min_val_bpb, 6),
        )
    )
    return model_config


def finetune(chats: list[dict[str, Any]], val_chats: list[dict[str, Any]]) -> None:
    """The SFT stage: the base loaded by the branch's ``load_model``, our AdamW loop on chats,
    chat_sft's eval records, summary and final save."""
    from nanochat.checkpoint_manager import get_checkpoint_dir, load_model, save_checkpoint
    from nanochat.common import print0
    from nanochat.logfmt import format_record
    from nanochat.loss_eval import evaluate_bpb
    from nanochat.tokenizer import get_token_bytes

    model, tok, _meta = load_model("base", torch.device("cpu"), phase="train", model_tag=TAG, step=BASE_STEPS)
    token_bytes = get_token_bytes("cpu")
    user_config = {
        "model_tag": TAG,
        "model_step": BASE_STEPS,
        "num_iterations": SFT_STEPS,
        "eval_every": SFT_EVAL_EVERY,
        "optimizer": "AdamW",
        "lr": 0.01,
    }
    print0(format_record("config", **user_config))
    train = chat_batches(tok, chats)
    val = chat_batches(tok, val_chats)
    gen = torch.Generator().manual_seed(2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    min_val_bpb, val_bpb = float("inf"), 0.0
    for step in range(SFT_STEPS + 1):
        if step % SFT_EVAL_EVERY == 0 or step == SFT_STEPS:
            model.eval()
            val_bpb = evaluate_bpb(model, val, len(val), token_bytes)
            print0(format_record("eval", step=step, val_bpb=round(val_bpb, 6)))
            min_val_bpb = min(min_val_bpb, val_bpb)
            model.train()
        if step == SFT_STEPS:
            break
        x, y = train[int(torch.randint(len(train), (1,), generator=gen))]
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    mc = model.config
    save_checkpoint(
        get_checkpoint_dir(TAG, "sft"),
        SFT_STEPS,
        model.state_dict(),
        None,
        {
            "step": SFT_STEPS,
            "val_bpb": val_bpb,
            "model_config": {
                "sequence_len": SEQ,
                "vocab_size": tok.get_vocab_size(),
                "n_layer": DEPTH,
                "n_head": mc.n_head,
                "n_kv_head": mc.n_kv_head,
                "n_embd": mc.n_embd,
                "window_pattern": mc.window_pattern,
            },
            "user_config": user_config,
        },
    )
    print0(
        format_record(
            "summary",
            model_tag=TAG,
            depth=DEPTH,
            num_iterations=SFT_STEPS,
            tokens_trained=BATCH * SEQ * SFT_STEPS,
            val_bpb=round(val_bpb, 6),
            min_val_bpb=round(min_val_bpb, 6),
        )
    )


def make_case(case: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """With the branch imported (``NANOCHAT_*`` set): every stage, then what its Engine generates.
    Returns (the model's config, the prompt cases, the files of the branch that ran)."""
    exp_dir = case / "experiments" / NAME
    from nanochat.experiment import init_experiment

    with contextlib.redirect_stdout(sys.stderr):  # run.sh does not tee this step
        init_experiment()
    with tee(exp_dir / "tok_train.log"):
        run_script("scripts.tok_train", ["--max-chars=200000", f"--vocab-size={VOCAB}"])
    with tee(exp_dir / TAG / "base_train.log"):
        model_config = pretrain()
    rng = random.Random(0)
    chats, val_chats = conversations(rng, 400), conversations(rng, 32)
    with tee(exp_dir / TAG / "sft.log"):
        finetune(chats, val_chats)
    with contextlib.redirect_stdout(sys.stderr):
        run_script("scripts.curve", [])

    from nanochat.checkpoint_manager import build_model, get_checkpoint_dir
    from nanochat.engine import Engine

    model, tok, _meta = build_model(get_checkpoint_dir(TAG, "sft"), SFT_STEPS, torch.device("cpu"), "eval")
    engine = Engine(model, tok)
    prompts = {text: tok.render_for_completion(asking(text)) for text in QUESTIONS}
    cases = [{"text": t, "prompt_ids": ids, **expected(engine, model, ids)} for t, ids in prompts.items()]
    scripts = ["scripts/tok_train.py", "scripts/curve.py"]  # run as __main__: not in sys.modules
    used = sorted(
        [f"{m.replace('.', '/')}.py" for m in list(sys.modules) if m.startswith("nanochat.")] + scripts
    )
    return model_config, cases, used


def write_case(mirror: Path, rev: str, out: Path) -> dict[str, Any]:
    commit = resolve(mirror, rev)
    case = out / "nanochat-experiment" / CASE
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir(parents=True)
    saved_cwd, saved_env = Path.cwd(), dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        src = clone(mirror, commit, Path(tmp) / "nanochat")
        base = Path(tmp) / "base"
        write_dataset(base / "datasets" / DATASET)
        os.environ.update(
            NANOCHAT_BASE_DIR=str(base),
            NANOCHAT_EXPERIMENTS_DIR=str(case / "experiments"),
            NANOCHAT_EXPERIMENT=NAME,
            NANOCHAT_DATASET=DATASET,
            NANOCHAT_DTYPE="float32",
        )
        os.chdir(src)  # init_experiment asks git about the working directory
        try:
            with imported_from(src, "nanochat"), forgotten("scripts"):
                config, cases, used = make_case(case)
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
    manifest = {
        "family": "nanochat-experiment",
        "upstream": "karpathy/nanochat",
        "branch": "experiment_refactor (PR #800)",
        "commit": commit,
        "file_commits": file_commits(mirror, commit, used),
        "experiment": NAME,
        "dataset": DATASET,
        "tag": TAG,
        "source": "sft",
        "step": SFT_STEPS,
        "base_steps": list(range(SAVE_EVERY, BASE_STEPS + 1, SAVE_EVERY)),
        "config": config,
        "torch": torch.__version__,
        "compare_with": "Engine.generate",
        "load_options": {},
        "not_reproducible": NOT_REPRODUCIBLE,
        "cases": cases,
    }
    write_manifest(case, manifest)
    return manifest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.golden experiment")
    parser.add_argument("--src", type=Path, required=True, help="karpathy/nanochat mirror (with the branch)")
    parser.add_argument("--rev", default="experiment_refactor", help="the branch or a commit of PR #800")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    manifest = write_case(args.src.resolve(), args.rev, args.out.resolve())
    calls = sum(sum(c.get("engine_greedy_forced", ())) for c in manifest["cases"])
    print(f"{CASE}: {manifest['commit'][:7]}, {calls} forced tokens")
    print(f"corpus: {check_corpus(args.out)} bytes")
    return 0
