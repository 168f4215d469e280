"""A small OpenAI-compatible HTTP server on 127.0.0.1 that misbehaves on purpose (tests only).

Each test sets ``server.script``: a function of (path, request body) returning a ``Reply`` —
the status, headers and a list of body pieces. A piece is bytes to send, ``Pause(event)`` to wait
(bounded) before going on, ``Every(seconds, piece, event)`` to repeat a piece until the event
(bounded), or ``DROP`` to cut the connection mid-body. ``Reply.trickle`` sends the status line
and headers one byte at a time (a server that never lets a per-read timeout run out). Every
request is recorded
in ``server.requests`` so a test can see what the client sent (a key, a refused field).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PAUSE_LIMIT_S = 20.0  # no pause outlives this, whatever the test does
DROP = object()


@dataclass
class Pause:
    until: threading.Event


@dataclass
class Every:
    """Send ``piece`` every ``seconds`` until ``until`` is set (a server that keeps talking)."""

    seconds: float
    piece: bytes
    until: threading.Event


@dataclass
class Reply:
    status: int = 200
    pieces: list[Any] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/event-stream"
    before: Pause | None = None  # wait before the status line (a server slow to answer at all)
    trickle: float = 0.0  # seconds between the bytes of the status line and headers (0: at once)


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def chat_chunk(text: str | None = None, finish: str | None = None, **extra: Any) -> bytes:
    delta = {} if text is None else {"content": text}
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    choice.update({k: v for k, v in extra.items() if k in ("logprobs", "token_ids")})
    payload: dict[str, Any] = {"object": "chat.completion.chunk", "choices": [choice]}
    payload.update({k: v for k, v in extra.items() if k in ("usage", "prompt_token_ids")})
    return sse(payload)


def models(*names: str, context: int = 2048) -> Reply:
    data = [{"id": n, "object": "model", "owned_by": "test", "max_model_len": context} for n in names]
    return Reply(
        200, [json.dumps({"object": "list", "data": data}).encode()], content_type="application/json"
    )


def error(status: int, detail: str, **headers: str) -> Reply:
    return Reply(status, [json.dumps({"detail": detail}).encode()], headers, "application/json")


Script = Callable[[str, dict[str, Any]], Reply]


class FaultServer:
    def __init__(self) -> None:
        self.script: Script = lambda path, body: error(404, f"nothing at {path}")
        self.requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.disconnected = threading.Event()  # a client left while a reply was being written
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet test output
                pass

            def do_GET(self) -> None:
                self._answer({})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                self._answer(json.loads(raw or b"{}"))

            def _answer(self, body: dict[str, Any]) -> None:
                outer.requests.append((self.path, body, dict(self.headers)))
                reply = outer.script(self.path, body)
                if reply.before is not None:
                    reply.before.until.wait(PAUSE_LIMIT_S)
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                try:
                    if reply.trickle:
                        self._trickle_headers(reply.trickle)
                    else:
                        self.end_headers()
                    for piece in reply.pieces:
                        if piece is DROP:
                            self.connection.shutdown(socket.SHUT_RDWR)
                            self.close_connection = True
                            return
                        if isinstance(piece, Pause):
                            piece.until.wait(PAUSE_LIMIT_S)
                            continue
                        if isinstance(piece, Every):
                            for _ in range(int(PAUSE_LIMIT_S / piece.seconds)):
                                if piece.until.wait(piece.seconds):
                                    break
                                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece.piece), piece.piece))
                                self.wfile.flush()
                            continue
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    outer.disconnected.set()
                    self.close_connection = True

            def _trickle_headers(self, seconds: float) -> None:
                """The buffered status line and headers, one byte every ``seconds`` (bounded)."""
                head = b"".join(self._headers_buffer) + b"\r\n"  # type: ignore[attr-defined]
                self._headers_buffer = []  # type: ignore[attr-defined]
                began = time.monotonic()
                for i in range(len(head)):
                    if time.monotonic() - began > PAUSE_LIMIT_S:
                        raise OSError("trickled for too long")
                    self.wfile.write(head[i : i + 1])
                    self.wfile.flush()
                    time.sleep(seconds)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # A client leaving mid-reply is what many tests do; socketserver would print a traceback
        # to whatever stderr a later test is capturing.
        self.httpd.handle_error = lambda *_: outer.disconnected.set()  # type: ignore[method-assign]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fault-server", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
