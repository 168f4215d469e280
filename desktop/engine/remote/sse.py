"""Server-sent events from an OpenAI-compatible server, read one event at a time on the calling
thread, with Stop and timeouts that a silent server cannot outlast (Qt-free).

The backend's ``stream`` is a plain generator on the model's worker thread. A blocking socket
read cannot be interrupted by Stop, so the HTTP work runs on a private asyncio loop owned by
that thread, one awaitable at a time (:class:`~.steps.StepRunner`): while it waits, the Stop
event and the deadline are checked every ``POLL_S``. Stop then closes the response (the server
sees the client leave and ends the generation) within a fraction of a second, whatever the
server is doing.

Nothing a server sends is held without a bound (the hardening issue's network class):

* the headers must arrive within the first-byte timeout, all of them, however they trickle;
* the body is asked for uncompressed and read raw (a compressed stream is refused: 1.5 MB of
  gzip inflates to gigabytes), at most :data:`MAX_LINE_BYTES` per event and
  :data:`MAX_BODY_BYTES` in all;
* the stall timeout runs from the last event that moved the reply on (the consumer says which,
  with :meth:`EventStream.progressed`), so keep-alives and empty events do not reset it;
* the whole reply has :data:`REPLY_DEADLINE_S`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Generator
from typing import Any

import httpx

from desktop.engine.files.safe_json import text_depth
from desktop.engine.remote.http import RemoteError, status_error, transport_error, where
from desktop.engine.remote.steps import StepRunner, TimedOut
from desktop.engine.text_lines import one_line

CLOSE_TIMEOUT_S = 5.0
ERROR_BODY_TIMEOUT_S = 10.0
MAX_ERROR_BODY_BYTES = 64 << 10  # an error answer is a line or a small JSON object
# One event of one chunk: a vLLM chunk with 20 alternatives per token is a few KB.
MAX_LINE_BYTES = 1 << 20
# A whole reply: 1M tokens (max_tokens' ceiling) with their log-probabilities stay far below.
MAX_BODY_BYTES = 256 << 20
# A chunk nests 5 levels deep; json.loads recurses once per level, past the thread's stack.
MAX_EVENT_DEPTH = 64
# A reply's whole time: 1M tokens at 300 tokens/s, a GPU box's pace for the models served here.
REPLY_DEADLINE_S = 3600.0


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
        self.headers = {
            **headers,
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",
            "Cache-Control": "no-store",
        }
        self.first_byte_timeout, self.stall_timeout = first_byte_timeout, stall_timeout
        self.cancel, self.model, self.api_key = cancel, model, api_key
        self.done = False  # the server sent [DONE]
        self.response: httpx.Response | None = None
        self._started = time.monotonic()
        self._stall_at = self._started + first_byte_timeout  # until the first progress
        self._first = True

    def progressed(self) -> None:
        """The last event moved the reply on (it held a token): the stall timeout restarts."""
        self._first = False
        self._stall_at = time.monotonic() + self.stall_timeout

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
                content = self.runner.run(_head(self.response.aiter_raw()), ERROR_BODY_TIMEOUT_S)
            except (TimedOut, httpx.HTTPError):
                content = b""
            status = self.response.status_code
            self.close()
            raise status_error(status, content, self.url, self.model, self.api_key)
        encoding = self.response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            self.close()
            raise RemoteError(f"{where(self.url)} sent its reply compressed ({encoding[:20]}), unasked")

    def payloads(self) -> Generator[dict[str, Any], None, None]:
        """Each event's JSON. Raises Cancelled (Stop), or RemoteError with one line."""
        assert self.response is not None, "open() first"
        events = event_data(self.response.aiter_raw())
        try:
            while True:
                try:
                    data = self.runner.run(anext(events, None), self._wait(), self.cancel)
                except TimedOut:
                    raise RemoteError(self._timed_out()) from None
                except StreamRefused as exc:
                    raise RemoteError(f"{where(self.url)} {exc}") from None
                except httpx.HTTPError as exc:
                    raise transport_error(exc, self.url) from None
                if data is None:
                    return
                data = data.strip()
                if data == "[DONE]":
                    self.done = True
                    return
                if not data:
                    continue  # a keep-alive or a comment-only event
                yield self._payload(data)
        finally:
            with contextlib.suppress(TimedOut, httpx.HTTPError, RuntimeError):
                self.runner.run(events.aclose(), CLOSE_TIMEOUT_S)
            self.close()

    def _payload(self, data: str) -> dict[str, Any]:
        """One event's JSON object; RemoteError with one line for anything else."""
        malformed = f"{where(self.url)} sent a malformed event"
        # Nesting cannot be deeper than the opening brackets are many: a chunk has a few dozen,
        # and counting them costs a tenth of measuring the depth.
        if data.count("[") + data.count("{") > MAX_EVENT_DEPTH and text_depth(data) > MAX_EVENT_DEPTH:
            raise RemoteError(f"{malformed} (nested deeper than {MAX_EVENT_DEPTH} levels)")
        try:
            # Not loads_bounded: older vLLM writes -Infinity log-probabilities, which events.py
            # leaves out where it reads them, with every other number it cannot use.
            payload = json.loads(data)
        except ValueError:  # not JSON, or an integer of more digits than Python converts
            said = one_line(data, fold=True, limit=80, secret=self.api_key)
            raise RemoteError(f"{malformed} (not JSON): {said}") from None
        if not isinstance(payload, dict):
            raise RemoteError(f"{malformed} (not a JSON object)")
        return payload

    def _wait(self) -> float:
        """How long the next read may take: to the stall deadline or the reply's, the nearer."""
        return max(0.0, min(self._stall_at, self._started + REPLY_DEADLINE_S) - time.monotonic())

    def _timed_out(self) -> str:
        if time.monotonic() >= self._started + REPLY_DEADLINE_S:
            took = f"{REPLY_DEADLINE_S / 60:g} min" if REPLY_DEADLINE_S >= 60 else f"{REPLY_DEADLINE_S:g} s"
            return f"{where(self.url)} took longer than {took} for one reply (reply deadline)"
        if self._first:
            return (
                f"{where(self.url)} sent no reply within {self.first_byte_timeout:g} s "
                "(timed out before the first token)"
            )
        return (
            f"{where(self.url)} stopped sending mid-reply: "
            f"no token for {self.stall_timeout:g} s (stall timeout)"
        )

    def close(self) -> None:
        """Drop the connection (a server aborts the generation when its client leaves)."""
        if self.response is not None and not self.response.is_closed:
            with contextlib.suppress(TimedOut, httpx.HTTPError):
                self.runner.run(self.response.aclose(), CLOSE_TIMEOUT_S)


