"""A stand-in for ``wandb``, which nanochat's ``scripts/base_train.py`` imports at the top but
uses only when ``--run`` names a run: the tests pass ``--run=dummy`` (its ``DummyWandb``).
support/run_upstream.py puts this folder last on sys.path, so an installed wandb wins."""

from __future__ import annotations

from typing import Any


def init(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("wandb is not installed: run nanochat's training with --run=dummy")
