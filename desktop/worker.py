"""The model worker: one long-lived QObject per loaded model, living on its own QThread.

Requests arrive through queued signals; tokens, progress, errors and completion leave through
signals. torch is imported on the worker thread only (the first load), so the window appears at
once. Stop is a ``threading.Event`` set directly from the GUI thread and checked between tokens:
a queued "stop" slot would wait behind the running generation.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from .engine.errors import NanoscopeError, is_out_of_memory


def describe_failure(exc: BaseException) -> str:
    """One readable line for any exception the engine raises."""
    if isinstance(exc, NanoscopeError):
        return str(exc)
    text = str(exc)
    if is_out_of_memory(exc):
        return "out of memory: try the bfloat16 dtype, another device, or a smaller checkpoint"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"[:300]


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


def _in_turns(events: Iterator, lock: TurnLock | None) -> Iterator:
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


@contextmanager
def _torch_threads(count: int | None) -> Iterator[None]:
    """Run with ``count`` intra-op threads on this thread, then restore the previous count.

    torch keeps the count per thread once a thread has run an op (and hands the last value set
    to threads that start later), so parallel panes each set their share on their own thread.
    """
    if not count:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ModelWorker(QObject):
    """Owns a :class:`ChatSession`. Every slot runs on the worker thread.

    Signals:
        progress(int, str): load progress percentage and step.
        loaded(dict): the session's info after a successful load.
        load_failed(str): one-line reason; the previous model (if any) stays loaded.
        context(int, dict): request id, {prompt_tokens, sequence_len, dropped_turns, truncated}.
        token(int, object): request id, a TokenEvent.
        finished(int, dict): request id, generation stats (also after a stop).
        failed(int, str): request id, one-line reason.
        logprobs(int, int, object): request id, index of the generated token, and
            ``(logprob of the chosen token, [[id, label, logprob] x top-n])``; emitted just before
            that token's ``token`` signal, only for ``generate_detailed`` with ``logprobs`` > 0.
        scored(int, dict): request id, :func:`engine.scoring.score_reply`'s result.
    """

    progress = Signal(int, str)
    loaded = Signal(dict)
    load_failed = Signal(str)
    context = Signal(int, dict)
    token = Signal(int, object)
    finished = Signal(int, dict)
    failed = Signal(int, str)
    logprobs = Signal(int, int, object)
    scored = Signal(int, dict)

    # Requests (connected with queued connections by WorkerHost).
    load_requested = Signal(str, dict)
    generate_requested = Signal(int, object, object)
    generate_detailed_requested = Signal(int, object, object, object)
    score_requested = Signal(int, object, object, object)
    unload_requested = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.cancel = threading.Event()
        self.session: Any = None
        self.load_requested.connect(self._on_load)
        self.generate_requested.connect(self._on_generate)
        self.generate_detailed_requested.connect(self._on_generate_detailed)
        self.score_requested.connect(self._on_score)
        self.unload_requested.connect(self._on_unload)

    @Slot(str, dict)
    def _on_load(self, path: str, options: dict) -> None:
        try:
            from .engine.session import ChatSession, SessionOptions

            opts = SessionOptions(
                step=options.get("step"),
                device=options.get("device", "auto"),
                dtype=options.get("dtype", "auto"),
                tokenizer=Path(options["tokenizer"]) if options.get("tokenizer") else None,
                softcap=options.get("softcap"),
            )
            session = ChatSession.open(Path(path), opts, progress=lambda p, m: self.progress.emit(p, m))
        except Exception as exc:  # every failure is reported; the worker keeps running
            self.load_failed.emit(describe_failure(exc))
            return
        if self.session is not None:
            self.session.close()
        self.session = session
        self.loaded.emit(session.info())

    @Slot()
    def _on_unload(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    @Slot(int, object, object)
    def _on_generate(self, request_id: int, messages: list, params: dict) -> None:
        from .engine.generation import GenerationStats
        from .engine.sampling import SamplingParams

        stats = GenerationStats()
        try:
            if self.session is None:
                raise NanoscopeError("no checkpoint is loaded")
            sp = SamplingParams(**{k: params[k] for k in SamplingParams.__dataclass_fields__ if k in params})
            ids = self._render(request_id, messages, sp.max_tokens)
            for ev in self.session.generate(ids, sp, cancel=self.cancel, stats=stats):
                self.token.emit(request_id, ev)
        except Exception as exc:
            self.failed.emit(request_id, describe_failure(exc))
            traceback.print_exc()
            return
        self.finished.emit(request_id, stats.to_dict())

    def _render(self, request_id: int, messages: list, max_tokens: int | None) -> list[int]:
        """Prompt ids for ``messages``; reports the context they use through ``context``."""
        rendered = self.session.render(messages, max_tokens or 256)
        self.context.emit(
            request_id,
            {
                "prompt_tokens": len(rendered.ids),
                "sequence_len": self.session.loaded.config.sequence_len,
                "dropped_turns": rendered.dropped_turns,
                "truncated": rendered.truncated,
            },
        )
        return rendered.ids

    @Slot(int, object, object, object)
    def _on_generate_detailed(self, request_id: int, messages: list, params: dict, options: dict) -> None:
        """A generation for the Compare view. ``options``:

        * ``logprobs`` (int): top alternatives per token to report through ``logprobs``; 0 (the
          default) computes none, so the overlay costs nothing while it is off;
        * ``threads`` (int): intra-op threads for this run (CPU panes running side by side);
        * ``step_lock`` (TurnLock): taken around every token step (interleaved CPU panes).

        Each run starts from an empty KV cache (the prompt is one message), so every pane
        computes the same thing whatever it answered before.
        """
        from .engine.generation import GenerationStats, stream_reply
        from .engine.sampling import SamplingParams
        from .engine.scoring import token_label

        stats = GenerationStats()
        top = int(options.get("logprobs") or 0)
        try:
            session = self.session
            if session is None:
                raise NanoscopeError("no checkpoint is loaded")
            sp = SamplingParams(**{k: params[k] for k in SamplingParams.__dataclass_fields__ if k in params})
            ids = self._render(request_id, messages, sp.max_tokens)
            index = 0

            def report(entry: tuple[float, list[tuple[int, float]]]) -> None:
                nonlocal index
                chosen, alternatives = entry
                labelled = [[i, token_label(session.tok, i), lp] for i, lp in alternatives]
                self.logprobs.emit(request_id, index, (chosen, labelled))
                index += 1

            with _torch_threads(options.get("threads")):
                events = stream_reply(
                    session.model,
                    session.tok,
                    ids,
                    sp,
                    cancel=self.cancel,
                    stats=stats,
                    logprobs=top,
                    on_logprobs=report if top else None,
                )
                for ev in _in_turns(events, options.get("step_lock")):
                    self.token.emit(request_id, ev)
        except Exception as exc:
            self.failed.emit(request_id, describe_failure(exc))
            traceback.print_exc()
            return
        self.finished.emit(request_id, stats.to_dict())

    @Slot(int, object, object, object)
    def _on_score(self, request_id: int, messages: list, reply_ids: list, options: dict) -> None:
        """Teacher-force ``reply_ids`` after the prompt ``messages`` render to; ``scored`` or ``failed``.

        ``options``: ``top`` (alternatives per token to return) and ``skip`` (per reply token,
        True to leave it out of the averages: the calculator's forced tokens).
        """
        from .engine.scoring import score_reply

        try:
            if self.session is None:
                raise NanoscopeError("no checkpoint is loaded")
            prompt = self.session.render(messages, len(reply_ids)).ids
            result = score_reply(
                self.session.model,
                self.session.tok,
                prompt,
                reply_ids,
                top=int(options.get("top") or 0),
                skip=options.get("skip"),
            )
        except Exception as exc:
            self.failed.emit(request_id, describe_failure(exc))
            return
        self.scored.emit(request_id, result)


class WorkerHost(QObject):
    """Creates the worker, moves it to a QThread, and shuts it down in order: stop, quit, wait."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("nanoscope-model")
        self.worker = ModelWorker()
        self.worker.moveToThread(self.thread)
        self.thread.start()

    def generate(self, request_id: int, messages: list, params: dict) -> None:
        """Queue a generation; a stop pressed before this call does not leak into it."""
        self.worker.cancel.clear()
        self.worker.generate_requested.emit(request_id, messages, params)

    def generate_detailed(self, request_id: int, messages: list, params: dict, options: dict) -> None:
        """Queue a Compare-view generation (see ``ModelWorker._on_generate_detailed``)."""
        self.worker.cancel.clear()
        self.worker.generate_detailed_requested.emit(request_id, messages, params, options)

    def score(
        self,
        request_id: int,
        messages: list,
        reply_ids: list[int],
        top: int = 0,
        skip: list[bool] | None = None,
    ) -> None:
        """Queue a teacher-forced score of ``reply_ids`` as the reply to ``messages``."""
        options = {"top": top, "skip": list(skip) if skip is not None else None}
        self.worker.score_requested.emit(request_id, messages, list(reply_ids), options)

    def load(self, path: str, options: dict) -> None:
        self.worker.load_requested.emit(path, options)

    def unload(self) -> None:
        """Free the loaded model (after the request in progress, if any)."""
        self.worker.unload_requested.emit()

    def stop(self) -> None:
        """Ask the running generation (if any) to end after the current token."""
        self.worker.cancel.set()

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        self.stop()
        self.worker.unload_requested.emit()
        self.thread.quit()
        ok = self.thread.wait(timeout_ms)
        return bool(ok)
