"""Chat state between the widgets, the model slot and the history store (GUI thread only).

MainWindow wires widgets to this object's slots and signals; this object holds the current
conversation and owns the streaming reply: each token event goes into the reply's
:class:`~desktop.engine.messages.Message` (``add_event``), which the view renders and the store
saves while it streams.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from desktop import __version__
from desktop.config.paths import is_demo
from desktop.config.settings import Settings
from desktop.engine.backend import ModelInfo, Prompt, ReplyStart, StreamOptions
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.qt.model.slot import ModelSlot
from desktop.session.compare.pane_run import Fork, fork_of
from desktop.store import HistoryStore, StreamingWriter
from desktop.store.export import to_json, to_markdown

TITLE_CHARS = 48
# Alternatives each Chat token keeps (the probability popup lists them; a fork picks one).
CHAT_TOP = 5
CONTEXT_FULL = "Context full"  # the titles of the notices about the conversation's context
TRUNCATED = "Message truncated"


class ChatController(QObject):
    """Owns the conversation being shown and the reply in flight.

    Signals:
        conversation_changed(list, list): messages on the active branch, and per message
            (index among siblings, sibling count).
        conversations_listed(list): ConversationRow list for the sidebar.
        reply_started(object, object): the reply Message about to stream (the view renders this
            very object as it grows) and its place among its siblings (index, count).
        reply_event(object): a TokenEvent just added to that Message.
        reply_finished(dict): stats of the finished (or stopped) reply.
        busy_changed(bool): generation started or ended.
        model_loading(int, str), model_loaded(object), model_load_failed(str, str): load progress,
            the ModelInfo, and (what was loading, reason).
        context_changed(int, int): tokens the conversation shown uses, context length (0 with no
            model): on every reply's prompt, and when another conversation is shown.
        notice(str, str, str): level ("error" | "warning" | "info"), title, message.
        notice_withdrawn(str): the notice with this title is no longer true (a chat that fits).
    """

    conversation_changed = Signal(list, list)
    conversations_listed = Signal(list)
    reply_started = Signal(object, object)
    reply_event = Signal(object)
    reply_finished = Signal(dict)
    busy_changed = Signal(bool)
    model_loading = Signal(int, str)
    model_loaded = Signal(object)
    model_load_failed = Signal(str, str)
    context_changed = Signal(int, int)
    notice = Signal(str, str, str)
    notice_withdrawn = Signal(str)

    def __init__(
        self,
        store: HistoryStore,
        settings: Settings,
        slot: ModelSlot | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.slot = slot or ModelSlot(settings, self)
        self.conv_id: int | None = None
        self.path: list[tuple[int, Message]] = []
        self._reply: Message | None = None
        self._reply_id: int | None = None
        self._writer: StreamingWriter | None = None
        self._last_stats: dict[str, Any] = {}
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(1000)  # a stalled stream still reaches disk within a second
        self._flush_timer.timeout.connect(self._flush)
        s = self.slot
        s.loading.connect(self.model_loading)
        s.loaded.connect(self._on_loaded)
        s.load_failed.connect(self._on_load_failed)
        s.notice.connect(self.notice)
        s.context.connect(self._on_context)
        s.token.connect(self._on_token)
        s.finished.connect(self._on_finished)
        s.failed.connect(self._on_failed)

    # ----- model -----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._reply is not None

    @property
    def model_info(self) -> ModelInfo | None:
        return self.slot.info

    @Slot(Path, int)
    def load_checkpoint(self, path: Path, step: int | None, config: Path | None = None) -> None:
        """Load a checkpoint; a reply in flight is stopped first (the worker ends it, then loads).
        ``config``: a KempnerForge run's training TOML, when the user picked one."""
        self.slot.load(path, step, config)

    def _on_loaded(self, info: ModelInfo) -> None:
        if not is_demo(Path(info.path)):
            self.settings.set("last_checkpoint", {"dir": info.path, "step": info.step})
        self.model_loaded.emit(info)

    def _on_load_failed(self, target: str, reason: str) -> None:
        self.model_load_failed.emit(target, reason)
        # The folder's name in the title (the reason names the file in full, and elides last).
        self.notice.emit("error", f"Could not load {Path(target).name or target}", reason)

    # ----- conversations ---------------------------------------------------------------------

    def refresh_list(self) -> None:
        self.conversations_listed.emit(self.store.list_conversations(limit=500))

    @Slot()
    def new_chat(self) -> None:
        self._leave_reply()
        self.conv_id = None
        self.path = []
        self._withdraw_context_notices()
        self._emit_conversation()

    @Slot(int)
    def open_conversation(self, conv_id: int) -> None:
        self._leave_reply()
        self.conv_id = conv_id
        self.path = self.store.active_path(conv_id)
        self._withdraw_context_notices()
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
        self.context_changed.emit(*self.context_usage())

    def context_usage(self) -> tuple[int, int]:
        """(tokens, context length) of the conversation shown, from its last reply's stats: its
        prompt plus what it generated (0 for a new chat); the length is 0 with no model loaded."""
        used = 0
        for _, message in reversed(self.path):
            stats = message.meta.get("stats") if message.role == "assistant" else None
            if isinstance(stats, dict) and isinstance(stats.get("prompt_tokens"), int):
                used = stats["prompt_tokens"] + int(stats.get("new_tokens") or 0)
                break
        info = self.slot.info
        return used, info.context_length if info is not None else 0

    def _withdraw_context_notices(self) -> None:
        """The context notices were about the conversation that was shown."""
        self.notice_withdrawn.emit(CONTEXT_FULL)
        self.notice_withdrawn.emit(TRUNCATED)

    # ----- sending ---------------------------------------------------------------------------

    def send(self, text: str, params: SamplingParams, system_prompt: str = "", prefill: str = "") -> bool:
        """Append a user message and stream the model's reply; False (nothing changed) if refused.
        ``prefill``: the start of the reply, written by the user; the model continues it."""
        text = text.strip()
        if not text or self.busy:
            return False
        if self.slot.info is None:
            self.notice.emit("warning", "No model loaded", "pick a checkpoint and press Load first")
            return False
        if self.conv_id is None:
            self.conv_id = self.store.create_conversation(text[:TITLE_CHARS].splitlines()[0] or "Chat")
        parent = self.path[-1][0] if self.path else None
        user = Message.of_text("user", text)
        msg_id = self.store.add_message(self.conv_id, user, parent)
        self.path.append((msg_id, user))
        if prefill:
            self._start_reply(
                params, system_prompt, ReplyStart(given_text=prefill), [], {"at": 0, "prefill": True}
            )
        else:
            self._start_reply(params, system_prompt)
        self.refresh_list()
        return True

    @Slot(int, object)
    def regenerate(self, index: int, params: SamplingParams, system_prompt: str = "") -> None:
        """A new sibling for the assistant message at ``index`` (the old one stays reachable)."""
        if self.busy or not 0 <= index < len(self.path) or self.path[index][1].role != "assistant":
            return
        if self.slot.info is None:
            self.notice.emit("warning", "No model loaded", "pick a checkpoint and press Load first")
            return
        reply_id, reply = self.path[index]
        self.path = self.path[:index]
        refork = _refork(reply_id, reply)
        if refork is None:
            self._start_reply(params, system_prompt)
        else:  # a fork regenerates from its fork point, keeping the user's choice there
            start, where = refork
            self._start_reply(params, system_prompt, start, reply.tokens.events(where["at"]), where)

    @Slot(int, str, object)
    def edit_and_resend(
        self, index: int, new_text: str, params: SamplingParams, system_prompt: str = ""
    ) -> None:
        """Replace the user message at ``index`` by a new sibling and answer it."""
        if self.busy or not 0 <= index < len(self.path) or self.path[index][1].role != "user":
            return
        if self.slot.info is None:
            self.notice.emit("warning", "No model loaded", "pick a checkpoint and press Load first")
            return
        assert self.conv_id is not None  # a conversation with messages is a stored one
        parent = self.path[index - 1][0] if index > 0 else None
        user = Message.of_text("user", new_text)
        msg_id = self.store.add_message(self.conv_id, user, parent)
        self.path = [*self.path[:index], (msg_id, user)]
        self._start_reply(params, system_prompt)

    def fork_at(self, index: int, position: int, token_id: int = -1, text: str = "") -> Fork | None:
        """The fork of the reply at ``index`` at token ``position``: what it said up to there,
        then the user's choice (an alternative's ``token_id``, or ``text`` they typed); None
        (and a notice where it helps) when it cannot be made."""
        reply = self._assistant_at(index)
        if reply is None or self.slot.info is None:
            return None
        fork = fork_of(reply.tokens, position, token_id, text, self.slot.info.tokenizer)
        if isinstance(fork, str):
            if fork:
                self.notice.emit("info", "Cannot fork there", fork)
            return None
        return fork

    def fork(
        self,
        index: int,
        position: int,
        params: SamplingParams,
        system_prompt: str = "",
        token_id: int = -1,
        text: str = "",
    ) -> bool:
        """A new sibling of the reply at ``index``: its fork at ``position`` (``fork_at``), then
        whatever the model goes on to say. False (nothing changed) if refused."""
        fork = self.fork_at(index, position, token_id, text)
        if fork is None:
            return False
        where = {"from": self.path[index][0], "at": position}
        self.path = self.path[:index]
        self._start_reply(params, system_prompt, fork.start, list(fork.said), where)
        return True

    def continue_reply(self, index: int, params: SamplingParams, system_prompt: str = "") -> bool:
        """A new sibling of the reply at ``index`` that says all of it and goes on (a reply that
        stopped at its token limit, or was stopped); the original stays one arrow away."""
        reply = self._assistant_at(index)
        if reply is None or not len(reply.tokens):
            return False
        trace = reply.tokens
        said_ids = tuple(trace.ids) if trace.has_ids else ()
        start = ReplyStart(said_ids=said_ids, said_text="".join(trace.texts))
        fork = {"from": self.path[index][0], "at": len(trace), "continued": True}
        self.path = self.path[:index]
        self._start_reply(params, system_prompt, start, trace.events(len(trace)), fork)
        return True

    def _assistant_at(self, index: int) -> Message | None:
        """The finished assistant reply at ``index`` when a new one may start from it."""
        if self.busy or not 0 <= index < len(self.path) or self.path[index][1].role != "assistant":
            return None
        if self.slot.info is None:
            self.notice.emit("warning", "No model loaded", "pick a checkpoint and press Load first")
            return None
        return self.path[index][1]

    @Slot(int, int)
    def switch_branch(self, index: int, direction: int) -> None:
        if self.busy or not 0 <= index < len(self.path):
            return
        sib = self.store.siblings(self.path[index][0])
        pos = sib.index(self.path[index][0]) + direction
        if 0 <= pos < len(sib) and self.conv_id is not None:
            self.store.select_branch(sib[pos])
            self.path = self.store.active_path(self.conv_id)
            self._emit_conversation()

    def _start_reply(
        self,
        params: SamplingParams,
        system_prompt: str,
        start: ReplyStart | None = None,
        said: list[TokenEvent] | None = None,
        fork: dict[str, Any] | None = None,
    ) -> None:
        """Stream a reply after ``self.path``. A fork or continuation passes its ``start``, the
        events of what the reply already said (copied in through the one rule that built them)
        and where it forked (kept in the reply's meta, so the marker survives a restart)."""
        assert self.conv_id is not None and self.slot.info is not None
        history = [m for _, m in self.path]
        if system_prompt.strip():
            history.insert(0, Message.of_text("system", system_prompt))
        meta: dict[str, Any] = {
            **self.slot.info.reply_meta(),
            "app_version": __version__,
            "sampling": params.to_dict(),
            "started": time.time(),
        }
        if fork is not None:
            meta["fork"] = fork
        caps = self.slot.info.capabilities
        if self.settings.get("draft") and not caps.why_not("draft"):
            meta["draft"] = self.settings.get("draft")  # speculative: the footer says so
        self._reply = Message("assistant", [], meta)
        for ev in said or ():
            self._reply.add_event(ev)
        parent = self.path[-1][0] if self.path else None
        self._reply_id = self.store.add_message(self.conv_id, self._reply, parent, complete=False)
        self._writer = StreamingWriter(self.store, self._reply_id)
        self._emit_conversation()
        # A regeneration shows its place among the earlier replies (‹ 3/3 ›) at once.
        siblings = self.store.siblings(self._reply_id)
        self.reply_started.emit(self._reply, (siblings.index(self._reply_id), len(siblings)))
        self.busy_changed.emit(True)
        self._flush_timer.start()
        caps = self.slot.info.capabilities
        top = CHAT_TOP if caps.logprobs else 0
        draft = "" if caps.why_not("draft") else self.settings.get("draft")
        options = StreamOptions(logprobs=top, start=start, draft=draft, draft_k=self.settings.get("draft_k"))
        self.slot.generate(history, params, options)

    @Slot()
    def stop(self) -> None:
        self.slot.stop()

    def _leave_reply(self) -> None:
        """The user leaves the conversation a reply is streaming into: stop it and save it as it
        stands, in its own conversation. Its last tokens, still on their way, are dropped."""
        if self._reply is None:
            return
        self.slot.stop()
        self._reply.meta["stats"] = {"stopped": "cancelled", "new_tokens": len(self._reply.tokens)}
        self._finish_reply(into_path=False)
        self.reply_finished.emit(self._last_stats)

    # ----- worker results --------------------------------------------------------------------

    def _on_context(self, prompt: Prompt) -> None:
        self.context_changed.emit(prompt.tokens, prompt.context_length)
        if prompt.dropped_turns:
            self.notice.emit(
                "info",
                CONTEXT_FULL,
                f"the oldest {prompt.dropped_turns} turn(s) were left out to fit the model's context",
            )
        else:
            self.notice_withdrawn.emit(CONTEXT_FULL)
        if prompt.truncated:
            self.notice.emit(
                "warning",
                TRUNCATED,
                "your message is longer than the model's context; only its end was used",
            )
        else:
            self.notice_withdrawn.emit(TRUNCATED)

    def _on_token(self, ev: TokenEvent) -> None:
        if self._reply is None:
            return
        self._reply.add_event(ev)
        if self._writer is not None:
            self._writer.update(self._reply)
        self.reply_event.emit(ev)

    def _on_finished(self, stats: dict) -> None:
        if self._reply is None:
            return
        self._reply.meta["stats"] = stats
        self._finish_reply()
        self.reply_finished.emit(stats)

    def _on_failed(self, reason: str) -> None:
        if self._reply is None:
            return
        self._reply.meta["error"] = reason
        self._finish_reply()
        self.reply_finished.emit({"error": reason})
        self.notice.emit("error", "Generation failed", reason)

    def _finish_reply(self, into_path: bool = True) -> None:
        assert self._reply is not None and self._reply_id is not None
        self._last_stats = dict(self._reply.meta.get("stats") or {})
        if self._writer is not None:
            self._writer.finish(self._reply)
        if into_path:
            self.path.append((self._reply_id, self._reply))
            self.context_changed.emit(*self.context_usage())  # the prompt and the reply now
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
        self.slot.shutdown()


def _refork(reply_id: int, reply: Message) -> tuple[ReplyStart, dict[str, Any]] | None:
    """How to regenerate a forked (or continued) reply: the same start, a new continuation."""
    fork = reply.meta.get("fork")
    trace = reply.tokens
    if not isinstance(fork, dict):
        return None
    at = fork.get("at")
    if not isinstance(at, int) or not 0 <= at <= len(trace):
        return None
    n = next((k for k, g in enumerate(trace.given[at:]) if not g), len(trace) - at)
    ids = trace.has_ids  # a served reply has text only
    start = ReplyStart(
        said_ids=tuple(trace.ids[:at]) if ids else (),
        said_text="".join(trace.texts[:at]),
        given_ids=tuple(trace.ids[at : at + n]) if ids else (),
        given_text="".join(trace.texts[at : at + n]),
    )
    return start, {**fork, "from": fork.get("from", reply_id)}
