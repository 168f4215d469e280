"""Chat state between the widgets, the model worker and the history store (GUI thread only).

MainWindow wires widgets to this object's slots and signals; this object holds the current
conversation, turns worker tokens into the growing reply, and saves it while it streams.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from . import __version__
from .engine.messages import TEXT, Message, TokenEvent
from .settings import Settings
from .store import HistoryStore, StreamingWriter
from .store.export import to_json, to_markdown
from .worker import WorkerHost

TITLE_CHARS = 48


class ChatController(QObject):
    """Owns the conversation being shown and the generation in flight.

    Signals:
        conversation_changed(list, list): messages on the active branch, and per message
            (index among siblings, sibling count).
        conversations_listed(list): ConversationRow list for the sidebar.
        reply_started(dict): metadata of the reply about to stream.
        reply_event(object): a TokenEvent of the streaming reply.
        reply_finished(dict): stats of the finished (or stopped) reply.
        busy_changed(bool): generation started or ended.
        model_loading(int, str), model_loaded(dict), model_load_failed(str, str): load progress,
            info, and (checkpoint, reason).
        context_changed(int, int): prompt tokens used, sequence_len.
        notice(str, str, str): level ("error" | "warning" | "info"), title, message.
    """

    conversation_changed = Signal(list, list)
    conversations_listed = Signal(list)
    reply_started = Signal(dict)
    reply_event = Signal(object)
    reply_finished = Signal(dict)
    busy_changed = Signal(bool)
    model_loading = Signal(int, str)
    model_loaded = Signal(dict)
    model_load_failed = Signal(str, str)
    context_changed = Signal(int, int)
    notice = Signal(str, str, str)

    def __init__(
        self,
        store: HistoryStore,
        settings: Settings,
        host: WorkerHost | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.host = host or WorkerHost(self)
        self.conv_id: int | None = None
        self.path: list[tuple[int, Message]] = []
        self.model_info: dict[str, Any] | None = None
        self.loading_path: str | None = None
        self._request = 0
        self._reply: Message | None = None
        self._reply_id: int | None = None
        self._writer: StreamingWriter | None = None
        self._params: dict[str, Any] = {}
        self._pending_send: tuple[list, dict] | None = None
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(1000)  # a stalled stream still reaches disk within a second
        self._flush_timer.timeout.connect(self._flush)
        w = self.host.worker
        w.progress.connect(self.model_loading)
        w.loaded.connect(self._on_loaded)
        w.load_failed.connect(self._on_load_failed)
        w.context.connect(self._on_context)
        w.token.connect(self._on_token)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)

    # ----- model -----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._reply is not None

    @Slot(Path, int)
    def load_checkpoint(self, path: Path, step: int) -> None:
        """Load a checkpoint; a generation in flight is stopped first (the worker finishes it, then loads)."""
        if self.busy:
            self.stop()
        self.loading_path = str(path)
        options = {"step": step, "device": self.settings.get("device"), "dtype": self.settings.get("dtype")}
        self.model_loading.emit(0, f"loading {Path(path).name} step {step}")
        self.host.load(str(path), options)

    def _on_loaded(self, info: dict) -> None:
        from .app import demo_checkpoint

        demo = demo_checkpoint()
        info["demo"] = demo is not None and Path(info["path"]) == demo
        self.model_info = info
        self.loading_path = None
        if not info["demo"]:
            self.settings.set("last_checkpoint", {"dir": info["path"], "step": info["step"]})
        self.model_loaded.emit(info)
        for w in info.get("warnings", []):
            self.notice.emit("warning", "Checkpoint warning", w)

    def _on_load_failed(self, reason: str) -> None:
        path = self.loading_path or "checkpoint"
        self.loading_path = None
        self.model_load_failed.emit(path, reason)
        self.notice.emit("error", f"Could not load {path}", reason)

    # ----- conversations ---------------------------------------------------------------------

    def refresh_list(self) -> None:
        self.conversations_listed.emit(self.store.list_conversations(limit=500))

    @Slot()
    def new_chat(self) -> None:
        if self.busy:
            self.stop()
        self.conv_id = None
        self.path = []
        self._emit_conversation()

    @Slot(int)
    def open_conversation(self, conv_id: int) -> None:
        if self.busy:
            self.stop()
        self.conv_id = conv_id
        self.path = self.store.active_path(conv_id)
        self._emit_conversation()

    @Slot(int, str)
    def rename(self, conv_id: int, title: str) -> None:
        self.store.rename(conv_id, title.strip() or "Untitled")
        self.refresh_list()

    @Slot(int)
    def delete(self, conv_id: int) -> None:
        self.store.delete(conv_id)
        if conv_id == self.conv_id:
            self.new_chat()
        self.refresh_list()

    @Slot(int)
    def undelete(self, conv_id: int) -> None:
        self.store.undelete(conv_id)
        self.refresh_list()

    def export(self, conv_id: int, fmt: str, target: Path) -> None:
        rows = {r.id: r for r in self.store.list_conversations(limit=100000)}
        title = rows[conv_id].title if conv_id in rows else "conversation"
        messages = [m for _, m in self.store.active_path(conv_id)]
        text = (
            to_markdown(title, messages)
            if fmt == "md"
            else to_json(title, messages, self.store.conversation_meta(conv_id))
        )
        target.write_text(text, encoding="utf-8")
        self.notice.emit("info", "Exported", f"saved {target}")

    def _emit_conversation(self) -> None:
        siblings = []
        for msg_id, _ in self.path:
            sib = self.store.siblings(msg_id)
            siblings.append((sib.index(msg_id) if msg_id in sib else 0, len(sib)))
        self.conversation_changed.emit([m for _, m in self.path], siblings)

    # ----- sending ---------------------------------------------------------------------------

    def send(self, text: str, params: dict) -> bool:
        """Append a user message and stream the model's reply; False (nothing changed) if refused."""
        text = text.strip()
        if not text or self.busy:
            return False
        if self.model_info is None:
            self.notice.emit("warning", "No model loaded", "pick a checkpoint and press Load first")
            return False
        if self.conv_id is None:
            self.conv_id = self.store.create_conversation(text[:TITLE_CHARS].splitlines()[0] or "Chat")
        parent = self.path[-1][0] if self.path else None
        user = Message.of_text("user", text)
        msg_id = self.store.add_message(self.conv_id, user, parent)
        self.path.append((msg_id, user))
        self._start_reply(params)
        self.refresh_list()
        return True

    def token_text(self, token_id: int) -> str:
        """How a token reads in the raw view (special tokens by name)."""
        session = self.host.worker.session
        if session is None or token_id < 0:
            return ""
        return session.tok.special_name(token_id) or session.tok.decode([token_id])

    @Slot(int, dict)
    def regenerate(self, index: int, params: dict) -> None:
        """A new sibling for the assistant message at ``index`` (the old one stays reachable)."""
        if self.busy or not 0 <= index < len(self.path) or self.path[index][1].role != "assistant":
            return
        self.path = self.path[:index]
        self._start_reply(params)

    @Slot(int, str, dict)
    def edit_and_resend(self, index: int, new_text: str, params: dict) -> None:
        """Replace the user message at ``index`` by a new sibling and answer it."""
        if self.busy or not 0 <= index < len(self.path) or self.path[index][1].role != "user":
            return
        parent = self.path[index - 1][0] if index > 0 else None
        user = Message.of_text("user", new_text)
        msg_id = self.store.add_message(self.conv_id, user, parent)
        self.path = [*self.path[:index], (msg_id, user)]
        self._start_reply(params)

    @Slot(int, int)
    def switch_branch(self, index: int, direction: int) -> None:
        if self.busy or not 0 <= index < len(self.path):
            return
        sib = self.store.siblings(self.path[index][0])
        pos = sib.index(self.path[index][0]) + direction
        if 0 <= pos < len(sib):
            self.store.select_branch(sib[pos])
            self.path = self.store.active_path(self.conv_id)
            self._emit_conversation()

    def _start_reply(self, params: dict) -> None:
        assert self.conv_id is not None
        params = dict(params)
        history = [copy.deepcopy(m) for _, m in self.path]
        system = params.pop("system_prompt", "") or ""
        if system.strip():
            history.insert(0, Message.of_text("system", system))
        info = self.model_info or {}
        meta = {
            "checkpoint": info.get("path"),
            "step": info.get("step"),
            "era": info.get("era"),
            "tag": Path(info.get("path", "")).name,
            "meta_hash": info.get("meta_hash"),
            "device": info.get("device"),
            "dtype": info.get("dtype"),
            "app_version": __version__,
            "sampling": {
                k: params.get(k)
                for k in (
                    "temperature",
                    "top_k",
                    "top_p",
                    "min_p",
                    "repetition_penalty",
                    "max_tokens",
                    "seed",
                )
            },
            "started": time.time(),
        }
        self._reply = Message("assistant", [], meta)
        parent = self.path[-1][0] if self.path else None
        self._reply_id = self.store.add_message(self.conv_id, self._reply, parent, complete=False)
        self._writer = StreamingWriter(self.store, self._reply_id)
        self._params = params
        self._request += 1
        self._emit_conversation()
        self.reply_started.emit(meta)
        self.busy_changed.emit(True)
        self._flush_timer.start()
        self.host.generate(self._request, history, params)

    @Slot()
    def stop(self) -> None:
        self.host.stop()

    # ----- worker results --------------------------------------------------------------------

    def _on_context(self, request_id: int, ctx: dict) -> None:
        if request_id != self._request:
            return
        self.context_changed.emit(ctx["prompt_tokens"], ctx["sequence_len"])
        if ctx.get("dropped_turns"):
            self.notice.emit(
                "info",
                "Context full",
                f"the oldest {ctx['dropped_turns']} turn(s) were left out to fit the model's context",
            )
        if ctx.get("truncated"):
            self.notice.emit(
                "warning",
                "Message truncated",
                "your message is longer than the model's context; only its end was used",
            )

    def _on_token(self, request_id: int, ev: TokenEvent) -> None:
        if request_id != self._request or self._reply is None:
            return
        if ev.text and (ev.special is None or ev.kind != TEXT):
            self._reply.append(ev.kind, ev.text)
        raw = self._reply.meta.setdefault("raw", [])
        raw.append([ev.id, ev.forced])
        if self._writer is not None:
            self._writer.update(self._reply)
        self.reply_event.emit(ev)

    def _on_finished(self, request_id: int, stats: dict) -> None:
        if request_id != self._request or self._reply is None:
            return
        self._reply.meta["stats"] = stats
        self._finish_reply()
        self.reply_finished.emit(stats)

    def _on_failed(self, request_id: int, reason: str) -> None:
        if request_id != self._request or self._reply is None:
            return
        self._reply.meta["error"] = reason
        self._finish_reply()
        self.reply_finished.emit({"error": reason})
        self.notice.emit("error", "Generation failed", reason)

    def _finish_reply(self) -> None:
        assert self._reply is not None and self._reply_id is not None
        if self._writer is not None:
            self._writer.finish(self._reply)
        self.path.append((self._reply_id, self._reply))
        self._reply, self._reply_id, self._writer = None, None, None
        self._flush_timer.stop()
        self.busy_changed.emit(False)
        self.refresh_list()
        if self.store.last_error:
            self.notice.emit("warning", "History not saved yet", self.store.last_error)

    def _flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def shutdown(self) -> None:
        """Stop, quit, wait; then save what is pending."""
        self._flush_timer.stop()
        if self._writer is not None and self._reply is not None:
            self._writer.flush()
        self.host.shutdown()
        self.settings.save()
