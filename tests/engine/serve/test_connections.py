"""Connections that never make a request: one that sends nothing, and one that stops halfway
through its headers, are closed once the first request is late, so idle connections cannot take
every place the server has; and neither the command line nor the window loads the server's
libraries until something is served."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from support import REPO
from support.golden import GOLDEN
from support.serving import serving

from desktop.engine.backend import LoadOptions

E7 = GOLDEN / "nanochat" / "E7"


def closed_by_the_server(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` (recv returns no bytes) within the socket's timeout."""
    try:
        while chunk := sock.recv(4096):
            del chunk  # uvicorn may answer a half-sent request before it closes
        return True
    except TimeoutError:
        return False


@pytest.mark.parametrize(
    "sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"], ids=["nothing", "half"]
)
def test_a_connection_whose_first_request_is_late_is_closed(sent):
    with serving(
        E7 / "base_checkpoints" / "d2", LoadOptions(device="cpu", base_dir=E7), header_timeout_s=1.0
    ) as s:
        with socket.create_connection(("127.0.0.1", s.server.port), timeout=20) as sock:
            sock.sendall(sent)
            assert closed_by_the_server(sock)
        assert s.healthy()


def test_neither_the_command_line_nor_the_window_loads_the_server_until_it_serves():
    code = (
        "import sys, desktop.cli.main, desktop.qt.app.main_window\n"
        "print(sorted(m for m in ('uvicorn', 'starlette', 'openai', 'fastapi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
