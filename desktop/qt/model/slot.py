"""One loaded model as the GUI thread sees it: a worker thread, what is loaded, what is asked.

The chat and every Compare pane each hold a :class:`ModelSlot`. It builds load options from the
settings, reports progress, turns load warnings into notices, passes on only the events of the
request it is waiting for (a stopped request's late tokens are dropped), and tears its thread
down in order.
"""

from __future__ import annotations

import logging
from pathlib import Path

import shiboken6
from PySide6.QtCore import QObject, Signal, Slot

from desktop.config import paths
from desktop.config.settings import Settings
from desktop.engine.backend import DEFAULT_STREAM, LoadOptions, ModelInfo, Prompt, StreamOptions
from desktop.engine.kempnerforge.config import NO_TOML, ConfigMemory
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.qt.model.worker import Opener, TurnLock, WorkerHost, default_opener

logger = logging.getLogger(__name__)


class ModelSlot(QObject):
    """A worker thread and the model it holds.

    Signals:
        loading(int, str): load progress percentage and what is happening.
        loaded(object): the new ModelInfo.
        load_failed(str, str): what was being loaded, and the one-line reason.
        notice(str, str, str): level ("error" | "warning" | "info"), title, message.
        context(object): the Prompt of the current generation (context use, dropped turns).
        token(object): a TokenEvent of the current generation.
        finished(dict): the current generation's stats (also after a stop).
        failed(str): the current generation failed; one-line reason.
        scored(int, dict): a score request's id and result.
        score_failed(int, str): a score request's id and the reason.
        inside_ready(int, object): an Inside request's id and its
            :class:`~desktop.engine.inside.InsideCache` (``reply_start`` and ``labels`` added).
        inside_failed(int, str): an Inside request's id and the one-line reason.
        config_needed(str, int): a KempnerForge run (and step) has no training TOML beside it;
            load it again with ``config=`` once the user picked one.
    """

    loading = Signal(int, str)
    loaded = Signal(object)
    load_failed = Signal(str, str)
    notice = Signal(str, str, str)
    context = Signal(object)
    token = Signal(object)
    finished = Signal(dict)
    failed = Signal(str)
    scored = Signal(int, dict)
    score_failed = Signal(int, str)
    config_needed = Signal(str, int)
    inside_ready = Signal(int, object)
    inside_failed = Signal(int, str)

    _next_request = 0  # shared by every slot, so ids never repeat across them

    def __init__(
        self,
        settings: Settings,
        parent: QObject | None = None,
        thread_name: str = "nanoscope-model",
        opener: Opener = default_opener,
    ) -> None:
        super().__init__(parent)
        self.settings = settings
        self.host = WorkerHost(self, thread_name, opener)
        self.info: ModelInfo | None = None
        self.loading_target: tuple[Path, int | None] | None = None
        self._configs = ConfigMemory(paths.kempnerforge_configs_file())
        self._new_config: Path | None = None  # a TOML the user picked, remembered once it loads
        self.request: int | None = None  # the generation in flight
        self._scores: set[int] = set()
        self._insides: set[int] = set()
        self.inside_passes = 0  # Inside passes asked of this slot's model (each one full pass)
        self._closed = False
        w = self.host.worker
        w.progress.connect(self.loading)
        w.loaded.connect(self._on_loaded)
        w.load_failed.connect(self._on_load_failed)
        w.context.connect(self._on_context)
        w.token.connect(self._on_token)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.scored.connect(self._on_scored)
        w.inside_ready.connect(self._on_inside_ready)
        w.inside_failed.connect(self._on_inside_failed)

    @property
    def busy(self) -> bool:
        """A generation is in flight."""
        return self.request is not None

    @property
    def is_loading(self) -> bool:
        return self.loading_target is not None

    @classmethod
    def _new_id(cls) -> int:
        ModelSlot._next_request += 1
        return ModelSlot._next_request

    # ----- requests ---------------------------------------------------------------------------

    def load(self, path: Path, step: int | None, config: Path | None = None) -> None:
        """Load a model; a generation in flight is stopped first (the worker ends it, then loads).

        ``config`` is a KempnerForge run's training TOML the user chose; without it, the one
        chosen for this run before is used (a TOML beside the run needs neither).
        """
        if self.busy:
            self.stop()
        self.loading_target = (Path(path), step)
        self._new_config = config
        options = LoadOptions(
            step=step,
            device=self.settings.get("device"),
            dtype=self.settings.get("dtype"),
            base_dir=paths.nanochat_base_dir(),
            config=config or self._configs.get(Path(path)),
            kernel_cache=paths.kernel_timings_file(),
            compile_drafts=self.settings.get("compile_drafts"),
        )
        where = f"{Path(path).name} step {step}" if step is not None else Path(path).name
        self.loading.emit(0, f"loading {where}")
        self.host.load(str(path), options)

    def unload(self) -> None:
        self.stop()
        self.info = None
        self.host.unload()

    def generate(
        self,
        conversation: list[Message],
        params: SamplingParams,
        options: StreamOptions = DEFAULT_STREAM,
        step_lock: TurnLock | None = None,
    ) -> int:
        """Start a generation; its events come through ``context``/``token``/``finished``/``failed``."""
        self.request = self._new_id()
        self.host.generate(self.request, [m.copy_text() for m in conversation], params, options, step_lock)
        return self.request

    def score(
        self, conversation: list[Message], reply_ids: list[int], top: int = 0, skip: list[bool] | None = None
    ) -> int:
        """Score a reply under this model; the result comes through ``scored`` with the returned id."""
        request = self._new_id()
        self._scores.add(request)
        self.host.score(request, [m.copy_text() for m in conversation], reply_ids, top, skip)
        return request

    def inside(self, ids: list[int], reply_start: int | None = None) -> int:
        """One hooked pass over ``ids`` on the model's thread, after the request in progress; the
        cache comes through ``inside_ready`` (or ``inside_failed``) with the returned id. Its
        ``reply_start`` is ``reply_start`` (None: the end of ``ids``)."""
        request = self._new_inside()
        self.host.inside(request, ids, -1 if reply_start is None else reply_start)
        return request

    def prepare_inside(self, ids: list[int], reply_start: int) -> int:
        """As :meth:`inside`, for a pass nobody waits for yet: it gives way to any request sent
        after it (``inside_failed`` then says so) and keeps at most a quarter of the free RAM."""
        request = self._new_inside()
        self.host.prepare_inside(request, ids, reply_start)
        return request

    def reply_inside(
        self, conversation: list[Message], reply_ids: list[int], reserve: int = 0, digest: str | None = None
    ) -> int:
        """As :meth:`inside`, over ``conversation`` rendered as the prompt (``reserve`` tokens kept
        for the reply, as its generation asked; 0: the reply's length) and then ``reply_ids``
        (the cache's ``reply_start`` says where the reply begins). ``digest``: the prompt's
        :meth:`~desktop.engine.backend.Prompt.digest` when the reply was written; a prompt that
        renders otherwise now fails in one line."""
        request = self._new_inside()
        self.host.reply_inside(request, [m.copy_text() for m in conversation], reply_ids, reserve, digest)
        return request

    def _new_inside(self) -> int:
        request = self._new_id()
        self._insides.add(request)
        self.inside_passes += 1
        return request

    def stop(self) -> None:
        """End the generation in flight after its current token (its ``finished`` still comes)."""
        self.host.stop()

    def shutdown(self) -> None:
        """Stop, quit, wait; then delete the worker here, on the GUI thread (idempotent).

        Left to Python, the worker could be freed by the cyclic garbage collector on whatever
        thread happens to run it, and a QObject must not be deleted from a random thread.
        """
        if self._closed:
            return
        self._closed = True
        if self.host.shutdown():
            shiboken6.delete(self.host.worker)
        else:
            logger.error("the model thread did not stop in time; the process will end without it")

    # ----- worker events ----------------------------------------------------------------------

    @Slot(object)
    def _on_loaded(self, info: ModelInfo) -> None:
        if self._new_config is not None and info.family == "kempnerforge":
            self._configs.remember(Path(info.path), self._new_config)
        self._new_config = None
        self.info = info
        self.loading_target = None
        self.loaded.emit(info)
        for warning in info.warnings:
            self.notice.emit("warning", "Checkpoint warning", warning)

    @Slot(str)
    def _on_load_failed(self, reason: str) -> None:
        target = self.loading_target
        self.loading_target = None
        self._new_config = None
        self.load_failed.emit(str(target[0]) if target else "model", reason)
        if target is not None and NO_TOML in reason:
            self.config_needed.emit(str(target[0]), target[1] if target[1] is not None else -1)

    @Slot(int, object)
    def _on_context(self, request_id: int, prompt: Prompt) -> None:
        if request_id == self.request:
            self.context.emit(prompt)

    @Slot(int, object)
    def _on_token(self, request_id: int, ev: TokenEvent) -> None:
        if request_id == self.request:
            self.token.emit(ev)

    @Slot(int, dict)
    def _on_finished(self, request_id: int, stats: dict) -> None:
        if request_id == self.request:
            self.request = None
            self.finished.emit(stats)

    @Slot(int, str)
    def _on_failed(self, request_id: int, reason: str) -> None:
        if request_id in self._scores:
            self._scores.discard(request_id)
            self.score_failed.emit(request_id, reason)
        elif request_id == self.request:
            self.request = None
            self.failed.emit(reason)

    @Slot(int, dict)
    def _on_scored(self, request_id: int, result: dict) -> None:
        if request_id in self._scores:
            self._scores.discard(request_id)
            self.scored.emit(request_id, result)

    @Slot(int, object)
    def _on_inside_ready(self, request_id: int, cache: object) -> None:
        if request_id in self._insides:
            self._insides.discard(request_id)
            self.inside_ready.emit(request_id, cache)

    @Slot(int, str)
    def _on_inside_failed(self, request_id: int, reason: str) -> None:
        if request_id in self._insides:
            self._insides.discard(request_id)
            self.inside_failed.emit(request_id, reason)
