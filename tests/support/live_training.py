"""Real training runs that write checkpoints while a test watches: nanochat's own
``scripts/base_train.py`` and KempnerForge's own ``scripts/train.py``, pinned and unmodified
under tests/upstream/ (each folder's SOURCE.md names the commit and every file's sha256), run on
the CPU at a tiny size as a subprocess (support/run_upstream.py), offline.

nanochat, in ``base_dir`` (the run's ``NANOCHAT_BASE_DIR``)::

    run = start_nanochat_training(base_dir)            # steps (10, 20, 30)
    run.wait_saved(10)                                  # base_dir/base_checkpoints/d2/*_000010.*
    run.finish()                                        # exit status 0, or the log in the error

writes ``base_data_climbmix/shard_0000{0,1}.parquet`` (story text; the last shard is nanochat's
validation split) before it starts; its ``scripts/tok_train.py`` writes ``tokenizer/``
(``tokenizer.pkl``, ``token_bytes.pt``) in the subprocess, then ``base_train`` trains a depth-2
model (64 wide, two heads, context 64, 4 rows a step) and, at each step of ``steps``, after a
validation bpb, its ``save_checkpoint`` writes into ``base_checkpoints/d2/``, in this order:
``model_<N:06d>.pt``, ``meta_<N:06d>.json``, ``optim_<N:06d>_rank0.pt``.

KempnerForge, in ``run_dir`` (the folder training is launched in)::

    run = start_kf_training(run_dir)                    # run_dir/run/step_{10,20,30}, run/latest

writes ``train.toml``, ``tokenizer/`` (the golden case's) and ``data/tokens_000.npy`` first; its
``CheckpointManager`` then writes each ``run/step_<N>/``: DCP's ``__0_0.distcp`` then
``.metadata``, then ``train_state.pt`` and ``metadata.json``, then moves the ``latest`` symlink.
Its model is bf16 (KempnerForge's default mixed precision), 64 wide, two layers.

Both: ``hold=True`` makes the save of step N wait for :meth:`LiveTraining.allow` (N);
``pause`` sleeps that many seconds before each save; ``kill_mid_save_at=N`` makes the writer
SIGKILL itself part-way through the save of step N (nanochat: ``model_<N>.pt`` holds the first
half of its bytes, no ``meta_<N>.json``; KempnerForge: ``step_<N>/__0_0.distcp`` written, no
``.metadata``, ``latest`` still on the step before), and the process ends with -SIGKILL.
A run's output goes to ``<folder>/live_training.log``; the runner's markers (``saved_N``,
``killing_N``, the test's ``allow_N``) to ``<folder>/live_control/``.

A whole run takes about 6 s (nanochat) and 9 s (KempnerForge) on two cores, most of it
importing torch; the three saves come within the last second or two unless held or paused.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from support import REPO
from tools.golden.common import story_documents

RUNNER = REPO / "tests" / "support" / "run_upstream.py"
UPSTREAM = REPO / "tests" / "upstream"
LOG = "live_training.log"
CONTROL = "live_control"
STEPS = (10, 20, 30)
NANOCHAT_TAG = "d2"  # base_train's tag: d<depth>
NANOCHAT_VOCAB = 512  # asked of tok_train; the story text has merges for ~400 tokens (407)
KF_CHECKPOINTS = "run"  # [checkpoint] dir, relative to run_dir
KF_TOKENIZER = REPO / "tests" / "golden" / "kempnerforge" / "dense-gqa-qknorm" / "tokenizer"
KILLED = -getattr(signal, "SIGKILL", signal.SIGTERM)  # the returncode of a writer killed mid-save

# The training TOML of the KempnerForge run (its load_config reads it; so does Nanoscope).
KF_TOML = """\
# A tiny KempnerForge run on the CPU, started by tests/support/live_training.py.
[model]
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
vocab_size = 288
ffn_hidden_dim = 96
max_seq_len = 128
qk_norm = true
rope_theta = 10000.0

[train]
batch_size = 4
seq_len = 64
max_steps = {max_steps}
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
warmup_steps = 5
min_lr_ratio = 0.1

[data]
dataset_path = "data"
tokenizer_path = "tokenizer"
num_workers = 0
pin_memory = false

[checkpoint]
dir = "{checkpoints}"
interval = {interval}
keep_last_n = 0

