"""Runs a tool's own training script, pinned under tests/upstream/, in this process: the child
process of :mod:`support.live_training`.

``python run_upstream.py {nanochat,kempnerforge} --control DIR [--hold] [--pause SECONDS]
[--kill-mid-save-at N] [--tokenizer-args=ARGS] -- SCRIPT_ARGS...``

* nanochat: trains the tokenizer with its own ``scripts/tok_train.py`` when
  ``$NANOCHAT_BASE_DIR/tokenizer`` has none (``--tokenizer-args``), then runs its own
  ``scripts/base_train.py`` (``python -m scripts.base_train SCRIPT_ARGS``);
* kempnerforge: runs its own ``scripts/train.py SCRIPT_ARGS`` (the TOML first).

Nothing upstream is edited. What this wraps, in this process only:

* the tool's save (nanochat's ``checkpoint_manager.save_checkpoint``, KempnerForge's
  ``CheckpointManager.save``): ``--pause`` sleeps before each save; ``--hold`` makes the save of
  step N wait for ``DIR/allow_N``; ``DIR/saved_N`` is written once the save has returned; and
  ``--kill-mid-save-at N`` makes the process die part-way through the save of step N, by SIGKILL
  of itself at a fixed point, never by a timer:

  - nanochat: its ``torch.save`` of ``model_<N>.pt`` writes the first half of the file's bytes
    (what a writer killed half-way leaves), then the process dies: the model file is
    truncated, ``meta_<N>.json`` and the optimizer's file are never written;
  - KempnerForge: DCP writes the ``.distcp`` shards of ``step_<N>/``, then the process dies
    where DCP would write ``.metadata`` (its ``FileSystemWriter.finish``): no ``.metadata``,
    ``train_state.pt`` or ``metadata.json``, and ``latest`` still names the step before;

  ``DIR/killing_N`` is written (and synced) just before the kill;
* ``torch.cuda.set_device``, a no-op when torch has no CUDA: KempnerForge's
  ``init_distributed`` calls it for a one-process run, which a CPU-only torch refuses
  (everything else of its ``train.py`` already picks the CPU when CUDA is absent);
* optional packages the tools import but a tiny CPU run never uses (``wandb`` with
  ``--run=dummy``) come from ``upstream_shims/`` when they are not installed.

The caller sets ``TORCHDYNAMO_DISABLE=1``: nanochat's ``torch.compile`` calls then run eagerly
(a CPU compile of the model and of its optimizer's step would take most of a minute).
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE.parent / "upstream"
SHIMS = HERE / "upstream_shims"
POLL = 0.02  # seconds between looks for an allow file


class Control:
    """The control folder shared with the test: allow_N (from the test), saved_N and
    killing_N (from here)."""

    def __init__(self, folder: Path, hold: bool, kill_at: int | None, pause: float = 0.0) -> None:
        self.folder = folder
        self.hold = hold
        self.pause = pause
        self.kill_at = kill_at
        folder.mkdir(parents=True, exist_ok=True)

    def _mark(self, name: str) -> None:
        path = self.folder / name
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"{time.time()}\n")
            f.flush()
            os.fsync(f.fileno())

    def before_save(self, step: int) -> None:
        if self.pause > 0:
            time.sleep(self.pause)
        if self.hold:
            print(f"[run_upstream] holding the save of step {step}", flush=True)
            while not (self.folder / f"allow_{step}").exists():
                time.sleep(POLL)

    def after_save(self, step: int) -> None:
        self._mark(f"saved_{step}")
        print(f"[run_upstream] saved step {step}", flush=True)

    def die(self, step: int, what: str) -> None:
        """SIGKILL this process (what the OOM killer or a preempted job does mid-save)."""
        self._mark(f"killing_{step}")
        print(f"[run_upstream] killing myself mid-save of step {step}: {what}", flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))
        time.sleep(60)  # never reached on POSIX
        os._exit(137)


def _use_upstream(tool: str) -> None:
    """The pinned tool first on sys.path, this folder off it (its modules are not the tool's),
    the shims last (an installed package wins)."""
    here = str(HERE)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.path.insert(0, str(UPSTREAM / tool))
    sys.path.append(str(SHIMS))


def _run_module(name: str, argv: list[str]) -> None:
    sys.argv = [name, *argv]
    runpy.run_module(name, run_name="__main__", alter_sys=True)


def _run_script(path: Path, argv: list[str]) -> None:
    sys.argv = [str(path), *argv]
    runpy.run_path(str(path), run_name="__main__")


def run_nanochat(control: Control, script_args: list[str], tokenizer_args: list[str] | None) -> None:
    _use_upstream("nanochat")
    import torch

    base = Path(os.environ["NANOCHAT_BASE_DIR"])
    if tokenizer_args is not None and not (base / "tokenizer" / "tokenizer.pkl").exists():
        _run_module("scripts.tok_train", tokenizer_args)

    from nanochat import checkpoint_manager

    save_checkpoint = checkpoint_manager.save_checkpoint
    real_save = torch.save

    def dying_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        """The first half of the bytes torch.save writes to ``f``, then death. torch names the
        archive inside after the file, so it saves to a file of that name in the control
        folder first: ``f`` never holds more than the half."""
        whole = control.folder / "whole" / os.path.basename(f)
        whole.parent.mkdir(exist_ok=True)
        real_save(obj, whole, *args, **kwargs)
        data = whole.read_bytes()
        with open(f, "wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
            os.fsync(out.fileno())
        control.die(step_now[0], f"{f} cut at {len(data) // 2} of {len(data)} bytes")

    step_now = [0]

    def wrapped(checkpoint_dir: str, step: int, *args: Any, **kwargs: Any) -> Any:
        step_now[0] = step
        control.before_save(step)
        if step == control.kill_at:
            torch.save = dying_save  # the first torch.save of save_checkpoint: the model's
        try:
            out = save_checkpoint(checkpoint_dir, step, *args, **kwargs)
        finally:
            torch.save = real_save
        control.after_save(step)
        return out

    checkpoint_manager.save_checkpoint = wrapped  # base_train imports the name after this
    _run_module("scripts.base_train", script_args)


def run_kempnerforge(control: Control, script_args: list[str]) -> None:
    _use_upstream("kempnerforge")
    import torch

    if not torch.cuda.is_available():
        torch.cuda.set_device = _no_device  # type: ignore[assignment]

    from kempnerforge.checkpoint.manager import CheckpointManager
    from torch.distributed.checkpoint import filesystem

    save = CheckpointManager.save
    finish: Callable[..., Any] = filesystem._FileSystemWriter.finish

    def dying_finish(self: Any, *args: Any, **kwargs: Any) -> None:
        shards = sorted(p.name for p in Path(self.path).glob("*.distcp"))
        control.die(step_now[0], f"{self.path}: {shards} written, no .metadata")

    step_now = [0]

    def wrapped(self: Any, step: int, *args: Any, **kwargs: Any) -> Any:
        step_now[0] = step
        control.before_save(step)
        if step == control.kill_at:
            filesystem._FileSystemWriter.finish = dying_finish  # type: ignore[method-assign]
        try:
            out = save(self, step, *args, **kwargs)
        finally:
            filesystem._FileSystemWriter.finish = finish  # type: ignore[method-assign]
        control.after_save(step)
        return out

    CheckpointManager.save = wrapped  # type: ignore[method-assign]
    _run_script(UPSTREAM / "kempnerforge" / "scripts" / "train.py", script_args)


def _no_device(*args: Any, **kwargs: Any) -> None:
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="run_upstream.py")
    parser.add_argument("tool", choices=("nanochat", "kempnerforge"))
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--hold", action="store_true", help="each save waits for CONTROL/allow_<step>")
    parser.add_argument("--kill-mid-save-at", type=int, default=None)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds of sleep before each save")
    parser.add_argument("--tokenizer-args", default=None, help="nanochat: tok_train's arguments, one string")
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    script_args = argv[cut + 1 :]
    control = Control(args.control, args.hold, args.kill_mid_save_at, args.pause)
    if args.tool == "nanochat":
        tok = args.tokenizer_args.split() if args.tokenizer_args is not None else None
        run_nanochat(control, script_args, tok)
    else:
        run_kempnerforge(control, script_args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
