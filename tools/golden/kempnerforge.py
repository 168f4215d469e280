"""A golden KempnerForge run, trained and saved by KempnerForge's own code.

``python -m tools.golden kempnerforge --src MIRROR_OR_CHECKOUT [--out tests/golden] [--case NAME]``

Two cases, trained alike: ``dense-gqa-qknorm`` (a context of 128 positions) and ``long-context``
(2,048 positions, so a prompt can be longer than a prefill chunk of the engine's; its prompts
include one of more than 1,061 tokens).

The revision below is exported from the mirror and imported as the package ``kempnerforge``.
In this one process, on the CPU, with a gloo process group of world size 1 (a FileStore), its
own code

* reads the training TOML (``config.loader.load_config``, the tokens passed as
  ``--data.dataset_path`` as its ``train.py`` takes overrides);
* builds the model (``distributed.parallel.build_parallel_model``: bf16 parameters, KempnerForge's
  default ``mixed_precision``), the optimizer, scheduler and loss (``training.build_*``), the data
  pipeline (``MemoryMappedDataset``, ``DistributedSampler``, ``StatefulDataLoader``) and trains as
  ``scripts/train.py``'s text-only step does (clip, step, schedule), which cannot itself run on a
  CPU-only torch (``init_distributed`` calls ``torch.cuda.set_device``);
* saves ``run/step_<N>/`` with its ``CheckpointManager.save`` (DCP shards + ``.metadata``,
  ``train_state.pt``, ``metadata.json``, the ``latest`` symlink) at each ``checkpoint.interval``;
* logs every step to its ``MetricsTracker`` (``metrics.enable_tensorboard`` on, its default
  ``log_interval``), whose ``TensorBoardBackend`` writes ``tb_logs/events.out.tfevents.*``
  through torch's ``SummaryWriter``. ``tensorboard_dir`` is relative to where training is
  launched, as ``checkpoint.dir`` is, so training runs in the case folder and the events land
  beside ``run/``. TensorBoard's own ``EventAccumulator`` reads them back into golden.json
  (``tensorboard``): the scalars as stored, float32;
* loads each step back with ``scripts/generate.py``'s ``_load_model`` in float32 and records
  what its ``model.generate.generate`` produces (greedy, two seeded samplings drawn after
  ``torch.manual_seed``, as its script's users seed it) and the top-2 logit gap of each greedy step.

The tokenizer (``tokenizer/``) is a byte-level BPE trained with ``tokenizers`` and saved by
transformers' ``PreTrainedTokenizerFast``; prompts are encoded by ``AutoTokenizer`` as
KempnerForge's script encodes them. Only the files these write land in ``<out>/kempnerforge/``.

torch's ``SummaryWriter`` needs the ``tensorboard`` package, which Nanoscope does not depend on (its
own reader is ``desktop/engine/files/tensorboard_events.py``): run this in a venv that has it, e.g.
``python -m venv /tmp/kfvenv``, a ``.pth`` file naming the project venv's site-packages, then
``/tmp/kfvenv/bin/pip install tensorboard``. Without it KempnerForge would only warn and write no
events, so the writer refuses to start.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
import torch
import torch.distributed as dist
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from .common import (
    STORY,
    check_corpus,
    export,
    file_commits,
    imported_from,
    resolve,
    story_documents,
    write_manifest,
)

REVISION = "5666d0d"  # the mirror's HEAD when this corpus was made (spec §3)
CASE = "dense-gqa-qknorm"
LONG_CASE = "long-context"
LONG_PROMPT_TOKENS = 2 * 512 + 37  # at least: three of the engine's 512-row prefill chunks
VOCAB = 288
BOS, EOS = "<s>", "</s>"
MAX_NEW = 30
# (temperature, top_k, top_p, seed): KempnerForge's sample() knobs
SAMPLED = ((1.0, 0, 1.0, 42), (1.5, 50, 0.95, 7))
TOML = """\
# The training TOML of this run, read by KempnerForge's load_config. The training tokens were
# passed on the command line (--data.dataset_path) and are not kept.
[model]
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
vocab_size = {vocab}
ffn_hidden_dim = 96
max_seq_len = {max_seq_len}
qk_norm = true
rope_theta = 10000.0

