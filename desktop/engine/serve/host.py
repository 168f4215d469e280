"""The served model on its own thread: one loaded backend, jobs taken in turn from every waiting
request (Qt-free).

A backend's methods all run on the thread that opened it (engine/backend.py), so the host opens
it there and runs every job there. A request queues one job per choice; the thread takes the next
job from each waiting request in turn (round robin), so a request for 64 choices does not hold up
a one-choice request behind it. Each job is a generator run on the thread; its items reach the
asyncio side through ``call_soon_threadsafe``. A job's ``cancel`` (a client gone, a deadline
passed) ends it after the current token, and a job whose request was cancelled while it waited
never starts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from desktop.engine.backend import Backend, ModelInfo
from desktop.engine.errors import NanoscopeError
from desktop.engine.serve.wire import ApiError
from desktop.engine.text_lines import error_text

logger = logging.getLogger(__name__)

# A job's work, run on the model thread: (the backend, its cancel, whether it may continue the
# backend's kept cache) -> its items.
Work = Callable[[Backend, threading.Event, bool], Iterator[Any]]
# Replies decoded at once, a token of each in turn: a new request's first token need not wait for
# whole replies ahead of it. Each beyond the first holds a KV cache of its own, so what they may
# hold together is bounded too: ACTIVE_CONTEXTS whole contexts' worth of positions (four long
# replies, or many short ones).
MAX_ACTIVE = 16
ACTIVE_CONTEXTS = 4
_DONE = object()


@dataclass
class Job:
    """One unit of work for the model thread, and the queue its items come back through."""

    work: Work
    loop: asyncio.AbstractEventLoop
    cancel: threading.Event
    positions: int = 0  # the cache positions its prompt and reply may take (an estimate)
    items: asyncio.Queue = field(default_factory=asyncio.Queue)

    def put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the loop closed (the server is stopping): nobody is listening
            self.cancel.set()

    async def results(self) -> AsyncIterator[Any]:
        """The job's items as they come; its error raised where it happened."""
        while True:
            item = await self.items.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


@dataclass
class _Active:
    job: Job
    items: Iterator[Any]


@dataclass
class _Request:
    jobs: deque[Job]
    cancel: threading.Event


