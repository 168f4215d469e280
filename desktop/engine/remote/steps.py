"""Awaitables run one at a time on a private event loop of the calling thread, so that a blocking
network wait can be given up: on Stop, or at a deadline that covers the whole wait, not each
socket read (httpx's timeouts restart with every byte, so a server trickling one byte a second
never trips them). Qt-free; the thread must not be running an event loop of its own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.05  # how often a wait looks at Stop and its deadline


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
