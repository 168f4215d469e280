"""The model worker: one long-lived QObject per loaded model, living on its own QThread.

Requests arrive through queued signals; tokens, progress, errors and completion leave through
signals. torch is imported on the worker thread only (the first load), so the window appears at
once. Stop is a ``threading.Event`` set directly from the GUI thread and checked between tokens:
a queued "stop" slot would wait behind the running generation.
"""

from __future__ import annotations

import threading
import traceback
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
    """

    progress = Signal(int, str)
    loaded = Signal(dict)
    load_failed = Signal(str)
    context = Signal(int, dict)
    token = Signal(int, object)
    finished = Signal(int, dict)
    failed = Signal(int, str)

    # Requests (connected with queued connections by WorkerHost).
    load_requested = Signal(str, dict)
    generate_requested = Signal(int, object, object)
    unload_requested = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.cancel = threading.Event()
        self.session: Any = None
        self.load_requested.connect(self._on_load)
        self.generate_requested.connect(self._on_generate)
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
            rendered = self.session.render(messages, sp.max_tokens or 256)
            self.context.emit(
                request_id,
                {
                    "prompt_tokens": len(rendered.ids),
                    "sequence_len": self.session.loaded.config.sequence_len,
                    "dropped_turns": rendered.dropped_turns,
                    "truncated": rendered.truncated,
                },
            )
            for ev in self.session.generate(rendered.ids, sp, cancel=self.cancel, stats=stats):
                self.token.emit(request_id, ev)
        except Exception as exc:
            self.failed.emit(request_id, describe_failure(exc))
            traceback.print_exc()
            return
        self.finished.emit(request_id, stats.to_dict())


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

    def load(self, path: str, options: dict) -> None:
        self.worker.load_requested.emit(path, options)

    def stop(self) -> None:
        """Ask the running generation (if any) to end after the current token."""
        self.worker.cancel.set()

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        self.stop()
        self.worker.unload_requested.emit()
        self.thread.quit()
        ok = self.thread.wait(timeout_ms)
        return bool(ok)
