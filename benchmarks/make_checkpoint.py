"""Write random-weight nanochat checkpoints (current E7 architecture) for benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from desktop.engine.nanochat.classify import expected_shapes
from desktop.engine.nanochat.config import ModelConfig, e7_config


def nanochat_e7(depth: int, vocab: int = 32768, seq: int = 2048) -> ModelConfig:
    """nanochat's sizing since 2026-01-18: C = 64*depth rounded up to 128, H = C/128."""
    C = -(-64 * depth // 128) * 128
    return e7_config(seq, vocab, depth, C // 128, C)


def write_e7(
    base: Path, depth: int, step: int = 1000, seed: int = 0, vocab: int = 32768, seq: int = 2048
) -> Path:
    cfg = nanochat_e7(depth, vocab, seq)
    out = base / "base_checkpoints" / f"d{depth}"
    if (out / f"model_{step:06d}.pt").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for key, shape in expected_shapes(cfg).items():
        fan_in = shape[-1] if len(shape) > 1 else 1
        sd[key] = torch.randn(shape, generator=g) * (1.0 / fan_in**0.5 if len(shape) > 1 else 0.1)
    sd["resid_lambdas"] = torch.ones(depth)
    sd["x0_lambdas"] = torch.full((depth,), 0.1)
    torch.save(sd, out / f"model_{step:06d}.pt")
    mc = {
        k: getattr(cfg, k) for k in ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
    }
    mc["window_pattern"] = cfg.window_pattern
    (out / f"meta_{step:06d}.json").write_text(json.dumps({"step": step, "model_config": mc}))
    return out
