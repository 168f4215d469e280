"""What a kernel-timings file says of chunked prefill on this machine (engine/decode/chunked.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from desktop.engine.decode.chunked import PREFILL_CHUNK

ENTRY = f"prefill in chunks of {PREFILL_CHUNK}"


def chunk_checks(kernels: Path) -> dict[str, float]:
    """Each chunked-prefill check the file keeps (any thread count): its entry -> 1.0 where chunks
    gave one pass's bits, 0.0 where not. Empty when nothing was checked (or timed) yet."""
    if not kernels.exists():
        return {}
    machines = json.loads(kernels.read_text())["machines"]
    return {
        entry: timings["same"]
        for per_thread in machines.values()
        for entries in per_thread.values()
        for entry, timings in entries.items()
        if entry.startswith(ENTRY)
    }


def greedy_after_prefill(
    model: Any, ids: torch.Tensor, cache: Any, chunk: int | None, new: int = 8
) -> list[int]:
    """Prefill ``ids`` into ``cache`` (``chunk`` as the models' forward takes it: None by default,
    0 in one pass), then decode ``new`` greedy ids."""
    out: list[int] = []
    with torch.inference_mode():
        logits = model(ids, cache, last_only=True, chunk=chunk)
        for _ in range(new):
            token = logits[:, -1].argmax(-1, keepdim=True)
            out.append(int(token))
            logits = model(token, cache, last_only=True)
    return out
