"""The window's server, Qt-free: which checkpoint it serves, where, whether it is on, and the
requests it answered (the newest last, at most :data:`MAX_REQUESTS` kept).

The Server panel renders it and sends the user's intents (serve, stop) to the task that runs the
engine's server; the task records here what actually happened (loading, serving at an address,
failed with a reason, each request answered), so every label the panel shows comes from what ran.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from desktop.engine.serve.records import RequestRecord
from desktop.session.observable import Events

MAX_REQUESTS = 500
OFF, LOADING, SERVING, FAILED = "off", "loading", "serving", "failed"


@dataclass(frozen=True)
class ServeChoice:
    """What to serve: a checkpoint (a folder and a step; None, the latest), in a precision, where."""

    path: str
    step: int | None
    label: str
    dtype: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000


class ServingSession:
    """Events:
    changed(): the state, the address or the error changed.
    request(record): one request was answered (a RequestRecord).
    """

    def __init__(self) -> None:
        self.events = Events("changed", "request")
        self.state = OFF
        self.choice: ServeChoice | None = None
        self.url = ""
        self.model_id = ""
        self.error = ""
        self.key_note = ""  # how clients get the key, when one is needed
        self.requests: deque[RequestRecord] = deque(maxlen=MAX_REQUESTS)
        self.answered = 0

    @property
    def on(self) -> bool:
        return self.state in (LOADING, SERVING)

    def starting(self, choice: ServeChoice) -> None:
        self.choice, self.state, self.url, self.model_id, self.error = choice, LOADING, "", "", ""
        self.key_note = ""
        self.events.changed.emit()

    def started(self, url: str, model_id: str, key_note: str) -> None:
        self.state, self.url, self.model_id, self.key_note = SERVING, url, model_id, key_note
        self.events.changed.emit()

    def failed(self, error: str) -> None:
        self.state, self.error, self.url = FAILED, error, ""
        self.events.changed.emit()

    def stopped(self) -> None:
        if self.state == FAILED:
            return  # the reason stays on screen
        self.state, self.url = OFF, ""
        self.events.changed.emit()

    def answered_request(self, record: RequestRecord) -> None:
        self.requests.append(record)
        self.answered += 1
        self.events.request.emit(record)

    def status_line(self) -> str:
        """One line for the panel and the status bar, from what runs."""
        if self.state == LOADING and self.choice is not None:
            return f"Loading {self.choice.label} to serve it…"
        if self.state == SERVING:
            n = self.answered
            return f"Serving {self.model_id} at {self.url} · {n:,} request{'s' if n != 1 else ''}"
        if self.state == FAILED:
            return f"Not serving: {self.error}"
        return "Not serving"
