"""What a Nanoscope server is by default, known before its libraries load (the command line and
the window read these at start; uvicorn, Starlette and the openai types load only to serve)."""

from __future__ import annotations

import ipaddress

MAX_WAITING = 64  # requests queued or running before the answer is 429
DEADLINE_S = 600.0  # the time a request may take in all, before the answer is 504


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (a server bound anywhere else needs an API key)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
