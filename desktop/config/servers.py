"""Servers as a source of models: the settings' server list, with keys from the key store, made
known to the engine (which opens ``remote:`` targets) and to the folder scan (whose list feeds
the checkpoint picker and every Compare pane). Qt-free.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.config.keystore import KeyStore, keystore
from desktop.config.settings import Settings
from desktop.engine.discovery import CheckpointEntry
from desktop.engine.remote.http import RemoteError, list_models, where
from desktop.engine.remote.servers import ServerEndpoint, directory, remote_target

logger = logging.getLogger(__name__)

SOURCE = "remote"
SCAN_TIMEOUT_S = 8.0  # a scan lists every server; a dead one must not hold the list for long
REMOTE_STEP = 0  # picker entries need a step; a served model has none


@dataclass(frozen=True)
class ServerSource:
    """One configured server and the models to offer from it."""

    endpoint: ServerEndpoint
    extra_models: tuple[str, ...] = ()  # names the server does not list (a pinned transformers serve)

    def entries(self) -> list[CheckpointEntry]:
        """The server's models as picker entries (blocking: run it off the GUI thread). A server
        that cannot be reached offers its typed-in models only; the reason goes to the log."""
        names: list[str] = []
        try:
            names = [m.name for m in list_models(self.endpoint.url, self.endpoint.api_key, SCAN_TIMEOUT_S)]
        except RemoteError as exc:
            logger.warning("server %s: %s", self.endpoint.name or where(self.endpoint.url), exc)
        names += [m for m in self.extra_models if m not in names]
        return [self.entry(name) for name in names]

    def entry(self, model: str) -> CheckpointEntry:
        label = f"{self.endpoint.name or where(self.endpoint.url)} · {model}"
        target = Path(remote_target(self.endpoint.server_id, model))
        return CheckpointEntry(SOURCE, label, target, [REMOTE_STEP])


def sources(settings: Settings, keys: KeyStore | None = None) -> list[ServerSource]:
    """The servers of ``settings`` with their keys."""
    keys = keys or keystore()
    out = []
    for s in settings.get("servers"):
        endpoint = ServerEndpoint(s["id"], s["name"], s["url"], keys.get(s["id"]), s["stall_timeout"])
        out.append(ServerSource(endpoint, tuple(s["models"])))
    return out


def publish(settings: Settings, keys: KeyStore | None = None) -> list[ServerSource]:
    """Tell the engine about the servers (what ``remote:<id>/…`` targets open) and return them
    for the scan (``Background.servers``)."""
    found = sources(settings, keys)
    directory.publish(s.endpoint for s in found)
    return found


def new_server_id(existing: list[dict[str, Any]]) -> str:
    """The first free ``server-N``."""
    taken = {s.get("id") for s in existing}
    n = 1
    while f"server-{n}" in taken:
        n += 1
    return f"server-{n}"
