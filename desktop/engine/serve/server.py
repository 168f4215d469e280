"""Run the app under uvicorn: in the foreground for ``nanoscope serve``, or on a thread for the
window's Server switch (Qt-free).

The socket is bound here, before uvicorn starts, so that a port in use or an address that is not
this machine's is one line at once, and port 0 (any free port) tells its number. A server bound to
anything but the loopback interface must have an API key.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import uvicorn

from desktop.engine.errors import NanoscopeError
from desktop.engine.serve.app import RequestLog, ServeSettings, build_app
from desktop.engine.serve.defaults import is_loopback
from desktop.engine.serve.host import ModelHost
from desktop.engine.serve.protocol import HEADER_TIMEOUT_S, with_header_timeout

logger = logging.getLogger(__name__)

MAX_CONNECTIONS = 256  # past these uvicorn answers 503 at once
KEEP_ALIVE_S = 5


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``; NanoscopeError with one line when it cannot be."""
    if not 0 <= port <= 65535:
        raise NanoscopeError(f"--port must be between 0 and 65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise NanoscopeError(f"cannot serve on {host}: {exc.strerror}") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise NanoscopeError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class Server:
    """``host`` (a model already opening or open) served on ``address``:``port``."""

    def __init__(
        self,
        model: ModelHost,
        settings: ServeSettings,
        address: str,
        port: int,
        on_request: RequestLog | None = None,
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        if not is_loopback(address) and not settings.api_key:
            raise NanoscopeError(f"serving on {address} (beyond this machine) needs an API key")

        self.model = model
        self.socket = bind(address, port)
        self.address = address
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(
            build_app(model, settings, on_request),
            log_config=None,
            access_log=False,
            limit_concurrency=MAX_CONNECTIONS,
            timeout_keep_alive=KEEP_ALIVE_S,
            lifespan="off",
            http=with_header_timeout(header_timeout_s),
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._serving = False  # uvicorn owns the socket from then on, and closes it

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/v1"

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C) or :meth:`stop`; the model closes after."""
        self._serving = True
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self.socket.close()
            self.model.stop()

    def start(self) -> None:
        """Serve on a thread of its own; :attr:`started` is set once it accepts connections."""
        self._thread = threading.Thread(target=self._serve_here, name="nanoscope-serve-http", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return bool(self._uvicorn.started)

    def _serve_here(self) -> None:
        self._serving = True
        try:
            asyncio.run(self._uvicorn.serve(sockets=[self.socket]))
        except Exception:
            logger.error("the server stopped on an error", exc_info=True)
        finally:
            self.socket.close()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, end the requests in flight, close the model."""
        self.model.stop(timeout)  # cancels what runs, so the streams end
        self._uvicorn.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if not self._serving:
            self.socket.close()