class ModelHost:
    """Opens the model with ``opener`` on its own thread, then runs jobs until :meth:`stop`.

    ``max_waiting`` bounds the requests queued or running at once; past it :meth:`submit`
    refuses with 429."""

    def __init__(self, opener: Callable[[], Backend], max_waiting: int) -> None:
        self._opener = opener
        self.max_waiting = max_waiting
        self._requests: OrderedDict[int, _Request] = OrderedDict()
        self._next_id = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="nanoscope-serve-model", daemon=True)
        self._opened = threading.Event()
        self._info: ModelInfo | None = None
        self._backend: Backend | None = None
        self.error = ""  # why the model could not be opened

    def start(self) -> None:
        self._thread.start()

    def opened(self, timeout: float | None = None) -> bool:
        """Whether the opening has ended (well or not) within ``timeout`` seconds."""
        return self._opened.wait(timeout)

    def wait_opened(self, timeout: float | None = None) -> ModelInfo:
        """The model's info once it is open; NanoscopeError with why it is not."""
        if not self.opened(timeout):
            raise NanoscopeError("the model is still loading")
        if self._info is None:
            raise NanoscopeError(self.error or "the model could not be opened")
        return self._info

    @property
    def info(self) -> ModelInfo | None:
        return self._info

    @property
    def backend(self) -> Backend | None:
        return self._backend

    def waiting(self) -> int:
        with self._cond:
            return len(self._requests)

    def submit(
        self, works: list[Work], loop: asyncio.AbstractEventLoop, positions: list[int] | None = None
    ) -> tuple[list[Job], threading.Event]:
        """Queue one request's jobs (``positions``: what each may hold in the cache, estimated);
        the jobs and the request's cancel event. ApiError(429) when ``max_waiting`` requests wait
        already, ApiError(503) when no model is open."""
        if self._info is None:
            raise ApiError(503, self.error or "the model is still loading", kind="server_error")
        cancel = threading.Event()
        context = self._context()
        sizes = [min(p or context, context) for p in positions or [0] * len(works)]  # 0: unknown
        jobs = [Job(work, loop, cancel, size) for work, size in zip(works, sizes, strict=True)]
        with self._cond:
            if self._stopping:
                raise ApiError(503, "the server is stopping", kind="server_error")
            if len(self._requests) >= self.max_waiting:
                raise ApiError(
                    429,
                    f"the server is busy: {self.max_waiting} requests wait already; try again later",
                    kind="rate_limit_error",
                )
            self._requests[self._next_id] = _Request(deque(jobs), cancel)
            self._next_id += 1
            self._cond.notify()
        return jobs, cancel

    def _context(self) -> int:
        """The model's context in positions (a served model that states none: 2,048)."""
        return self._info.context_length if self._info and self._info.context_length else 2048

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel every job, close the model on its thread and end the thread."""
        with self._cond:
            self._stopping = True
            for request in self._requests.values():
                request.cancel.set()
            self._cond.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ----- the model thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._backend = self._opener()
            self._info = self._backend.info()
        except Exception as exc:  # one line for the user (wait_opened raises it); details in the log
            logger.info("opening the served model failed", exc_info=True)
            self.error = str(exc) if isinstance(exc, NanoscopeError) else error_text(exc, named=True)
        finally:
            self._opened.set()
        if self._backend is None:
            return
        try:
            self._serve_jobs(self._backend)
        finally:
            try:
                self._backend.close()
            except Exception:  # closing must not hide why the loop ended
                logger.warning("closing the served model failed", exc_info=True)

    def _serve_jobs(self, backend: Backend) -> None:
        """Up to MAX_ACTIVE replies at once, within ACTIVE_CONTEXTS contexts of positions, a token of
        each in turn, until stopping."""
        active: list[_Active] = []
        budget = ACTIVE_CONTEXTS * self._context()
        try:
            while True:
                while len(active) < MAX_ACTIVE:
                    room = budget - sum(a.job.positions for a in active) if active else None
                    job = self._next(wait=not active, room=room)
                    if job is None:
                        break
                    # Alone, a reply may continue the backend's kept cache (the prefix a follow-up
                    # shares); beside others it takes a cache of its own, so none writes another's.
                    active.append(_Active(job, job.work(backend, job.cancel, not active)))
                if self._stopping:
                    return
                active = [a for a in active if self._advance(a)]
        finally:
            for a in active:
                self._finish(a)

    def _next(self, wait: bool, room: int | None = None) -> Job | None:
        """The next job, round robin over the waiting requests; None when none waits (and
        ``wait`` is False), when the next one needs more than ``room`` positions (it keeps its
        turn), or once stopping."""
        with self._cond:
            while True:
                if self._stopping:
                    for request in self._requests.values():
                        for job in request.jobs:
                            job.put(_DONE)
                    self._requests.clear()
                    return None
                for key in list(self._requests):
                    request = self._requests[key]
                    if request.cancel.is_set():  # its client left or its deadline passed
                        for job in request.jobs:
                            job.put(_DONE)
                        del self._requests[key]
                        continue
                    job = request.jobs[0]
                    if room is not None and job.positions > room:
                        return None
                    request.jobs.popleft()
                    if request.jobs:
                        self._requests.move_to_end(key)
                    else:
                        del self._requests[key]
                    return job
                if not wait:
                    return None
                self._cond.wait()

    def _advance(self, a: _Active) -> bool:
        """One item of ``a`` (a token, mostly) to its client; False once it has ended."""
        try:
            if a.job.cancel.is_set():
                raise StopIteration
            a.job.put(next(a.items))
            return True
        except StopIteration:
            pass
        except ApiError as exc:
            a.job.put(exc)
        except NanoscopeError as exc:
            a.job.put(ApiError(400, self._unnamed(str(exc))))
        except Exception as exc:  # the server keeps serving; the client gets one line
            logger.error("a served request failed", exc_info=True)
            a.job.put(ApiError(500, f"the model failed: {error_text(exc, named=True)}", kind="server_error"))
        self._finish(a)
        return False

    def _unnamed(self, message: str) -> str:
        """``message`` without the served model's folders: a client learns what went wrong, not
        where the model lies on this machine ("…/chat_template.jinja: the chat template failed")."""
        info = self._info
        if info is None:
            return message
        folders = {str(Path(p)) for p in (info.path, info.tokenizer) if p}
        folders |= {str(Path(p).parent) for p in folders}
        for folder in sorted(folders, key=len, reverse=True):
            if len(folder) > 1:
                message = message.replace(folder, "…")
        return message

    def _finish(self, a: _Active) -> None:
        try:
            a.items.close()  # type: ignore[attr-defined]
        finally:
            a.job.put(_DONE)
