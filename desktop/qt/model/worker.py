"""The model worker: one long-lived QObject per loaded model, living on its own QThread.

Requests arrive through queued signals; tokens, progress, errors and completion leave through
signals. The worker knows a model only as a :class:`~desktop.engine.backend.Backend`, opened on
this thread (torch is imported by the first load, so the window appears at once). Stop is a
``threading.Event`` set directly from the GUI thread and checked between tokens: a queued "stop"
slot would wait behind the running generation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from desktop.engine.backend import (
    DEFAULT_STREAM,
    Backend,
    GenerationStats,
    LoadOptions,
    Progress,
    StreamOptions,
    stoppable,
)
from desktop.engine.errors import NanoscopeError, is_out_of_memory
from desktop.engine.files.tokenizer_checks import EncodingCancelled
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.engine.runs.saving import read_unchanged
from desktop.engine.text_lines import error_text, one_line

logger = logging.getLogger(__name__)

# Opens a model on the worker thread: engine.registry.open_backend, or a test's own.
Opener = Callable[[Path, LoadOptions, Progress], Backend]

# Hosts whose thread was still busy when they shut down (a load reads no Stop). Held here for the
# process's life: Qt aborts the process when a QThread is destroyed while it runs, which Python's
# collector or the interpreter's exit would otherwise do (see gui.app.exit_code_after).
_left_running: list[WorkerHost] = []


# The room a generation keeps for its reply when the user set no max_tokens (render()'s reserve).
UNSET_RESERVE = 256


def threads_left_running() -> int:
    """How many model threads outlived their shutdown and still run."""
    return sum(host.model_thread.isRunning() for host in _left_running)


def default_opener(target: Path, options: LoadOptions, progress: Progress) -> Backend:
    from desktop.engine.registry import open_backend  # imports torch lazily, on the worker thread

    return open_backend(target, options, progress)


def _fatal(exc: BaseException) -> bool:
    """What must end the thread rather than be reported: the interpreter shutting down."""
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def describe_failure(exc: BaseException) -> str:
    """One readable line for any exception a backend raises."""
    if isinstance(exc, NanoscopeError):
        return one_line(exc)
    if is_out_of_memory(exc):
        return "out of memory: try the Fast or Int8 precision, another device, or a smaller checkpoint"
    return error_text(exc, 300, named=True)


class TurnLock:
    """A first-come, first-served lock: threads get it in the order they asked.

    Interleaved Compare panes take it around each token step. A plain ``threading.Lock`` lets the
    thread that just released it take it straight back, so one pane could run to the end while
    the others wait; with tickets every waiting pane gets its turn before anyone goes twice.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> TurnLock:
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            while ticket != self._serving:
                self._cond.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


def _in_turns(events: Iterator[TokenEvent], lock: TurnLock | None) -> Iterator[TokenEvent]:
    """Advance ``events`` one step at a time while holding ``lock`` (each step is one token)."""
    if lock is None:
        yield from events
        return
    while True:
        with lock:
            event = next(events, None)
        if event is None:
            return
        yield event


