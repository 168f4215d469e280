"""Which backend opens a given model (the one place that knows every implementation)."""

from __future__ import annotations

from pathlib import Path

from desktop.engine.backend import Backend, LoadOptions, Progress
from desktop.engine.hf.files import is_hf_directory
from desktop.engine.kempnerforge.layout import is_kf_target
from desktop.engine.remote.servers import is_remote


def open_backend(target: str | Path, options: LoadOptions, progress: Progress | None = None) -> Backend:
    """Open ``target``: a served model (``remote:<server id>/<model>``, see engine.remote.servers)
    or a nanochat checkpoint directory (every era and the fork)."""
    if is_remote(target):
        from desktop.engine.remote.backend import RemoteBackend  # httpx: only when a served model is opened

        return RemoteBackend.open(str(target), options, progress)
    if is_hf_directory(Path(target)):
        from desktop.engine.hf.backend import HFBackend  # imports torch: only when a model is opened

        return HFBackend.open(Path(target), options, progress)
    if is_kf_target(Path(target)):
        from desktop.engine.kempnerforge.backend import (
            KempnerForgeBackend,  # imports torch: only when a model is opened
        )

        return KempnerForgeBackend.open(Path(target), options, progress)
    from desktop.engine.nanochat.backend import NanochatBackend  # imports torch: only when a model is opened

    return NanochatBackend.open(Path(target), options, progress)
