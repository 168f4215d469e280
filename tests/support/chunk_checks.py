"""What a kernel-timings file says of chunked prefill on this machine (engine/decode/chunked.py)."""

from __future__ import annotations

import json
from pathlib import Path

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