class ModelWorker(QObject):
    """Owns one :class:`Backend`. Every slot runs on the worker thread.

    Signals:
        progress(int, str): load progress percentage and step.
        loaded(object): the backend's ModelInfo after a successful load.
        load_failed(str): one-line reason; the previous model (if any) stays loaded.
        context(int, object): request id, the Prompt it will run (context use, dropped turns).
        token(int, object): request id, a TokenEvent.
        finished(int, dict): request id, generation stats (also after a stop).
        failed(int, str): request id, one-line reason (a generation or a score).
        scored(int, dict): request id, the backend's ``score`` result.
        inside_ready(int, object): request id, an :class:`~desktop.engine.inside.InsideCache`
            (``reply_start`` and ``labels`` added: where the reply begins in its ids, and how
            every token of the vocabulary reads).
        inside_failed(int, str): request id, one-line reason (a served model, another family).
    """

    progress = Signal(int, str)
    loaded = Signal(object)
    load_failed = Signal(str)
    context = Signal(int, object)
    token = Signal(int, object)
    finished = Signal(int, dict)
    failed = Signal(int, str)
    scored = Signal(int, dict)
    inside_ready = Signal(int, object)
    inside_failed = Signal(int, str)

    # Requests (emitted from the GUI thread, so they reach the slots queued).
    load_requested = Signal(str, object)
    generate_requested = Signal(int, object, object, object, object)
    score_requested = Signal(int, object, object, object)
    unload_requested = Signal()
    inside_requested = Signal(int, object, int)
    prepare_inside_requested = Signal(int, object, int, int)
    reply_inside_requested = Signal(int, object, object, int, object)

    def __init__(self, opener: Opener = default_opener) -> None:
        super().__init__()
        self.cancel = threading.Event()
        # Set once, when the host shuts down: a load under way ends at its next stage (a load
        # reads no Stop: the user's Stop is for replies).
        self.closing = threading.Event()
        # Requests the host has sent (written by the GUI thread only): a prepared Inside pass
        # gives way when it grows past the count it was asked at.
        self.asked = 0
        self.backend: Backend | None = None
        self._open = opener
        self.load_requested.connect(self._on_load)
        self.generate_requested.connect(self._on_generate)
        self.score_requested.connect(self._on_score)
        self.unload_requested.connect(self._on_unload)
        self.inside_requested.connect(self._on_inside)
        self.prepare_inside_requested.connect(self._on_prepare_inside)
        self.reply_inside_requested.connect(self._on_reply_inside)

    @Slot(str, object)
    def _on_load(self, target: str, options: LoadOptions) -> None:
        try:
            report = stoppable(self.progress.emit, self.closing, "the load was abandoned: the app is closing")
            # A save rewriting the files meanwhile (a run training beside the app) is waited out,
            # never reported as a corrupt file.
            backend = read_unchanged(
                lambda: self._open(Path(target), options, report),
                Path(target),
                options.step,
                self.closing.wait,
            )
        # BaseException: a Rust panic in a tokenizer (pyo3's PanicException) is not an Exception,
        # and it must not take the worker's slot down without a word.
        except BaseException as exc:  # every failure is reported; the worker keeps running
            if _fatal(exc):
                raise
            logger.warning("load of %s failed", target, exc_info=not isinstance(exc, NanoscopeError))
            self.load_failed.emit(describe_failure(exc))
            return
        if self.backend is not None:
            self.backend.close()
        self.backend = backend
        self.loaded.emit(backend.info())

    @Slot()
    def _on_unload(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None

    def _require(self) -> Backend:
        if self.backend is None:
            raise NanoscopeError("no model is loaded")
        return self.backend

    @Slot(int, object, object, object, object)
    def _on_generate(
        self,
        request_id: int,
        conversation: list[Message],
        params: SamplingParams,
        options: StreamOptions,
        step_lock: TurnLock | None,
    ) -> None:
        """Stream a reply to ``conversation``; ``step_lock`` (interleaved Compare panes) is taken
        around every token step."""
        stats = GenerationStats()
        try:
            backend = self._require()
            try:
                prompt = backend.render(conversation, params.max_tokens or UNSET_RESERVE, cancel=self.cancel)
            except EncodingCancelled:  # Stop pressed while a long prompt was being tokenized
                stats.stopped = "cancelled"
                self.finished.emit(request_id, stats.to_dict())
                return
            self.context.emit(request_id, prompt)
            events = backend.stream(prompt, params, self.cancel, options, stats)
            for ev in _in_turns(events, step_lock):
                self.token.emit(request_id, ev)
        except BaseException as exc:
            if _fatal(exc):
                raise
            logger.warning("generation %d failed", request_id, exc_info=not isinstance(exc, NanoscopeError))
            self.failed.emit(request_id, describe_failure(exc))
            return
        self.finished.emit(request_id, stats.to_dict())

    @Slot(int, object, object, object)
    def _on_score(
        self, request_id: int, conversation: list[Message], reply_ids: list[int], options: Any
    ) -> None:
        """Teacher-force ``reply_ids`` after the prompt ``conversation`` renders to.

        ``options``: ``top`` (alternatives per token to return) and ``skip`` (per reply token,
        True to leave it out of the averages: the calculator's forced tokens).
        """
        try:
            backend = self._require()
            if not backend.info().capabilities.scoring:
                raise NanoscopeError("this model cannot score a given reply")
            prompt = backend.render(conversation, len(reply_ids))
            result = backend.score(
                prompt, reply_ids, top=int(options.get("top") or 0), skip=options.get("skip")
            )
        except BaseException as exc:
            if _fatal(exc):
                raise
            logger.warning("score %d failed", request_id, exc_info=not isinstance(exc, NanoscopeError))
            self.failed.emit(request_id, describe_failure(exc))
            return
        self.scored.emit(request_id, result)

    @Slot(int, object, int)
    def _on_inside(self, request_id: int, ids: list[int], reply_start: int) -> None:
        """One hooked pass over ``ids`` (docs/INSIDE.md), between the other requests; the reply
        begins at ``reply_start`` (-1: past the end)."""
        self._inside(request_id, lambda backend: (list(ids), len(ids) if reply_start < 0 else reply_start))

    @Slot(int, object, int, int)
    def _on_prepare_inside(self, request_id: int, ids: list[int], reply_start: int, asked_at: int) -> None:
        """As :meth:`_on_inside`, for a pass prepared before anyone asked: it keeps at most a
        quarter of the free memory, and gives way (``inside_failed`` with
        :class:`~desktop.engine.inside.PassYielded`'s line) within a block once the host sends
        any other request, so the user never waits for it."""

        def stop() -> bool:
            return self.asked != asked_at or self.closing.is_set()

        self._inside(request_id, lambda backend: (list(ids), reply_start), stop, memory_share=0.25)

    @Slot(int, object, object, int, object)
    def _on_reply_inside(
        self,
        request_id: int,
        conversation: list[Message],
        reply_ids: list[int],
        reserve: int,
        digest: str | None,
    ) -> None:
        """The pass over ``conversation`` rendered as a prompt (as a generation renders it, with
        ``reserve`` tokens kept for the reply), then ``reply_ids``: the reply's ids as the model
        saw them. With the prompt's ``digest`` (kept with the reply), a prompt that renders
        otherwise now is one line, not a view of what the model never saw."""

        def ids_of(backend: Backend) -> tuple[list[int], int]:
            rendered = backend.render(conversation, max(1, reserve or len(reply_ids)))
            if digest is not None and rendered.digest() != digest:
                raise NanoscopeError(
                    "the conversation renders otherwise now than when this reply was written "
                    "(another chat template, tokenizer or context): its Inside view would not "
                    "show what the model saw"
                )
            prompt = rendered.require_ids()
            return prompt + list(reply_ids), len(prompt)

        self._inside(request_id, ids_of)

    def _inside(
        self,
        request_id: int,
        ids_of: Callable[[Backend], tuple[list[int], int]],
        stop: Callable[[], bool] | None = None,
        memory_share: float = 0.5,
    ) -> None:
        """The pass (``stop`` and ``memory_share`` as :func:`~desktop.engine.inside.inspect_all`),
        then the last token's numbers too, here: the kernels a position needs are measured and
        chosen on this thread (the first time, about 0.4 s at depth 12), not on the GUI's."""
        from desktop.engine.inside import PassYielded, inspect_all

        try:
            backend = self._require()
            info = backend.info()
            if info.family == "remote" or not info.capabilities.token_ids:
                raise NanoscopeError(
                    f"{info.name}: a served model has no inside to show (its weights are on the server)"
                )
            ids, reply_start = ids_of(backend)
            cache: Any = inspect_all(backend, ids, stop, memory_share)
            if len(ids) > 1:
                cache.at(len(ids) - 2)
            cache.reply_start = reply_start
            # how every token reads, for the lens's guesses (the GUI thread never asks the backend)
            cache.labels = [backend.token_label(i) for i in range(int(info.vocab_size or 0))]
        except BaseException as exc:
            if _fatal(exc):
                raise
            level = logging.INFO if isinstance(exc, PassYielded) else logging.WARNING
            logger.log(level, "inside %d failed", request_id, exc_info=not isinstance(exc, NanoscopeError))
            self.inside_failed.emit(request_id, describe_failure(exc))
            return
        self.inside_ready.emit(request_id, cache)


class WorkerHost(QObject):
    """Creates the worker, moves it to a QThread, and shuts it down in order: stop, quit, wait."""

    def __init__(
        self, parent: QObject | None = None, name: str = "nanoscope-model", opener: Opener = default_opener
    ) -> None:
        super().__init__(parent)
        self.model_thread = QThread()
        self.model_thread.setObjectName(name)
        self.worker = ModelWorker(opener)
        self.worker.moveToThread(self.model_thread)
        self.model_thread.start()

    def generate(
        self,
        request_id: int,
        conversation: list[Message],
        params: SamplingParams,
        options: StreamOptions = DEFAULT_STREAM,
        step_lock: TurnLock | None = None,
    ) -> None:
        """Queue a generation; a stop pressed before this call does not leak into it."""
        self.worker.cancel.clear()
        self._ask()
        self.worker.generate_requested.emit(request_id, conversation, params, options, step_lock)

    def score(
        self,
        request_id: int,
        conversation: list[Message],
        reply_ids: list[int],
        top: int = 0,
        skip: list[bool] | None = None,
    ) -> None:
        """Queue a teacher-forced score of ``reply_ids`` as the reply to ``conversation``."""
        options = {"top": top, "skip": list(skip) if skip is not None else None}
        self._ask()
        self.worker.score_requested.emit(request_id, conversation, list(reply_ids), options)

    def inside(self, request_id: int, ids: list[int], reply_start: int = -1) -> None:
        """Queue one hooked pass over ``ids`` (the Inside view's numbers)."""
        self._ask()
        self.worker.inside_requested.emit(request_id, list(ids), reply_start)

    def prepare_inside(self, request_id: int, ids: list[int], reply_start: int) -> None:
        """Queue a pass over ``ids`` that gives way to every request sent after it."""
        self.worker.prepare_inside_requested.emit(request_id, list(ids), reply_start, self.worker.asked)

    def reply_inside(
        self,
        request_id: int,
        conversation: list[Message],
        reply_ids: list[int],
        reserve: int = 0,
        digest: str | None = None,
    ) -> None:
        """Queue one hooked pass over ``conversation``'s prompt and then ``reply_ids``."""
        self._ask()
        self.worker.reply_inside_requested.emit(request_id, conversation, list(reply_ids), reserve, digest)

    def load(self, target: str, options: LoadOptions) -> None:
        self._ask()
        self.worker.load_requested.emit(target, options)

    def unload(self) -> None:
        """Free the loaded model (after the request in progress, if any)."""
        self._ask()
        self.worker.unload_requested.emit()

    def _ask(self) -> None:
        """One more request on its way: a prepared pass running or queued gives way to it."""
        self.worker.asked += 1

    def stop(self) -> None:
        """Ask the running generation (if any) to end after the current token."""
        self.worker.cancel.set()

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Stop, unload, quit, wait. True when the thread ended (then the worker may be deleted)."""
        self.worker.closing.set()
        self.stop()
        self.worker.unload_requested.emit()
        self.model_thread.quit()
        if self.model_thread.wait(timeout_ms):
            return True
        _left_running.append(self)
        return False