[train]
batch_size = 16
seq_len = 64
max_steps = 240
seed = 42
compile_model = false
mixed_precision = "bf16"

[optimizer]
name = "adamw"
lr = 3e-3
weight_decay = 0.1
betas = [0.9, 0.95]

[scheduler]
name = "cosine"
warmup_steps = 10
min_lr_ratio = 0.1

[data]
tokenizer_path = "tokenizer"
num_workers = 0
pin_memory = false

[checkpoint]
dir = "run"
interval = 120
keep_last_n = 3

[metrics]
# TensorBoard event files in tensorboard_dir ("tb_logs"), relative to where training was launched
enable_tensorboard = true
"""
PROMPTS = ("the small cat", "and so it was the")
TB_DIR = "tb_logs"  # KempnerForge's default metrics.tensorboard_dir


def _tokenizer(texts: list[str]) -> Tokenizer:
    """A byte-level BPE whose post-processor puts BOS in front, as Llama's does."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return tok


def _write_tokenizer(texts: list[str], folder: Path) -> Tokenizer:
    tok = _tokenizer(texts)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS).save_pretrained(
        folder
    )
    return tok


def _write_tokens(tok: Tokenizer, texts: list[str], folder: Path) -> None:
    """The flat uint16 token file ``MemoryMappedDataset`` reads: documents as BOS … EOS."""
    eos = tok.token_to_id(EOS)
    ids = [i for text in texts for i in [*tok.encode(text).ids, eos]]
    folder.mkdir(parents=True)
    np.save(folder / "tokens_000.npy", np.asarray(ids, dtype=np.uint16))


@contextlib.contextmanager
def _process_group(tmp: Path) -> Any:
    """A gloo process group of one rank, as a one-process torchrun would make."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _train(config: Any) -> None:
    """``scripts/train.py``'s text-only loop (no PP, no VLM, no eval), KempnerForge's pieces."""
    from kempnerforge.checkpoint.manager import CheckpointManager
    from kempnerforge.data.dataloader import StatefulDataLoader
    from kempnerforge.data.dataset import MemoryMappedDataset
    from kempnerforge.data.sampler import DistributedSampler
    from kempnerforge.distributed.parallel import build_parallel_model, default_mp_policy
    from kempnerforge.distributed.setup import _set_seed
    from kempnerforge.distributed.utils import clip_grad_norm_
    from kempnerforge.metrics.tracker import MetricsTracker
    from kempnerforge.training import build_loss_fn, build_optimizer, build_scheduler

    tc = config.train
    config.validate(1)
    _set_seed(tc.seed, rank=0)  # what init_distributed does for one process
    device = torch.device("cpu")
    loss_fn = build_loss_fn(tc)
    model = build_parallel_model(
        config.model,
        device,
        None,
        ac_mode=tc.activation_checkpointing,
        mp_policy=default_mp_policy(tc.param_dtype),
        param_dtype=tc.param_dtype,
        compile_model=tc.compile_model,
        fp8=tc.is_fp8,
    )
    optimizer = build_optimizer(model, config.optimizer)
    scheduler = build_scheduler(optimizer, config.scheduler, max_steps=tc.max_steps)
    ckpt = CheckpointManager(config.checkpoint, model, optimizer)
    dataset = MemoryMappedDataset(
        data_dir=config.data.dataset_path, seq_len=tc.seq_len + 1, file_pattern=config.data.file_pattern
    )
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=tc.effective_data_seed)
    loader = StatefulDataLoader(dataset, batch_size=tc.batch_size, sampler=sampler, config=config.data)
    tracker = MetricsTracker(config, num_gpus=1)
    tracker.init_backends(config)
    model.train()
    step, tokens_seen, batches = 0, 0, iter(loader)
    while step < tc.max_steps:
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        tracker.start_step()
        loss = loss_fn(model(batch["input_ids"]), batch["labels"])
        loss.backward()
        grad_norm = clip_grad_norm_(model, tc.grad_clip_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        tokens_in_step = tc.batch_size * tc.seq_len * tc.grad_accum_steps
        tokens_seen += tokens_in_step
        tracker.end_step(
            step=step,
            loss=loss.item(),
            grad_norm=grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm,
            lr=optimizer.param_groups[0]["lr"],
            tokens_in_step=tokens_in_step,
        )
        if config.checkpoint.should_save(step):
            ckpt.save(step=step, tokens_seen=tokens_seen, scheduler=scheduler, dataloader=loader, extra={})
    ckpt.wait()
    tracker.close()
    print(f"trained {step} steps, last loss {loss.item():.3f}")


def _logged_scalars(folder: Path) -> dict[str, list[list[float]]]:
    """``{tag: [[step, value], ...]}`` of the event files in ``folder``, read by TensorBoard's own
    ``EventAccumulator`` (every event kept, none sampled away)."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in sorted(acc.Tags()["scalars"])}


