"""Load a nanochat-family checkpoint into a ready-to-run :class:`GPT` (docs/ARCHITECTURE.md, Loading)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from desktop.engine.backend import Progress
from desktop.engine.errors import CheckpointError, OutOfMemoryError, is_out_of_memory
from desktop.engine.files.finite import check_finite
from desktop.engine.files.pickle_scan import TensorInfo
from desktop.engine.kernels import memory
from desktop.engine.kernels.device import Precision, describe_device, pick_device, pick_precision
from desktop.engine.kernels.tuning import tuner_for, tuning_progress
from desktop.engine.nanochat import checkpoint as ckpt
from desktop.engine.nanochat.classify import classify, is_ignorable
from desktop.engine.nanochat.config import ModelConfig, table_bytes
from desktop.engine.nanochat.model import GPT


@dataclass
class LoadedModel:
    model: GPT
    config: ModelConfig
    directory: Path
    step: int
    model_file: Path
    meta: dict
    meta_hash: str
    device: torch.device
    precision: Precision
    n_params: int
    attention: str
    load_seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def device_name(self) -> str:
        return describe_device(self.device)


def resolve_step(directory: Path, step: int | None) -> int:
    ckpt.detect_unsupported(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    steps = ckpt.model_steps(directory)
    if not steps:
        raise CheckpointError(f"{directory}: no model_<step>.pt files here")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise CheckpointError(f"{directory}: no step {step} (available: {', '.join(map(str, steps[-8:]))})")
    return step


def _borrow_window_pattern(directory: Path, meta: dict, warnings: list[str]) -> bool:
    """mid/SFT metas of Jan 2026 lost ``window_pattern``; the base meta of the same tag has it.

    Returns True when the pattern is missing and no base meta could supply it.
    """
    mc = meta.get("model_config")
    phase = directory.parent.name
    if (
        not isinstance(mc, dict)
        or "window_pattern" in mc
        or phase not in ("mid_checkpoints", "chatsft_checkpoints")
    ):
        return False
    base = directory.parent.parent / "base_checkpoints" / directory.name
    steps = ckpt.model_steps(base) if base.is_dir() else []
    try:
        base_mc = ckpt.read_meta(ckpt.meta_file(base, steps[-1])).get("model_config", {}) if steps else {}
    except CheckpointError:
        base_mc = {}
    if isinstance(base_mc, dict) and isinstance(base_mc.get("window_pattern"), str):
        mc["window_pattern"] = base_mc["window_pattern"]
        warnings.append(f"meta has no window_pattern; using {base_mc['window_pattern']!r} from {base}")
        return False
    return True


def check_memory(
    cfg: ModelConfig, shapes: dict[str, TensorInfo], dev: torch.device, compute: torch.dtype, where: Path
) -> None:
    """Refuse, before allocating, a load that cannot fit in the free RAM: the weights as read (and
    cast, on the CPU) plus what the meta's numbers make the model allocate (rotary tables, the KV
    cache of one context). A hostile meta's sequence_len is refused here, not by the OOM killer."""
    free = memory.available_ram()
    if free is None:
        return
    size = torch.empty((), dtype=compute).element_size()
    need = {"weights": sum(t.nbytes() for t in shapes.values())}
    if dev.type == "cpu":
        name = str(compute).removeprefix("torch.")
        need["weights"] += sum(t.numel() * size for t in shapes.values() if t.dtype != name)
        need.update(table_bytes(cfg, size))
    total = sum(need.values())
    if total > free:
        parts = ", ".join(f"{what} {memory.human(n)}" for what, n in need.items())
        raise OutOfMemoryError(
            f"{where}: loading needs about {memory.human(total)} of RAM ({parts}) and "
            f"{memory.human(free)} is free; close other programs or use a smaller checkpoint"
        )


def load_model(
    directory: Path,
    step: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    softcap: float | None = None,
    progress: Progress | None = None,
    kernel_cache: Path | None = None,
) -> LoadedModel:
    """Classify, verify and load a checkpoint. Every failure is a one-line :class:`CheckpointError`.

    ``kernel_cache``: the file where this machine's kernel timings are kept (see
    :mod:`.kernel_tuning`); None keeps them in memory for this process only."""
    started = time.perf_counter()
    report = progress or (lambda _pct, _msg: None)
    directory = Path(directory).expanduser()
    step = resolve_step(directory, step)
    meta_path = ckpt.meta_file(directory, step)
    model_path = ckpt.model_file(directory, step)
    report(5, f"reading {meta_path.name}")
    meta, meta_hash = ckpt.read_meta_and_digest(meta_path)
    warnings: list[str] = []
    pattern_unknown = _borrow_window_pattern(directory, meta, warnings)
    report(10, f"checking {model_path.name}")
    shapes = ckpt.tensor_shapes(model_path)  # no weight read yet: a wrong meta fails fast
    cfg = classify(meta, {k: t.shape for k, t in shapes.items()}, str(model_path), softcap_override=softcap)
    warnings.extend(cfg.warnings)
    if pattern_unknown and cfg.era != "E0":  # E0 predates windows: nothing was lost
        warnings.append(
            "meta has no window_pattern and no base checkpoint of this tag was found: every "
            "layer attends to the whole context, which differs from training if it used "
            "sliding windows"
        )
    dev = pick_device(device)
    precision = pick_precision(dev, dtype)
    compute = precision.compute
    check_memory(cfg, shapes, dev, compute, model_path)
    report(20, f"reading {model_path.name}")
    # Private memory, not a mapping: the file may be rewritten while the model stays loaded.
    sd = ckpt.load_state_dict(model_path, mmap=False, expected=shapes)
    report(40, "checking values")
    check_finite(sd, model_path)

    report(60, f"building {cfg.era} model on {dev.type}")
    with torch.device("meta"):
        model = GPT(cfg)
    wanted = {k: t for k, t in sd.items() if not is_ignorable(k, cfg)}
    n_params = sum(t.numel() for t in wanted.values())
    try:
        # Cast to the compute dtype (a no-op, hence no copy, for fp32 weights on CPU).
        wanted = {k: t.to(device=dev, dtype=compute) for k, t in wanted.items()}
        model.load_state_dict(wanted, strict=True, assign=True)
        del sd, wanted
        report(70, "choosing kernels")
        tuner = tuner_for(kernel_cache)
        with tuner.listening(tuning_progress(report, 70, 95)):
            model.prepare(dev, compute, precision.gemv, tuner)
    except (RuntimeError, MemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        need = n_params * torch.empty((), dtype=compute).element_size()
        raise OutOfMemoryError(
            f"{model_path}: out of memory loading {need / 2**30:.1f} GiB of weights as {precision.name} "
            f"on {dev.type}; try the bfloat16 dtype, another device, or a smaller checkpoint"
        ) from None
    model.eval()
    attention = "sdpa"
    if dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] == 9:  # pragma: no cover - Hopper only
        from desktop.engine.decode.attention import flash_attn_kvcache_fn

        if flash_attn_kvcache_fn() is not None and compute in (torch.bfloat16, torch.float16):
            for block in model.blocks:
                block.attn.use_flash = True
            attention = "flash-attn"
    memory.release_freed_memory()  # the file's bytes, conversions and tuning buffers, now freed
    report(100, "ready")
    return LoadedModel(
        model=model,
        config=replace(cfg, warnings=tuple(warnings)),
        directory=directory,
        step=step,
        model_file=model_path,
        meta=meta,
        meta_hash=meta_hash,
        device=dev,
        precision=precision,
        n_params=n_params,
        attention=attention,
        load_seconds=time.perf_counter() - started,
        warnings=warnings,
    )
