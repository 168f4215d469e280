"""``nanoscope serve``'s server, run in the test's process on a free port of 127.0.0.1: the real
uvicorn app over the real model thread, for clients no one here wrote (the ``openai`` package,
lm-evaluation-harness, Nanoscope's own remote backend)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from desktop.engine.backend import LoadOptions
from desktop.engine.registry import open_backend
from desktop.engine.serve.app import ServeSettings, served_id
from desktop.engine.serve.host import ModelHost
from desktop.engine.serve.records import RequestRecord
from desktop.engine.serve.server import Server

START_TIMEOUT_S = 120.0


@dataclass
class Serving:
    server: Server
    model: str
    records: list[RequestRecord] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def root(self) -> str:
        return self.server.url.removesuffix("/v1")

    def openai(self, **kwargs):
        import openai

        return openai.OpenAI(
            base_url=self.url, api_key=kwargs.pop("api_key", "none"), max_retries=0, **kwargs
        )

    def healthy(self) -> bool:
        return httpx.get(f"{self.root}/health", timeout=10).json().get("status") == "ok"


@contextmanager
def serving(
    directory: Path, options: LoadOptions | None = None, *, api_key: str | None = None, **settings
) -> Iterator[Serving]:
    """``directory`` served until the block ends; ``settings``: ServeSettings fields,
    ``max_waiting`` and ``header_timeout_s``."""
    options = options or LoadOptions(device="cpu")
    host = ModelHost(lambda: open_backend(directory, options), settings.pop("max_waiting", 64))
    header_timeout = settings.pop("header_timeout_s", 30.0)
    host.start()
    info = host.wait_opened(START_TIMEOUT_S)
    records: list[RequestRecord] = []
    server = Server(
        host,
        ServeSettings(served_id(info), api_key, **settings),
        "127.0.0.1",
        0,
        records.append,
        header_timeout,
    )
    server.start()
    try:
        _wait_started(server)
        yield Serving(server, served_id(info), records)
    finally:
        server.stop()


def _wait_started(server: Server) -> None:
    """Until uvicorn accepts connections: /health answers (no sleep: each try blocks on connect)."""
    for _ in range(1000):
        try:
            httpx.get(server.url.removesuffix("/v1") + "/health", timeout=5)
            return
        except httpx.TransportError:
            continue
    raise AssertionError("the server never answered")
