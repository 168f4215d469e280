"""Served models as targets: the ``remote:<server id>/<model>`` scheme, the servers the app knows,
and what each server was found to refuse (Qt-free, network-free).

A target names a server by the id the app gave it (a short slug kept in settings), never by its
URL or key: targets end up in settings (the last model), history and logs, and a key must not.
The app publishes its servers here (URL, name, key from the keyring) and the registry looks the
id up when a model is opened; the CLI passes the URL and key in ``LoadOptions`` instead.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote

SCHEME = "remote:"
# Server ids are slugs, so a target splits unambiguously at the first "/" (model names may hold "/").
SERVER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class ServerEndpoint:
    """One OpenAI-compatible server. ``api_key`` stays out of ``repr`` so no log line carries it."""

    server_id: str
    name: str
    url: str
    api_key: str | None = field(default=None, repr=False)
    stall_timeout: float | None = None  # seconds a reply may pause (None: the backend's default)


def is_remote(target: object) -> bool:
    return str(target).startswith(SCHEME)


def remote_target(server_id: str, model: str) -> str:
    """``remote:<server id>/<model>``; ValueError for an id that is not a slug or an empty model.

    The app passes targets around as ``Path`` s, which fold "//" and turn "/" into "\\" on
    Windows; a model name such as ``/models/d32`` (``transformers serve DIR``) or ``org/name``
    therefore has its "%", "/" and "\\" percent-encoded, leaving one separator in the target.
    """
    if not SERVER_ID.match(server_id):
        raise ValueError(f"server id must be letters, digits, '-' or '_', got {server_id!r}")
    if not model.strip():
        raise ValueError("a served model needs a name")
    encoded = model.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")
    return f"{SCHEME}{server_id}/{encoded}"


def parse_target(target: object) -> tuple[str, str]:
    """(server id, model) of a remote target (either separator: see ``remote_target``)."""
    text = str(target)
    if not text.startswith(SCHEME):
        raise ValueError(f"{text!r} is not a remote target ({SCHEME}<server>/<model>)")
    server_id, sep, model = text[len(SCHEME) :].replace("\\", "/").partition("/")
    if not sep or not model or not SERVER_ID.match(server_id):
        raise ValueError(f"{text!r} is not a remote target ({SCHEME}<server>/<model>)")
    return server_id, unquote(model)


class _Directory:
    """The servers the app has published, by id (read on worker threads, written on the GUI's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[str, ServerEndpoint] = {}

    def publish(self, servers: Iterable[ServerEndpoint]) -> None:
        with self._lock:
            self._servers = {s.server_id: s for s in servers}

    def lookup(self, server_id: str) -> ServerEndpoint | None:
        with self._lock:
            return self._servers.get(server_id)


class _Refusals:
    """Per server URL: the request fields it answered 400/422 to, so later requests leave them out.

    Kept for the session: a server may be upgraded or swapped between runs, and relearning costs
    one rejected request.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_server: dict[str, set[str]] = {}

    def get(self, url: str) -> frozenset[str]:
        with self._lock:
            return frozenset(self._by_server.get(url, ()))

    def add(self, url: str, fields: Iterable[str]) -> None:
        with self._lock:
            self._by_server.setdefault(url, set()).update(fields)

    def forget(self, url: str) -> None:
        with self._lock:
            self._by_server.pop(url, None)


directory = _Directory()
refusals = _Refusals()