def _script(src: Path) -> Any:
    """KempnerForge's ``scripts/generate.py`` as a module (its ``_load_model``)."""
    spec = importlib.util.spec_from_file_location("kf_generate_script", src / "scripts" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _greedy_gaps(model: Any, prompt: list[int], ids: list[int]) -> list[float]:
    """The top-2 logit gap at each greedy step (a full forward of the sequence so far)."""
    gaps = []
    with torch.no_grad():
        seq = list(prompt)
        for token in ids:
            top = torch.topk(model(torch.tensor([seq]))[0, -1].float(), 2).values
            gaps.append(float(top[0] - top[1]))
            seq.append(token)
    return gaps


def _long_prompt(hf_tok: Any) -> str:
    """The story's sentences, in order and over again, until they encode to
    :data:`LONG_PROMPT_TOKENS` tokens or more."""
    sentences: list[str] = []
    while len(hf_tok.encode(" ".join(sentences))) < LONG_PROMPT_TOKENS:
        sentences.append(STORY[len(sentences) % len(STORY)])
    return " ".join(sentences)


def _expected(
    script: Any, toml: Path, step_dir: Path, hf_tok: Any, prompts: tuple[str, ...]
) -> list[dict[str, Any]]:
    """What ``scripts/generate.py`` gives for each prompt at one step, in float32 on the CPU."""
    from kempnerforge.config.loader import load_config
    from kempnerforge.model.generate import generate

    config = load_config(toml, cli_args=[f"--checkpoint.load_path={step_dir}"])
    with contextlib.redirect_stdout(io.StringIO()):  # its "Loaded checkpoint" line
        model = script._load_model(config, torch.device("cpu"), torch.float32)
    model.eval()
    out = []
    for text in prompts:
        prompt = hf_tok.encode(text)

        def run(temperature: float, top_k: int, top_p: float, prompt: list[int] = prompt) -> list[int]:
            ids = generate(
                model,
                torch.tensor([prompt]),
                MAX_NEW,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                eos_token_id=hf_tok.eos_token_id,
            )
            return [int(i) for i in ids[0, len(prompt) :]]

        greedy = run(0.0, 0, 1.0)
        sampled = {}
        for t, k, p, seed in SAMPLED:
            torch.manual_seed(seed)
            sampled[f"{t}|{k}|{p}|{seed}"] = run(t, k, p)
        out.append(
            {
                "text": text,
                "prompt_ids": list(prompt),
                "greedy": greedy,
                "sampled": sampled,
                "greedy_top2_gaps": _greedy_gaps(model, prompt, greedy),
            }
        )
    return out


def write_case(repo: Path, out: Path, name: str = CASE) -> dict[str, Any]:
    commit = resolve(repo, REVISION)
    case = (out / "kempnerforge" / name).resolve()  # absolute: training runs with the case as cwd
    case.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    texts = story_documents(rng, 1500)
    tok = _write_tokenizer(texts, case / "tokenizer")
    toml = case / "train.toml"
    toml.write_text(TOML.format(vocab=VOCAB, max_seq_len=2048 if name == LONG_CASE else 128))
    shutil.rmtree(case / TB_DIR, ignore_errors=True)  # a rerun's writer would add a second file
    with tempfile.TemporaryDirectory() as tmp:
        _write_tokens(tok, texts, Path(tmp) / "tokens")
        src = export(repo, commit, Path(tmp) / "src")
        with imported_from(src, "kempnerforge"), _process_group(Path(tmp)):
            from kempnerforge.config.loader import load_config

            config = load_config(
                toml,
                cli_args=[f"--data.dataset_path={Path(tmp) / 'tokens'}", f"--checkpoint.dir={case / 'run'}"],
            )
            with contextlib.chdir(case):  # where training is launched: tensorboard_dir is relative
                _train(config)
            assert config.metrics.tensorboard_dir == TB_DIR, config.metrics.tensorboard_dir
            logged = _logged_scalars(case / TB_DIR)
            hf_tok = transformers.AutoTokenizer.from_pretrained(case / "tokenizer")
            script = _script(src)
            steps = sorted(int(p.name.split("_")[1]) for p in (case / "run").glob("step_*"))
            prompts = (*PROMPTS, _long_prompt(hf_tok)) if name == LONG_CASE else PROMPTS
            expected = {
                str(s): _expected(script, toml, case / "run" / f"step_{s}", hf_tok, prompts) for s in steps
            }
            used = sorted(
                m.replace(".", "/") + ("/__init__.py" if hasattr(sys.modules[m], "__path__") else ".py")
                for m in list(sys.modules)
                if m == "kempnerforge" or m.startswith("kempnerforge.")
            )
            model_config = {k: getattr(config.model, k) for k in config.model.__dataclass_fields__}
    manifest = {
        "family": "kempnerforge",
        "upstream": "KempnerInstitute/KempnerForge",
        "commit": commit,
        "file_commits": file_commits(repo, commit, [*used, "scripts/generate.py"]),
        "config": {k: (v.value if hasattr(v, "value") else v) for k, v in model_config.items()},
        "toml": toml.name,
        "steps": steps,
        "latest": steps[-1],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "dtype": "float32",
        "max_new_tokens": MAX_NEW,
        "expected": expected,
        "tensorboard": {
            "dir": TB_DIR,
            "log_interval": config.metrics.log_interval,
            "event_files": sorted(p.name for p in (case / TB_DIR).iterdir()),
            "scalars": logged,
        },
    }
    write_manifest(case, manifest)
    return manifest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.golden kempnerforge")
    parser.add_argument(
        "--src", type=Path, required=True, help="KempnerInstitute/KempnerForge mirror or checkout"
    )
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--case", choices=(CASE, LONG_CASE), action="append", help="default: both")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("tensorboard") is None:
        raise SystemExit("tensorboard is not importable: torch's SummaryWriter needs it (see the module doc)")
    torch.set_num_threads(1)
    for name in args.case or (CASE, LONG_CASE):
        manifest = write_case(args.src, args.out, name)
        gaps = [g for cases in manifest["expected"].values() for c in cases for g in c["greedy_top2_gaps"]]
        steps = manifest["steps"]
        print(f"{name}: {manifest['commit'][:7]}, steps {steps}, smallest greedy gap {min(gaps):.4f}")
    print(f"corpus: {check_corpus(args.out)} bytes")
    return 0
