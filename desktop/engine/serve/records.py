"""What the server tells its owner of each answered request (light: the window imports it at
start, before anything of the server itself loads)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    """One answered request, as the window's request list shows it (no body, no key)."""

    client: str
    method: str
    path: str
    status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    note: str = ""