[metrics]
log_interval = 5
"""


class LiveTraining(subprocess.Popen):
    """A training subprocess, with where it writes and what it has done."""

    folder: Path  # NANOCHAT_BASE_DIR, or the folder KempnerForge was launched in
    checkpoints: Path  # where the steps appear (base_checkpoints/d2, or run/)
    steps: tuple[int, ...]
    log_path: Path
    control: Path
    kill_at: int | None  # kill_mid_save_at

    def allow(self, step: int) -> None:
        """Let a held save of ``step`` proceed (``hold=True``)."""
        (self.control / f"allow_{step}").touch()

    def saved(self, step: int) -> bool:
        """Whether the tool's save of ``step`` has returned (every file of it written)."""
        return (self.control / f"saved_{step}").exists()

    def wait_saved(self, step: int, timeout: float = 120.0) -> None:
        """Until the save of ``step`` has returned; AssertionError (with the log) if the
        process ends first or the time runs out."""
        self._wait_for(f"saved_{step}", timeout)

    def wait_killed(self, timeout: float = 120.0) -> None:
        """Until the writer has killed itself mid-save (``kill_mid_save_at``) and exited."""
        self._wait_for(f"killing_{self.kill_at}", timeout, may_end=True)
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the writer did not die:\n{self.log()}") from None
        assert self.returncode == KILLED, f"exit status {self.returncode}:\n{self.log()}"

    def finish(self, timeout: float = 120.0) -> None:
        """Until the run ends; AssertionError (with the log) unless it ended well."""
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"training did not end in {timeout} s:\n{self.log()}") from None
        assert self.returncode == 0, f"exit status {self.returncode}:\n{self.log()}"

    def stop(self) -> None:
        """Kill the run if it is still going (for a test's cleanup)."""
        if self.poll() is None:
            self.kill()
            self.wait(30)

    def log(self, tail: int = 60) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-tail:])

    def _wait_for(self, marker: str, timeout: float, may_end: bool = False) -> None:
        deadline = time.monotonic() + timeout
        path = self.control / marker
        while not path.exists():
            if self.poll() is not None and not path.exists():
                if may_end and self.returncode == KILLED:
                    break
                raise AssertionError(f"training ended ({self.returncode}) before {marker}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {marker} after {timeout} s:\n{self.log()}")
            time.sleep(0.02)


