"""The conversation the Chat screen shows, without Qt: its active path of messages with their
versions, the reply streaming after it (with the start it kept, for a fork or a continuation),
how much of the model's context it uses and how fast the reply comes.

:class:`ConversationSession` holds that state and its rules. It reads the stored branches (the
active path, a message's versions, and the choice of version) through :class:`Branches`; the Qt
adapter (``desktop.qt.chat.controller.ChatController``) writes the messages, makes the model
requests and feeds their results in, and the views render what the session's events say:

    changed(messages, places)  the conversation shown was replaced or cut (a reply is about to start)
    reply_started(reply, place)  the reply Message that streams next (views render this object)
    reply_token(ev)            a TokenEvent was just added to that reply
    reply_finished(stats)      the reply ended (its stats, or {"error": ...})
    context(used, total)       tokens the conversation uses, and the context length (0: no model)
    speed(tok_s, ttft_ms)      the streaming reply's measured speed, at most every SPEED_EVERY_S

A *place* is a message's (0-based index among its versions, version count): "‹ 1/2 ›".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from desktop.engine.backend import ReplyStart
from desktop.engine.messages import Message, TokenEvent
from desktop.session.observable import Events

Place = tuple[int, int]
SPEED_EVERY_S = 0.25  # the status bar's tok/s moves while a reply streams, a few times a second


class Branches(Protocol):
    """What the session reads of the stored conversations (``desktop.store.HistoryStore``)."""

    def active_path(self, conv_id: int) -> list[tuple[int, Message]]: ...

    def siblings(self, msg_id: int) -> list[int]: ...

    def select_branch(self, msg_id: int) -> None: ...


def reply_message(meta: dict[str, Any], said: Sequence[TokenEvent] = ()) -> Message:
    """A new reply: ``meta`` and, for a fork or a continuation, the events of what it already
    said, added through the one rule that built them (so the parts and the trace match)."""
    reply = Message("assistant", [], meta)
    for ev in said:
        reply.add_event(ev)
    return reply


def refork(reply_id: int, reply: Message) -> tuple[ReplyStart, dict[str, Any]] | None:
    """How to regenerate a forked (or continued) reply: the same start, a new continuation; the
    start and the fork record to keep. None for a reply that did not fork."""
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


def continuation(reply_id: int, reply: Message) -> tuple[ReplyStart, list[TokenEvent], dict[str, Any]]:
    """A reply that says all of ``reply`` and goes on: its start, the events it keeps, and the
    fork record (after its last token, marked ``continued``)."""
    trace = reply.tokens
    said_ids = tuple(trace.ids) if trace.has_ids else ()
    start = ReplyStart(said_ids=said_ids, said_text="".join(trace.texts))
    return start, trace.events(len(trace)), {"from": reply_id, "at": len(trace), "continued": True}


def used_by(path: Sequence[tuple[int, Message]]) -> int:
    """Tokens a finished conversation uses, from its last reply's stats: its prompt plus what it
    generated (0 for a new chat, or one whose replies kept no stats)."""
    for _, message in reversed(path):
        stats = message.meta.get("stats") if message.role == "assistant" else None
        if isinstance(stats, dict) and isinstance(stats.get("prompt_tokens"), int):
            return stats["prompt_tokens"] + int(stats.get("new_tokens") or 0)
    return 0


class ConversationSession:
    """The conversation on the Chat screen and the reply streaming into it (module docstring).

    ``clock`` (seconds, monotonic) times the reply's speed; a test passes its own.
    """

    def __init__(self, branches: Branches, clock: Callable[[], float] = time.perf_counter) -> None:
        self.branches = branches
        self.events = Events("changed", "reply_started", "reply_token", "reply_finished", "context", "speed")
        self.conv_id: int | None = None
        self.path: list[tuple[int, Message]] = []  # (stored id, message) on the active branch
        self.places: list[Place] = []  # per message of ``path``
        self.context_length = 0  # of the model loaded (0: none)
        self.reply: Message | None = None
        self.reply_id: int | None = None
        self.reply_place: Place = (0, 1)
        self.kept = 0  # tokens the streaming reply kept from before (a fork's or continuation's start)
        self._clock = clock
        self._prompt_tokens: int | None = None  # the streaming reply's prompt, once measured
        self._started = 0.0  # when the reply was asked for
        self._first_made: float | None = None  # when the first token the model made arrived
        self._made = 0  # tokens the model made for this reply (not kept, not given by the user)
        self._speed_shown: float | None = None  # when the speed was last reported

    # ----- what is shown ---------------------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        return [m for _, m in self.path]

    @property
    def streaming(self) -> bool:
        return self.reply is not None

    def context_used(self) -> tuple[int, int]:
        """(tokens used, context length): while a reply streams, its prompt plus every token of
        the reply so far, its kept start included; else what the last reply's stats say."""
        if self.reply is not None and self._prompt_tokens is not None:
            used = self._prompt_tokens + len(self.reply.tokens)
        else:
            used = used_by(self.path)
        return used, self.context_length

    def new(self) -> None:
        """Show a new, empty chat."""
        self.conv_id, self.path, self.places = None, [], []
        self._emit_changed()

    def open(self, conv_id: int) -> None:
        """Show a stored conversation's active branch instead of what was shown: its messages
        replace the previous ones."""
        self.conv_id = conv_id
        self.path = self.branches.active_path(conv_id)
        self.places = [self.place(msg_id) for msg_id, _ in self.path]
        self._emit_changed()

    def place(self, msg_id: int) -> Place:
        """The stored message's (index among its versions, version count)."""
        sib = self.branches.siblings(msg_id)
        return (sib.index(msg_id) if msg_id in sib else 0, len(sib))

    def switch_branch(self, index: int, direction: int) -> bool:
        """Show the previous (-1) or next (+1) version of the message at ``index``, and what
        follows it; False (nothing changed) when there is none, or a reply is streaming."""
        if self.reply is not None or self.conv_id is None or not 0 <= index < len(self.path):
            return False
        msg_id = self.path[index][0]
        sib = self.branches.siblings(msg_id)
        pos = sib.index(msg_id) + direction if msg_id in sib else -1
        if not 0 <= pos < len(sib):
            return False
        self.branches.select_branch(sib[pos])
        self.open(self.conv_id)
        return True

    def set_context_length(self, length: int) -> None:
        """A model was loaded: the counter's total."""
        self.context_length = length
        self.events.context.emit(*self.context_used())

    def cut(self, index: int) -> None:
        """Keep the messages before ``index`` (a regeneration, a fork or an edit replaces the rest
        with a new version); the reply that starts next shows the change."""
        self.path = self.path[:index]
        self.places = self.places[:index]

    def add(self, msg_id: int, message: Message) -> None:
        """A message the user just sent (stored as ``msg_id``), at the end of the path."""
        self.path.append((msg_id, message))
        self.places.append(self.place(msg_id))

    # ----- the streaming reply ---------------------------------------------------------------

    def begin_reply(self, reply_id: int, reply: Message) -> None:
        """``reply`` (stored as ``reply_id``; see :func:`reply_message`, its tokens so far are a
        kept start) streams next after the path. A regeneration shows its place among the
        earlier replies (‹ 3/3 ›) at once."""
        place = self.place(reply_id)
        self.reply, self.reply_id, self.reply_place = reply, reply_id, place
        self.kept = len(reply.tokens)
        self._prompt_tokens = None
        self._started = self._clock()
        self._first_made, self._made, self._speed_shown = None, 0, None
        self._emit_changed()
        self.events.reply_started.emit(reply, place)

    def set_prompt(self, tokens: int, context_length: int) -> None:
        """The streaming reply's prompt was measured (before the reply's own start, which the
        count adds)."""
        self._prompt_tokens = tokens
        self.context_length = context_length
        self.events.context.emit(*self.context_used())

    def add_token(self, ev: TokenEvent) -> None:
        """One more event of the streaming reply (ignored when none streams: a late token)."""
        if self.reply is None:
            return
        self.reply.add_event(ev)
        if not ev.given and not ev.continues:
            self._made += 1
            now = self._clock()
            if self._first_made is None:
                self._first_made = now
            elif self._speed_shown is None or now - self._speed_shown >= SPEED_EVERY_S:
                self._report_speed(now)
        self.events.context.emit(*self.context_used())
        self.events.reply_token.emit(ev)

    def _report_speed(self, now: float) -> None:
        assert self._first_made is not None
        elapsed = now - self._first_made
        if elapsed <= 0:
            return
        self._speed_shown = now
        # Decode speed as the engine measures it: tokens after the first, over the time since it.
        self.events.speed.emit((self._made - 1) / elapsed, (self._first_made - self._started) * 1000)

    def finish_reply(self, stats: dict[str, Any], into_path: bool = True) -> tuple[int, Message]:
        """The reply ended with ``stats``; it joins the path (not when the user left it for
        another conversation: it is kept only in its own). Returns its (id, message)."""
        assert self.reply is not None
        self.reply.meta["stats"] = stats
        return self._end(stats, into_path)

    def fail_reply(self, reason: str) -> tuple[int, Message]:
        """The reply failed; it keeps what it said, and says why."""
        assert self.reply is not None
        self.reply.meta["error"] = reason
        return self._end({"error": reason}, True)

    def _end(self, outcome: dict[str, Any], into_path: bool) -> tuple[int, Message]:
        assert self.reply is not None and self.reply_id is not None
        ended = (self.reply_id, self.reply)
        if into_path:
            self.path.append(ended)
            self.places.append(self.reply_place)
        self.reply, self.reply_id, self.kept, self._prompt_tokens = None, None, 0, None
        if into_path:
            self.events.context.emit(*self.context_used())  # the prompt and the reply now
        self.events.reply_finished.emit(outcome)
        return ended

    def _emit_changed(self) -> None:
        self.events.changed.emit(self.messages, list(self.places))
        self.events.context.emit(*self.context_used())


