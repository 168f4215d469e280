"""Checkpoints in nanochat's layout: ``chatsft_checkpoints/demo/model_<step>.pt`` + ``meta_<step>.json``.

Weight matrices and embeddings are stored in bfloat16, which halves the files; the engine
widens them to its compute dtype when loading, exactly (every bfloat16 is a float32). The
learned scalars (``resid_lambdas`` ...) stay float32: they are a few bytes and bfloat16 would
round them to three digits.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from desktop.engine.nanochat.model import GPT

from .settings import RunSettings
from .training import Losses, model_config_meta


def checkpoint_dir(s: RunSettings) -> Path:
    return s.out / "chatsft_checkpoints" / s.tag


def shipped_state(model: GPT) -> dict[str, torch.Tensor]:
    """The state_dict as it is written: 2-D weights in bfloat16, scalars in float32."""
    return {
        k: (v.detach().to(torch.bfloat16) if v.ndim >= 2 else v.detach().float()).clone().contiguous()
        for k, v in model.state_dict().items()
    }


def as_shipped(model: GPT) -> GPT:
    """A float32 copy of ``model`` holding the weights a snapshot stores (for measuring its loss)."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for name, tensor in shipped_state(model).items():
            twin.get_parameter(name).copy_(tensor.float())
    return twin


def clear(s: RunSettings) -> None:
    """Remove the model and meta files of an earlier run, so no stale step is left for the app."""
    directory = checkpoint_dir(s)
    for old in [*directory.glob("model_*.pt"), *directory.glob("meta_*.json")]:
        old.unlink()


def save(model: GPT, step: int, losses: Losses, s: RunSettings) -> Path:
    """``model_<step>.pt`` + ``meta_<step>.json`` as nanochat's chat_sft writes them."""
    directory = checkpoint_dir(s)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"model_{step:06d}.pt"
    torch.save(shipped_state(model), path)
    val_loss, val_bpb = losses["chat"]
    meta = {
        "step": step,
        "val_bpb": round(val_bpb, 6),
        "val_loss": round(val_loss, 6),
        "model_config": model_config_meta(model.config),
        "user_config": {**s.for_meta(), "trainer": "python -m tools.demo"},
    }
    (directory / f"meta_{step:06d}.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return path