def _check_steps(steps: Sequence[int], kill_mid_save_at: int | None) -> tuple[int, ...]:
    """Both tools save every ``interval`` steps and at the last: ``steps`` must be k, 2k, … nk."""
    steps = tuple(steps)
    k = steps[0] if steps else 0
    if k <= 0 or steps != tuple(range(k, k * len(steps) + 1, k)):
        raise ValueError(f"steps must be k, 2k, ..., nk (the tools save every k steps): {steps}")
    if kill_mid_save_at is not None and kill_mid_save_at not in steps:
        raise ValueError(f"kill_mid_save_at={kill_mid_save_at} is not one of the saved steps {steps}")
    return steps


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # no torchrun here: one process
    env.update(
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",  # the CPU, also on a machine with a GPU
        # nanochat's torch.compile calls run eagerly: a CPU compile would take most of a minute
        TORCHDYNAMO_DISABLE="1",
        PYTHONDONTWRITEBYTECODE="1",  # no __pycache__ in tests/upstream
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _start(
    tool: str,
    folder: Path,
    checkpoints: Path,
    steps: tuple[int, ...],
    runner_args: list[str],
    script_args: list[str],
    env: dict[str, str],
    hold: bool,
    pause: float,
    kill_mid_save_at: int | None,
) -> LiveTraining:
    control = folder / CONTROL
    shutil.rmtree(control, ignore_errors=True)
    control.mkdir(parents=True)
    args = [sys.executable, str(RUNNER), tool, "--control", str(control), *runner_args]
    if hold:
        args.append("--hold")
    if pause:
        args.append(f"--pause={pause}")
    if kill_mid_save_at is not None:
        args.append(f"--kill-mid-save-at={kill_mid_save_at}")
    log_path = folder / LOG
    with open(log_path, "wb") as log:
        proc = LiveTraining(
            [*args, "--", *script_args], cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    proc.folder, proc.checkpoints, proc.steps = folder, checkpoints, steps
    proc.log_path, proc.control, proc.kill_at = log_path, control, kill_mid_save_at
    return proc


def story_texts(n: int, seed: int) -> list[str]:
    """``n`` documents of the golden corpus's story (tools/golden/common.py): told mostly in
    order, so a few dozen steps already lower the loss."""
    return story_documents(random.Random(seed), n)


def prepare_nanochat_base(base_dir: Path) -> None:
    """nanochat's dataset as its dataloader finds it: ``base_data_climbmix/shard_00000.parquet``
    (train) and ``shard_00001.parquet`` (val, the last), a ``text`` column in row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = base_dir / "base_data_climbmix"
    data.mkdir(parents=True, exist_ok=True)
    for index, (n, seed) in enumerate(((600, 0), (100, 1))):
        table = pa.table({"text": story_texts(n, seed)})
        pq.write_table(table, data / f"shard_{index:05d}.parquet", row_group_size=200)


def nanochat_checkpoints(base_dir: Path) -> Path:
    return Path(base_dir) / "base_checkpoints" / NANOCHAT_TAG


def start_nanochat_training(
    base_dir: Path,
    steps: Sequence[int] = STEPS,
    kill_mid_save_at: int | None = None,
    *,
    hold: bool = False,
    pause: float = 0.0,
) -> LiveTraining:
    """nanochat's own tok_train (when ``base_dir/tokenizer`` has none) and base_train, saving
    ``steps`` (k, 2k, … nk) into ``base_dir/base_checkpoints/d2/``. See the module doc."""
    steps = _check_steps(steps, kill_mid_save_at)
    base_dir = Path(base_dir).resolve()
    if not (base_dir / "base_data_climbmix").is_dir():
        prepare_nanochat_base(base_dir)
    every = steps[0]
    script_args = [
        "--device-type=cpu",
        "--run=dummy",  # no wandb
        "--depth=2",
        "--aspect-ratio=32",
        "--head-dim=32",
        "--max-seq-len=64",
        "--window-pattern=L",
        "--device-batch-size=4",
        "--total-batch-size=256",
        f"--num-iterations={steps[-1]}",
        f"--save-every={every}",
        f"--eval-every={every}",  # a validation bpb in each meta
        "--eval-tokens=256",
        "--core-metric-every=-1",  # no eval bundle
        "--sample-every=-1",
        "--warmup-steps=5",
    ]
    return _start(
        "nanochat",
        base_dir,
        nanochat_checkpoints(base_dir),
        steps,
        [f"--tokenizer-args=--vocab-size={NANOCHAT_VOCAB}"],
        script_args,
        _env(NANOCHAT_BASE_DIR=str(base_dir)),
        hold,
        pause,
        kill_mid_save_at,
    )


def prepare_kf_run(run_dir: Path, steps: Sequence[int] = STEPS) -> Path:
    """``run_dir/train.toml`` (saving every ``steps[0]`` up to ``steps[-1]``), the golden case's
    tokenizer in ``tokenizer/``, and ``data/tokens_000.npy`` (uint16 ids, each document BOS …
    EOS, as ``MemoryMappedDataset`` reads them). Returns the TOML."""
    import numpy as np
    from tokenizers import Tokenizer

    run_dir.mkdir(parents=True, exist_ok=True)
    toml = run_dir / "train.toml"
    toml.write_text(
        KF_TOML.format(max_steps=steps[-1], interval=steps[0], checkpoints=KF_CHECKPOINTS), encoding="utf-8"
    )
    shutil.copytree(KF_TOKENIZER, run_dir / "tokenizer", dirs_exist_ok=True)
    tok = Tokenizer.from_file(str(run_dir / "tokenizer" / "tokenizer.json"))
    eos = tok.token_to_id("</s>")
    ids = [i for text in story_texts(300, 0) for i in [*tok.encode(text).ids, eos]]
    (run_dir / "data").mkdir(exist_ok=True)
    np.save(run_dir / "data" / "tokens_000.npy", np.asarray(ids, dtype=np.uint16))
    return toml


def kf_checkpoints(run_dir: Path) -> Path:
    return Path(run_dir) / KF_CHECKPOINTS


def start_kf_training(
    run_dir: Path,
    steps: Sequence[int] = STEPS,
    kill_mid_save_at: int | None = None,
    *,
    hold: bool = False,
    pause: float = 0.0,
) -> LiveTraining:
    """KempnerForge's own scripts/train.py in ``run_dir`` (one process, no process group, as
    its single-GPU runs), saving ``steps`` into ``run_dir/run/step_<N>/``. See the module doc."""
    steps = _check_steps(steps, kill_mid_save_at)
    run_dir = Path(run_dir).resolve()
    toml = prepare_kf_run(run_dir, steps)
    return _start(
        "kempnerforge",
        run_dir,
        kf_checkpoints(run_dir),
        steps,
        [],
        [str(toml)],
        _env(),
        hold,
        pause,
        kill_mid_save_at,
    )