class ReplyInside:
    """A reply's Inside view numbers (issue #45, docs/INSIDE.md): its whole sequence (prompt then
    reply ids, as the model saw them), the live :class:`~desktop.engine.inside.InsideCache` of
    the pass over it while this session holds one, and the positions computed so far, which are
    kept with the reply in history (``meta["inside"]``) and shown again without the model.

    Positions are predicting positions: reply token ``i`` was guessed at ``reply_start + i - 1``."""

    def __init__(
        self,
        ids: Sequence[int],
        reply_start: int,
        header: dict[str, Any],
        labels: dict[int, str] | Sequence[str] | None = None,
        saved: dict[tuple[int, int], Any] | None = None,
        live: Any = None,
    ) -> None:
        self.ids = tuple(int(i) for i in ids)
        self.reply_start = reply_start
        self.header = header  # family, era, exact, note, readout
        self._labels = labels if labels is not None else {}
        self.saved: dict[tuple[int, int], Any] = dict(saved or {})
        self.live = live
        self.changed = False  # positions computed since it was last saved

    @classmethod
    def of_cache(cls, cache: Any) -> ReplyInside:
        """From a fresh pass (the worker adds ``reply_start`` and ``labels`` to the cache)."""
        header = {k: getattr(cache, k) for k in ("family", "era", "exact", "note", "readout")}
        return cls(cache.ids, int(cache.reply_start), header, list(cache.labels), live=cache)

    @classmethod
    def of_meta(cls, d: Any) -> ReplyInside | None:
        """What :meth:`to_meta` kept in a reply's meta; None for anything else."""
        from desktop.engine.inside import InsideCache

        try:
            saved = InsideCache.saved(d)
            labels = {int(k): str(v) for k, v in d.get("labels", {}).items()}
            header = {k: d[k] for k in ("family", "era", "exact", "note", "readout")}
            return cls(d["ids"], int(d["reply_start"]), header, labels, saved)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def label(self, token: int) -> str:
        labels = self._labels
        if isinstance(labels, dict):
            return labels.get(token, f"#{token}")
        return labels[token] if 0 <= token < len(labels) else f"#{token}"

    def position_of(self, reply_index: int) -> int:
        """The predicting position of the reply's token ``reply_index`` (a prompt's last token
        predicts the reply's first)."""
        return self.reply_start + reply_index - 1

    def produced_at(self, position: int) -> int | None:
        return self.ids[position + 1] if 0 <= position < len(self.ids) - 1 else None

    def at(self, position: int) -> Any:
        """The :class:`~desktop.engine.inside.Inside` at ``position`` (what came next as the
        produced token), from what was kept or from the live pass; None where neither has it."""
        if not 0 <= position < len(self.ids):
            return None
        produced = self.produced_at(position)
        if produced is not None and (position, produced) in self.saved:
            return self.saved[(position, produced)]
        if produced is None:
            kept = [v for (p, _), v in self.saved.items() if p == position]
            if kept and self.live is None:
                return kept[0]
        if self.live is None:
            return None
        inside = self.live.at(position, produced)
        self.saved[(position, inside.produced)] = inside
        self.changed = True
        return inside

    def to_meta(self) -> dict[str, Any]:
        """The positions computed, with the labels of every token they show (``nanoscope-inside-cache/1``
        with ``reply_start`` and ``labels`` added)."""
        from desktop.engine.inside import CACHE_FORMAT

        shown = set(self.ids)
        for inside in self.saved.values():
            shown.update(g.token for layer in inside.lens for g in layer.top)
            shown.add(inside.produced)
        return {
            "format": CACHE_FORMAT,
            **self.header,
            "ids": list(self.ids),
            "positions": [inside.to_dict(packed=True) for inside in self.saved.values()],
            "reply_start": self.reply_start,
            "labels": {str(t): self.label(t) for t in sorted(shown)},
        }
