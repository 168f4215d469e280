"""uvicorn's HTTP/1.1 protocol (h11) with the one timeout it lacks: a connection whose first
request has not fully arrived (its headers) within ``HEADER_TIMEOUT_S`` of opening is closed.

Without it, a connection that never sends a request, or stops halfway through its headers, holds
one of the server's connections for ever, and enough of them turn every later request away.
uvicorn's own keep-alive timeout takes over once a request has been answered.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 30.0


def with_header_timeout(seconds: float) -> type[H11Protocol]:
    """The h11 protocol class closing connections whose first request is late by ``seconds``."""

    class HeaderTimeoutProtocol(H11Protocol):
        _first_request_late: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._first_request_late = self.loop.call_later(seconds, self._close_if_no_request)

        def _close_if_no_request(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._first_request_late is not None:
                self._first_request_late.cancel()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol
