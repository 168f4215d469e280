"""Which backend opens a given model (the one place that knows every implementation)."""

from __future__ import annotations

from pathlib import Path

from .backend import Backend, LoadOptions, Progress


def open_backend(target: str | Path, options: LoadOptions, progress: Progress | None = None) -> Backend:
    """Open ``target``: today a nanochat checkpoint directory (every era and the fork)."""
    from .nanochat_backend import NanochatBackend  # imports torch: only when a model is opened

    return NanochatBackend.open(Path(target), options, progress)