class StreamRefused(Exception):
    """The body broke a budget; the message completes "<server> ..."."""


async def _head(chunks: AsyncIterator[bytes]) -> bytes:
    """At most MAX_ERROR_BODY_BYTES of a raw body."""
    out = bytearray()
    async for chunk in chunks:
        out += chunk
        if len(out) >= MAX_ERROR_BODY_BYTES:
            break
    return bytes(out[:MAX_ERROR_BODY_BYTES])


async def event_data(chunks: AsyncIterator[bytes]) -> AsyncGenerator[str, None]:
    """Each server-sent event's data (its ``data:`` lines joined by newlines), from the raw
    body; lines end with LF or CRLF, comments and other fields are skipped, and an event the
    body ends before completing is dropped, as the SSE specification says. StreamRefused for an
    event or line over MAX_LINE_BYTES or a body over MAX_BODY_BYTES."""
    pending = bytearray()
    data: list[bytes] = []
    total = size = 0  # the body's bytes so far; the current event's data bytes
    async for chunk in chunks:
        total += len(chunk)
        if total > MAX_BODY_BYTES:
            raise StreamRefused(f"sent more than {MAX_BODY_BYTES >> 20} MB for one reply")
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            line = bytes(pending[start:end]).removesuffix(b"\r")
            start = end + 1
            if not line:
                if data:
                    yield b"\n".join(data).decode("utf-8", "replace")
                    data, size = [], 0
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                data.append(value.removeprefix(b" "))
                size += len(data[-1]) + 1
                if size > MAX_LINE_BYTES:
                    raise StreamRefused(f"sent an event longer than {MAX_LINE_BYTES >> 20} MB")
        del pending[:start]
        if len(pending) > MAX_LINE_BYTES:
            raise StreamRefused(f"sent a line longer than {MAX_LINE_BYTES >> 20} MB")
