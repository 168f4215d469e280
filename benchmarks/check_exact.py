"""Does exact mode give the plain path's bits on this machine? If not, where do they part ways?

    python benchmarks/check_exact.py [CHECKPOINT_DIR] [--threads 1,2,3,4,5] [--prompt 24] [--steps 8]

Runs a prefill and then one decode step per token through exact mode and through the plain
path (the same model with torch's own ``F.linear`` for every product, q, k and v separately,
as nanochat computes them) and, for an E7 checkpoint, through the nanochat-style forward of
``nanochat_baseline.py`` too. Every product's output, each attention output and each layer's
output is recorded, and the first one that differs is named with its step and layer, so a
difference can be pinned to one operation on a CPU the developers do not have. The thread counts
run one after another on the same loaded models, as a user changing the count would. Without a
checkpoint it writes a small random-weight E7 one. Exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from support import REPO

ROOT = REPO
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from make_checkpoint import write_e7  # noqa: E402
from nanochat_baseline import NanochatE7  # noqa: E402

from desktop.engine.decode.kvcache import KVCache  # noqa: E402
from desktop.engine.errors import CheckpointError  # noqa: E402
from desktop.engine.kernels import gemv  # noqa: E402
from desktop.engine.nanochat import checkpoint as ckpt  # noqa: E402
from desktop.engine.nanochat.classify import is_ignorable  # noqa: E402
from desktop.engine.nanochat.loader import LoadedModel, load_model  # noqa: E402
from desktop.engine.nanochat.model import GPT  # noqa: E402

Record = Callable[[str, torch.Tensor], None]
Steps = list[list[tuple[str, torch.Tensor]]]  # per step (prefill first): (name, value) in order


@dataclass(frozen=True)
class Divergence:
    step: int  # 0: the prefill, then one per decode step
    name: str  # e.g. "layer 0 attn.c_proj"
    differing: int
    total: int
    max_abs: float
    last_equal: str | None  # the record just before it, which agreed

    def __str__(self) -> str:
        where = "prefill" if self.step == 0 else f"decode step {self.step}"
        before = f"; everything before it agrees (last: {self.last_equal})" if self.last_equal else ""
        return (
            f"{where}: first difference at {self.name}: {self.differing} of {self.total} values "
            f"(max |diff| {self.max_abs:.3g}){before}"
        )


def load_plain(loaded: LoadedModel) -> GPT:
    """The same checkpoint as ``loaded``, prepared only with torch's plain ``F.linear`` (q, k and v
    as three products, nothing fused), from a fresh mapping of the file."""
    cfg = loaded.model.config
    sd = ckpt.load_state_dict(loaded.model_file)
    with torch.device("meta"):
        model = GPT(cfg)
    weights = {k: t.to(dtype=torch.float32) for k, t in sd.items() if not is_ignorable(k, cfg)}
    model.load_state_dict(weights, strict=True, assign=True)
    model.prepare(torch.device("cpu"), torch.float32, "plain")
    return model.eval()


@contextmanager
def traced(model: GPT, record: Record) -> Iterator[None]:
    """Hand every product's output (q, k and v apart), each attention output, each layer's output
    and the logits to ``record`` while inside; the model is left as it was."""
    absent = object()  # the attribute was the class's: delete the instance's again
    restore: list[tuple[object, str, object]] = []

    def patch(obj: object, attr: str, value: object) -> None:
        restore.append((obj, attr, obj.__dict__.get(attr, absent)))
        setattr(obj, attr, value)

    def recording(name: str, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def wrapper(*args: object) -> torch.Tensor:
            out = fn(*args)
            record(name, out)
            return out

        return wrapper

    for i, block in enumerate(model.transformer.h):
        attn, mlp = block.attn, block.mlp

        def qkv(x: torch.Tensor, i: int = i, attn: nn.Module = attn, split: Callable = attn._qkv) -> tuple:
            qk, v = split(x)
            H = attn.n_head
            for name, t in (("q", qk[:, :, :H]), ("k", qk[:, :, H:]), ("v", v)):
                record(f"layer {i} {name}", t)
            return qk, v

        def proj(y: torch.Tensor, i: int = i, product: Callable = attn.proj or attn.c_proj) -> torch.Tensor:
            record(f"layer {i} attention output", y)
            return recording(f"layer {i} attn.c_proj", product)(y)

        patch(attn, "_qkv", qkv)
        patch(attn, "proj", proj)
        names = ("c_fc", "c_proj", "c_gate")[: len(mlp.products)]  # the order MLP.bind keeps them in
        wrapped = (recording(f"layer {i} mlp.{n}", p) for n, p in zip(names, mlp.products, strict=True))
        patch(mlp, "products", tuple(wrapped))
        patch(block, "forward", recording(f"layer {i} output", block.forward))
    for name, module in model.named_modules():  # gates, Engram, mHC (and plain q, k, v: unmatched)
        kernel = module.__dict__.get("forward")
        if isinstance(module, nn.Linear) and kernel is not None:
            patch(module, "forward", recording(name, kernel))
    patch(model, "_lm_head", recording("lm_head", model._lm_head or model.lm_head))
    try:
        yield
    finally:
        for obj, attr, value in reversed(restore):
            if value is absent:
                delattr(obj, attr)
            else:
                setattr(obj, attr, value)


def _collector() -> tuple[Steps, Record]:
    steps: Steps = []

    def record(name: str, t: torch.Tensor) -> None:
        steps[-1].append((name, t.detach().clone()))

    return steps, record


@torch.inference_mode()
def run_model(model: GPT, ids: torch.Tensor, prefill: int) -> Steps:
    """Records of a prefill of ``ids[:, :prefill]`` and one decode step per remaining token."""
    steps, record = _collector()
    cache = KVCache(model.config, 1, ids.size(1), model.device, model.compute_dtype)
    with traced(model, record):
        for start, end in [(0, prefill), *((t, t + 1) for t in range(prefill, ids.size(1)))]:
            steps.append([])
            record("logits", model(ids[:, start:end], cache))
    return steps


@torch.inference_mode()
def run_nanochat(reference: NanochatE7, ids: torch.Tensor, prefill: int) -> Steps:
    """As :func:`run_model`, through the nanochat-style forward."""
    steps, record = _collector()
    cache = reference.new_cache(ids.size(1))
    reference.trace = record
    try:
        for start, end in [(0, prefill), *((t, t + 1) for t in range(prefill, ids.size(1)))]:
            steps.append([])
            reference.forward(ids[:, start:end], cache)
    finally:
        reference.trace = None
    return steps


def first_divergence(ours: Steps, theirs: Steps) -> Divergence | None:
    """The first record of ``ours`` (in the order computed) that differs from the record of the
    same name and occurrence in ``theirs``; names only one side records are skipped."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} steps against {len(theirs)}")
    for step, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
        seen: dict[str, int] = {}
        by_name: dict[tuple[str, int], torch.Tensor] = {}
        for name, t in other:
            by_name[name, seen.get(name, 0)] = t
            seen[name] = seen.get(name, 0) + 1
        seen.clear()
        last = None
        for name, a in mine:
            b = by_name.get((name, seen.get(name, 0)))
            seen[name] = seen.get(name, 0) + 1
            if b is None:
                continue
            if a.shape != b.shape:
                return Divergence(
                    step, f"{name} (shape {tuple(a.shape)} vs {tuple(b.shape)})", 0, 0, 0.0, last
                )
            if not torch.equal(a, b):
                diff = a != b
                max_abs = (a.double() - b.double()).abs().max().item()
                return Divergence(step, name, int(diff.sum()), a.numel(), max_abs, last)
            last = name
    return None


