"""Saving a reply while it streams, so that a crash or a kill loses at most a second of it."""

from __future__ import annotations

import time
from collections.abc import Callable

from desktop.engine.messages import Message
from desktop.store.history import HistoryStore


class StreamingWriter:
    """Saves a reply while it streams, at most once per ``interval_s``, so a kill loses ≤ 1 s.

    Usage: ``msg_id = store.add_message(conv, reply, parent, complete=False)``, then
    ``writer.update(reply)`` after each token, ``writer.finish(reply)`` at the end or on stop.
    """

    def __init__(
        self,
        store: HistoryStore,
        msg_id: int,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.msg_id = msg_id
        self.interval_s = interval_s
        self._clock = clock
        self._last_write = clock()
        self._unsaved: Message | None = None

    def update(self, message: Message) -> bool:
        """Note the grown ``message``; True when this call wrote it."""
        self._unsaved = message
        if self._clock() - self._last_write < self.interval_s:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        """Write the latest unsaved state now (still marked incomplete)."""
        if self._unsaved is not None:
            self.store.update_message(self.msg_id, self._unsaved, complete=False)
            self._unsaved = None
        self._last_write = self._clock()

    def finish(self, message: Message) -> None:
        self.store.update_message(self.msg_id, message, complete=True)
        self._unsaved = None
