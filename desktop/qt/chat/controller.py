"""The Chat screen's Qt adapter: between the widgets, the model slot and the history store (GUI
thread only).

The conversation's state and rules live in the Qt-free
:class:`~desktop.session.conversation.ConversationSession` (``self.session``): the path with its
versions, the streaming reply with its kept start, the context used and the reply's speed. This
object makes the store calls and the model requests, feeds their results to the session, and
passes the session's events on as Qt signals, which MainWindow wires to the widgets.
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
from desktop.qt.chat.inside_task import ChatInside
from desktop.qt.model.slot import ModelSlot
from desktop.session.compare.pane_run import Fork, fork_of
from desktop.session.conversation import ConversationSession, continuation, refork, reply_message
from desktop.session.following import Following
from desktop.session.waiting import HeldMessage, ModelWait, target_name
from desktop.store import HistoryStore, StreamingWriter
from desktop.store.export import to_json, to_markdown

TITLE_CHARS = 48
# Alternatives each Chat token keeps (the probability popup lists them; a fork picks one).
CHAT_TOP = 5
CONTEXT_FULL = "Context full"  # the titles of the notices about the conversation's context
TRUNCATED = "Message truncated"
ONE_WAITS = "a message already waits for the model (Stop or Esc gives it back); yours stays in the box"


class ChatController(QObject):
    """The Chat screen's model slot and store calls around its :class:`ConversationSession`.

    Signals:
        conversation_changed(list, list): messages on the active branch, and per message
            (index among siblings, sibling count).
        conversations_listed(list): ConversationRow list for the sidebar.
        reply_started(object, object): the reply Message about to stream (the view renders this
            very object as it grows) and its place among its siblings (index, count).
        reply_event(object): a TokenEvent just added to that Message.
        reply_finished(dict): stats of the finished (or stopped) reply.
        speed_changed(float, float): the streaming reply's decode tok/s and time to its first
            token (ms), as measured while it streams (a few times a second).
        busy_changed(bool): generation started or ended.
        model_loading(int, str), model_loaded(object), model_load_failed(str, str): load progress,
            the ModelInfo, and (what was loading, reason).
        context_changed(int, int): tokens the conversation shown uses, context length (0 with no
            model): on every reply's prompt and token, and when another conversation is shown.
        notice(str, str, str): level ("error" | "warning" | "info"), title, message.
        notice_withdrawn(str): the notice with this title is no longer true (a chat that fits).
        waiting_changed(str, str, int): the message waiting for the model ("" none), what it
            waits for, and the load's percentage; message_returned(str, str): one given back
            (load failed, no model, Stop) with its prefill, for the input box.
    """

    conversation_changed = Signal(list, list)
    conversations_listed = Signal(list)
    reply_started = Signal(object, object)
    reply_event = Signal(object)
    reply_finished = Signal(dict)
    speed_changed = Signal(float, float)
    busy_changed = Signal(bool)
    model_loading = Signal(int, str)
    model_loaded = Signal(object)
    model_load_failed = Signal(str, str)
    context_changed = Signal(int, int)
    notice = Signal(str, str, str)
    notice_withdrawn = Signal(str)
    waiting_changed = Signal(str, str, int)
    message_returned = Signal(str, str)

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
        self.session = ConversationSession(store)
        self._writer: StreamingWriter | None = None
        events = self.session.events
        events.changed.connect(self.conversation_changed.emit)
        events.reply_started.connect(self.reply_started.emit)
        events.reply_token.connect(self._on_reply_token)
        events.reply_finished.connect(self._on_reply_finished)
        events.context.connect(self.context_changed.emit)
        events.speed.connect(self.speed_changed.emit)
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(1000)  # a stalled stream still reaches disk within a second
        self._flush_timer.timeout.connect(self._flush)
        # "Latest of this run": new steps of the loaded run are announced, and followed if asked.
        self.following = Following()
        # A message sent before the model is ready waits for it (desktop.session.waiting).
        self.waiting = ModelWait()
        self.waiting.events.changed.connect(self._on_waiting_changed)
        self._wait_timer = QTimer(self)
        self._wait_timer.setInterval(1000)  # the time waited moves while nothing else does
        self._wait_timer.timeout.connect(self._on_waiting_changed)
        s = self.slot
        s.loading.connect(self.waiting.progress)
        s.loading.connect(self.model_loading)
        s.loaded.connect(self._on_loaded)
        s.load_failed.connect(self._on_load_failed)
        s.notice.connect(self.notice)
        s.context.connect(self._on_context)
        s.token.connect(self._on_token)
        s.finished.connect(self._on_finished)
        s.failed.connect(self._on_failed)
        # Inside (#45): the replies' Inside views, from the model's own thread or history.
        self.inside = ChatInside(store, self.slot, self.session, self)

    # ----- model -----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.session.streaming

    @property
    def conv_id(self) -> int | None:
        return self.session.conv_id

    @property
    def path(self) -> list[tuple[int, Message]]:
        """(stored id, message) of the conversation shown, on its active branch."""
        return self.session.path

    @property
    def model_info(self) -> ModelInfo | None:
        return self.slot.info

    @Slot(Path, int)
    def load_checkpoint(self, path: Path, step: int | None, config: Path | None = None) -> None:
        """Load a checkpoint; a reply in flight is stopped first (the worker ends it, then loads).
        ``config``: a KempnerForge run's training TOML, when the user picked one."""
        self.waiting.loading(target_name(Path(path), step))
        self.slot.load(path, step, config)

    def looking_for_model(self) -> None:
        """The first scan started: a message sent now waits for the model it will load."""
        self.waiting.looking()

    def no_model(self) -> None:
        """The first scan found nothing to load: a waiting message goes back to the box."""
        self._give_back(self.waiting.failed())

    def follow(self, on: bool) -> None:
        """Follow the loaded run's latest step (the Step list's "Latest"), or stay on this one."""
        self.following.follow(on)

    def runs_listed(self, entries: list) -> None:
        """A scan listed the runs: a newer step of the loaded run is announced once, and a chat
        that follows loads it now, or when the reply streaming ends (never in its middle)."""
        landing = self.following.listed(
            ((e.path, e.steps) for e in entries if e.source != "remote"), self.busy
        )
        if landing is None:
            return
        self.notice.emit("info", *landing.notice("This chat", "the Step list"))
        if landing.load_now:
            self.load_checkpoint(landing.folder, landing.step)

    def _on_loaded(self, info: ModelInfo) -> None:
        self.inside.model_changed()
        self.following.loaded(Path(info.path), info.step)
        if not is_demo(Path(info.path)):
            last = {"dir": info.path, "step": info.step, "follow": self.following.on}
            self.settings.set("last_checkpoint", last)
        self.session.set_context_length(info.context_length)
        held = self.waiting.arrived()  # first: a send from a model_loaded handler goes straight on
        self.model_loaded.emit(info)
        if held is not None and self.busy:  # that handler (or a regeneration meanwhile) went first
            self._give_back(held)
        elif held is not None:
            self._answer(held)

    def _on_load_failed(self, target: str, reason: str) -> None:
        self.model_load_failed.emit(target, reason)
        held = self.waiting.failed()
        # The folder's name in the title (the reason names the file in full, and elides last).
        back = reason + ("; your message is back in the box" if held is not None else "")
        self.notice.emit("error", f"Could not load {Path(target).name or target}", back)
        self._give_back(held)

    def _give_back(self, held: HeldMessage | None) -> None:
        if held is not None:
            self.message_returned.emit(held.text, held.prefill)

    def _on_waiting_changed(self) -> None:
        held = self.waiting.held
        if held is None:
            self._wait_timer.stop()
        elif not self._wait_timer.isActive():
            self._wait_timer.start()
        self.waiting_changed.emit(held.text if held else "", self.waiting.line(), self.waiting.percent)

    # ----- conversations ---------------------------------------------------------------------

    def refresh_list(self) -> None:
        self.conversations_listed.emit(self.store.list_conversations(limit=500))

    @Slot()
    def new_chat(self) -> None:
        self._leave_reply()
        self._withdraw_context_notices()
        self.session.new()

    @Slot(int)
    def open_conversation(self, conv_id: int) -> None:
        self._leave_reply()
        self._withdraw_context_notices()
        self.session.open(conv_id)

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

    def context_usage(self) -> tuple[int, int]:
        """(tokens, context length) of the conversation shown (with the reply streaming into
        it); the length is 0 with no model loaded."""
        return self.session.context_used()

    def _withdraw_context_notices(self) -> None:
        """The context notices were about the conversation that was shown."""
        self.notice_withdrawn.emit(CONTEXT_FULL)
        self.notice_withdrawn.emit(TRUNCATED)

    # ----- sending ---------------------------------------------------------------------------

    def send(self, text: str, params: SamplingParams, system_prompt: str = "", prefill: str = "") -> bool:
        """Append a user message and stream the model's reply; False (nothing changed) if refused.
        ``prefill``: the start of the reply, written by the user; the model continues it. While
        a model is looked for or loads, the message waits for it (``self.waiting``)."""
        text = text.strip()
        if not text or self.busy:
            return False
        if self.waiting.coming:
            if self.waiting.hold(HeldMessage(text, params, system_prompt, prefill)):
                return True
            self.notice.emit("info", "Not sent yet", ONE_WAITS)
            return False
        if self.slot.info is None:
            self.notice.emit("warning", "No model loaded", "pick a checkpoint and press Load first")
            return False
        self._answer(HeldMessage(text, params, system_prompt, prefill))
        return True

    def _answer(self, m: HeldMessage) -> None:
        session = self.session
        if session.conv_id is None:
            session.conv_id = self.store.create_conversation(m.text[:TITLE_CHARS].splitlines()[0] or "Chat")
        parent = self.path[-1][0] if self.path else None
        user = Message.of_text("user", m.text)
        session.add(self.store.add_message(session.conv_id, user, parent), user)
        start = ReplyStart(given_text=m.prefill) if m.prefill else None
        where = {"at": 0, "prefill": True} if m.prefill else None
        self._start_reply(m.params, m.system_prompt, start, [], where)
        self.refresh_list()

    @Slot(int, object)
    def regenerate(self, index: int, params: SamplingParams, system_prompt: str = "") -> None:
        """A new sibling for the assistant message at ``index`` (the old one stays reachable)."""
        if self.busy or not 0 <= index < len(self.path) or self.path[index][1].role != "assistant":
            return
        if self.slot.info is None:
            self.notice.emit("warning", "No model loaded", "pick a checkpoint and press Load first")
            return
        reply_id, reply = self.path[index]
        self.session.cut(index)
        again = refork(reply_id, reply)
        if again is None:
            self._start_reply(params, system_prompt)
        else:  # a fork regenerates from its fork point, keeping the user's choice there
            start, where = again
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
        self.session.cut(index)
        self.session.add(msg_id, user)
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
        self.session.cut(index)
        self._start_reply(params, system_prompt, fork.start, list(fork.said), where)
        return True

    def continue_reply(self, index: int, params: SamplingParams, system_prompt: str = "") -> bool:
        """A new sibling of the reply at ``index`` that says all of it and goes on (a reply that
        stopped at its token limit, or was stopped); the original stays one arrow away."""
        reply = self._assistant_at(index)
        if reply is None or not len(reply.tokens):
            return False
        start, said, where = continuation(self.path[index][0], reply)
        self.session.cut(index)
        self._start_reply(params, system_prompt, start, said, where)
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
        self.session.switch_branch(index, direction)

    def _start_reply(
        self,
        params: SamplingParams,
        system_prompt: str,
        start: ReplyStart | None = None,
        said: list[TokenEvent] | None = None,
        fork: dict[str, Any] | None = None,
    ) -> None:
        """Stream a reply after ``self.path``. A fork or continuation passes its ``start``, the
        events of what the reply already said (the session keeps them as the reply's start while
        it streams) and where it forked (kept in the reply's meta, so the marker survives a
        restart)."""
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
        if system_prompt.strip():  # the reply's Inside view renders its prompt again with it
            meta["system_prompt"] = system_prompt
        caps, chosen = self.slot.info.capabilities, self.settings.get("draft")
        if chosen and (why := caps.why_not("draft")):  # the footer says which draft, or why none
            meta["draft_skipped"] = f"draft not used: {why}"
        elif chosen:
            meta["draft"] = chosen
        reply = reply_message(meta, said or ())
        parent = self.path[-1][0] if self.path else None
        reply_id = self.store.add_message(self.conv_id, reply, parent, complete=False)
        self._writer = StreamingWriter(self.store, reply_id)
        self.session.begin_reply(reply_id, reply)
        self.busy_changed.emit(True)
        self._flush_timer.start()
        top = CHAT_TOP if caps.logprobs else 0
        draft = str(meta.get("draft", ""))
        options = StreamOptions(logprobs=top, start=start, draft=draft, draft_k=self.settings.get("draft_k"))
        self.slot.generate(history, params, options)

    @Slot()
    def stop(self) -> None:
        """Stop the reply, or the wait of a message for the model (it goes back to the box)."""
        held = self.waiting.cancel()
        if held is not None:
            self._give_back(held)
            return
        self.slot.stop()

    def _leave_reply(self) -> None:
        """The user leaves the conversation a reply is streaming into: stop it and save it as it
        stands, in its own conversation. Its last tokens, still on their way, are dropped. A
        message waiting for the model goes back to the box (it was meant for this one)."""
        self._give_back(self.waiting.cancel())
        reply = self.session.reply
        if reply is None:
            return
        self.slot.stop()
        stats = {"stopped": "cancelled", "new_tokens": len(reply.tokens)}
        self._save_reply(stats)
        self.session.finish_reply(stats, into_path=False)

    # ----- worker results --------------------------------------------------------------------

    def _on_context(self, prompt: Prompt) -> None:
        self.session.set_prompt(prompt.tokens, prompt.context_length)
        if prompt.ids is not None and self.session.reply is not None and self.session.reply_id is not None:
            self.session.reply.meta["prompt_digest"] = prompt.digest()
            self.inside.prompt_seen(self.session.reply_id, prompt.ids)
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
        self.session.add_token(ev)

    def _on_reply_token(self, ev: TokenEvent) -> None:
        if self._writer is not None and self.session.reply is not None:
            self._writer.update(self.session.reply)
        self.reply_event.emit(ev)

    def _on_finished(self, stats: dict) -> None:
        reply_id = self.session.reply_id
        if self.session.reply is None or reply_id is None:
            return
        self._save_reply(stats)
        self.session.finish_reply(stats)
        self.inside.reply_done(reply_id)

    def _on_failed(self, reason: str) -> None:
        if self.session.reply is None:
            return
        self.session.reply.meta["error"] = reason
        self._save_reply()
        self.session.fail_reply(reason)
        self.notice.emit("error", "Generation failed", reason)

    def _save_reply(self, stats: dict | None = None) -> None:
        """Write the reply as it ended (with its ``stats``) before the session lets go of it."""
        reply = self.session.reply
        assert reply is not None
        if stats is not None:
            reply.meta["stats"] = stats
        if self._writer is not None:
            self._writer.finish(reply)
        self._writer = None

    def _on_reply_finished(self, outcome: dict) -> None:
        self._flush_timer.stop()
        self.busy_changed.emit(False)
        self.refresh_list()
        if self.store.last_error:
            self.notice.emit("warning", "History not saved yet", self.store.last_error)
        self.reply_finished.emit(outcome)
        folder, step = self.following.folder, self.following.reply_ended()
        if folder is not None and step is not None and not self.busy:
            self.load_checkpoint(folder, step)  # the step that landed during the reply

    def _flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def shutdown(self) -> None:
        """Stop, quit, wait; then save what is pending."""
        self._flush_timer.stop()
        if self._writer is not None and self.session.reply is not None:
            self._writer.flush()
        self.slot.shutdown()