def _environment() -> str:
    mkl = {k: v for k, v in os.environ.items() if k.startswith(("MKL_", "OMP_", "KMP_"))}
    return (
        f"torch {torch.__version__}, CPU {platform.processor() or platform.machine()}, "
        f"capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} logical CPUs, "
        f"MKL {'yes' if torch.backends.mkl.is_available() else 'no'}, env {mkl or 'none'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoint", nargs="?", type=Path, help="a checkpoint directory (default: random E7)"
    )
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--depth", type=int, default=2, help="depth of the random checkpoint")
    cores = os.cpu_count() or 1
    parser.add_argument("--threads", default=",".join(map(str, sorted({1, 2, 3, 4, 2 * cores + 1}))))
    parser.add_argument("--prompt", type=int, default=24, help="prefill tokens")
    parser.add_argument("--steps", type=int, default=8, help="decode steps")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads: expected numbers separated by commas, got {args.threads!r}")
    if min(counts) < 1:
        parser.error("--threads: counts must be at least 1")

    with tempfile.TemporaryDirectory() as tmp:
        directory = args.checkpoint or write_e7(Path(tmp), args.depth)
        try:
            loaded = load_model(directory, args.step, device="cpu", dtype="float32")
            plain = load_plain(loaded)
        except CheckpointError as exc:
            print(f"check_exact: {exc}", file=sys.stderr)
            return 2
        reference = NanochatE7(loaded.directory, loaded.step) if loaded.config.era == "E7" else None
        top = max(2, loaded.config.vocab_size - 16)  # clear of the special tokens at the end
        ids = torch.randint(0, top, (1, args.prompt + args.steps), generator=torch.Generator().manual_seed(0))
        print(_environment())
        print(f"{directory} ({loaded.config.era}), {args.prompt} prompt tokens, {args.steps} decode steps")
        before = torch.get_num_threads()
        failed = False
        try:
            for n in counts:
                torch.set_num_threads(n)
                exact = run_model(loaded.model, ids, args.prompt)
                against = [("plain", run_model(plain, ids, args.prompt))]
                if reference is not None:
                    against.append(("nanochat", run_nanochat(reference, ids, args.prompt)))
                for name, steps in against:
                    found = first_divergence(exact, steps)
                    failed |= found is not None
                    print(f"{n} threads, exact vs {name}: {found or 'identical at every recorded op'}")
        finally:
            torch.set_num_threads(before)
    refused = sorted(key for key, same in gemv._verdicts.items() if not same)
    for key in refused:
        print(f"route refused (differs from the plain path): {key}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
