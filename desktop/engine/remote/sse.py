"""Server-sent events from an OpenAI-compatible server, read one event at a time on the calling
thread, with Stop and timeouts that a silent server cannot outlast (Qt-free).

The backend's ``stream`` is a plain generator on the model's worker thread. A blocking socket
read cannot be interrupted by Stop, so the HTTP work runs on a private asyncio loop owned by
that thread, one awaitable at a time: while it waits, the Stop event and the deadline are
checked every ``POLL_S``. Stop then closes the response (the server sees the client leave and
ends the generation) within a fraction of a second, whatever the server is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Awaitable, Generator
from typing import Any, TypeVar

import httpx
from httpx_sse import EventSource, SSEError

from desktop.engine.remote.http import RemoteError, one_line, status_error, transport_error, where

T = TypeVar("T")
POLL_S = 0.05  # how often a wait looks at Stop and its deadline
CLOSE_TIMEOUT_S = 5.0
ERROR_BODY_TIMEOUT_S = 10.0


class Cancelled(Exception):
    """Stop was pressed while waiting."""


class TimedOut(Exception):
    """A wait passed its deadline."""


class StepRunner:
    """A private event loop on the thread that made it; ``run`` one awaitable at a time."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.get_ident()

    def run(
        self, awaitable: Awaitable[T], timeout: float | None = None, cancel: threading.Event | None = None
    ) -> T:
        """The awaitable's result; Cancelled once ``cancel`` is set, TimedOut after ``timeout`` s.
        Either way the awaitable is cancelled and finished before this returns."""
        task = self.loop.create_task(_as_coroutine(awaitable))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            self.loop.run_until_complete(asyncio.wait({task}, timeout=left))
            if task.done():
                return task.result()
            if cancel is not None and cancel.is_set():
                self._abandon(task)
                raise Cancelled
            if deadline is not None and time.monotonic() >= deadline:
                self._abandon(task)
                raise TimedOut

    def _abandon(self, task: asyncio.Task) -> None:
        task.cancel()
        self.loop.run_until_complete(asyncio.wait({task}))
        if not task.cancelled() and task.exception() is not None:
            task.exception()  # retrieved, so asyncio does not log it as never retrieved

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


class EventStream:
    """One streamed POST: ``payloads()`` yields each ``data:`` JSON object until ``[DONE]`` or the
    end of the body (some servers never send ``[DONE]``)."""

    def __init__(
        self,
        runner: StepRunner,
        client: httpx.AsyncClient,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        *,
        first_byte_timeout: float,
        stall_timeout: float,
        cancel: threading.Event,
        model: str = "",
        api_key: str | None = None,
    ) -> None:
        self.runner, self.client, self.url, self.body = runner, client, url, body
        self.headers = {**headers, "Accept": "text/event-stream", "Cache-Control": "no-store"}
        self.first_byte_timeout, self.stall_timeout = first_byte_timeout, stall_timeout
        self.cancel, self.model, self.api_key = cancel, model, api_key
        self.done = False  # the server sent [DONE]
        self.response: httpx.Response | None = None

    def open(self) -> None:
        """Send the request and wait for the answer's headers; RemoteError for an error answer."""
        request = self.client.build_request("POST", self.url, json=self.body, headers=self.headers)
        try:
            self.response = self.runner.run(
                self.client.send(request, stream=True), self.first_byte_timeout, self.cancel
            )
        except TimedOut:
            raise RemoteError(
                f"no answer from {where(self.url)} within {self.first_byte_timeout:g} s "
                "(timed out before the first byte)"
            ) from None
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.url) from None
        if self.response.status_code != 200:
            try:
                content = self.runner.run(self.response.aread(), ERROR_BODY_TIMEOUT_S)
            except (TimedOut, httpx.HTTPError):
                content = b""
            status = self.response.status_code
            self.close()
            raise status_error(status, content, self.url, self.model, self.api_key)

    def payloads(self) -> Generator[dict[str, Any], None, None]:
        """Each event's JSON. Raises Cancelled (Stop), or RemoteError with one line."""
        assert self.response is not None, "open() first"
        events = EventSource(self.response).aiter_sse()
        first = True
        try:
            while True:
                timeout = self.first_byte_timeout if first else self.stall_timeout
                try:
                    sse = self.runner.run(anext(events, None), timeout, self.cancel)
                except TimedOut:
                    if first:
                        raise RemoteError(
                            f"{where(self.url)} sent no reply within {timeout:g} s "
                            "(timed out before the first byte)"
                        ) from None
                    raise RemoteError(
                        f"{where(self.url)} stopped sending mid-reply: "
                        f"nothing for {timeout:g} s (stall timeout)"
                    ) from None
                except SSEError as exc:
                    raise RemoteError(
                        f"{where(self.url)} did not answer with an event stream ({exc})"
                    ) from None
                except httpx.HTTPError as exc:
                    raise transport_error(exc, self.url) from None
                if sse is None:
                    return
                first = False
                data = sse.data.strip()
                if data == "[DONE]":
                    self.done = True
                    return
                if not data:
                    continue  # a keep-alive or a comment-only event
                try:
                    payload = json.loads(data)
                except ValueError:
                    raise RemoteError(
                        f"{where(self.url)} sent a malformed event (not JSON): "
                        f"{one_line(data, self.api_key)[:80]}"
                    ) from None
                if not isinstance(payload, dict):
                    raise RemoteError(f"{where(self.url)} sent a malformed event (not a JSON object)")
                yield payload
        finally:
            with contextlib.suppress(TimedOut, httpx.HTTPError, RuntimeError):
                self.runner.run(events.aclose(), CLOSE_TIMEOUT_S)
            self.close()

    def close(self) -> None:
        """Drop the connection (a server aborts the generation when its client leaves)."""
        if self.response is not None and not self.response.is_closed:
            with contextlib.suppress(TimedOut, httpx.HTTPError):
                self.runner.run(self.response.aclose(), CLOSE_TIMEOUT_S)
