"""A chat's Inside views (issue #45), for the chat controller: one pass of the reply's model over
the whole conversation, on the model's own thread, then any token's numbers from it; the positions
seen are kept with the reply in history, so it opens again after a restart without the model.

While the raw tokens are shown (where a token's Inside button is), each reply's pass is prepared
as soon as the reply ends, so a click opens the view at once. That pass gives way to whatever the
user asks of the model next (a message, a load, another reply's Inside view).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from desktop.engine.messages import Message
from desktop.qt.model.slot import ModelSlot
from desktop.qt.model.worker import UNSET_RESERVE
from desktop.session.conversation import ConversationSession, ReplyInside
from desktop.store import HistoryStore

logger = logging.getLogger(__name__)


class ChatInside(QObject):
    """Signals: inside_ready(object, int): a reply's Inside numbers (a ReplyInside) and the
    position to show; inside_failed(str): why there is none, in one line; inside_prepared(int):
    a reply's pass is held, ready for a click (its message id)."""

    inside_ready = Signal(object, int)
    inside_failed = Signal(str)
    inside_prepared = Signal(int)

    def __init__(
        self,
        store: HistoryStore,
        slot: ModelSlot,
        session: ConversationSession,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store, self.slot, self.session = store, slot, session
        self._kept: dict[int, ReplyInside] = {}  # reply id: its numbers (a live pass while held)
        # request id: (reply id, the reply token to show when it ends; None: nobody waits)
        self._asked: dict[int, tuple[int, int | None]] = {}
        self._prepared: dict[int, tuple[list[int], int]] = {}  # prepared request: (ids, reply start)
        self._prompt_ids: dict[int, tuple[int, ...]] = {}  # reply id: its prompt as generated
        self.preparing = False  # prepare each reply's pass when it ends (the raw tokens are shown)
        slot.inside_ready.connect(self._ready)
        slot.inside_failed.connect(self._failed)

    def prompt_seen(self, reply_id: int, ids: Sequence[int]) -> None:
        """The exact ids a reply's prompt was fed as (its pass is then the generation's own)."""
        self._prompt_ids[reply_id] = tuple(ids)

    def model_changed(self) -> None:
        """Another model loaded: the passes held were the last one's."""
        for kept in self._kept.values():
            kept.live = None

    def set_preparing(self, on: bool) -> None:
        """Prepare replies' passes from now on (``on``), starting with the last reply shown."""
        self.preparing = on
        if on:
            last = next((mid for mid, m in reversed(self.session.path) if m.role == "assistant"), None)
            if last is not None:
                self.reply_done(last)

    def reply_done(self, reply_id: int) -> None:
        """A reply of this session ended: while preparing, its pass starts on the model's thread
        (a reply this session generated, whose ids are known, not yet held or asked for)."""
        prompt = self._prompt_ids.get(reply_id)
        if not self.preparing or prompt is None or self.session.reply_id == reply_id:
            return
        kept = self._kept.get(reply_id)
        if (kept is not None and kept.live is not None) or self._asked_for(reply_id) is not None:
            return
        reply = next((m for mid, m in self.session.path if mid == reply_id), None)
        if reply is None or self._why_not(reply.meta):
            return
        reply_ids = _ids_of(reply)
        if not reply_ids or min(reply_ids) < 0:  # a served model's reply: no ids
            return
        ids = [*prompt, *reply_ids]
        request = self.slot.prepare_inside(ids, len(prompt))
        self._asked[request] = (reply_id, None)
        self._prepared[request] = (ids, len(prompt))

    def at(self, index: int, token: int) -> None:
        """The Inside view of the reply at ``index`` at its token ``token``: from what this
        session or history kept, else from one pass of the model over the whole conversation
        (off the GUI thread; ``inside_ready`` or ``inside_failed`` follows)."""
        if not 0 <= index < len(self.session.path) or self.session.path[index][1].role != "assistant":
            return
        reply_id, reply = self.session.path[index]
        if self.session.reply_id == reply_id:
            self.inside_failed.emit("the reply is still being written: its Inside view comes when it ends")
            return
        events = reply.tokens.events(len(reply.tokens))
        if not 0 <= token < len(events) or events[token].continues:
            return
        if events[token].id < 0:
            self.inside_failed.emit("this reply has no token ids: a served model has no inside to show")
            return
        at = sum(1 for ev in events[:token] if not ev.continues)
        known = self._kept.get(reply_id)
        if known is None and isinstance(reply.meta.get("inside"), dict):
            known = ReplyInside.of_meta(reply.meta["inside"])
            if known is not None:
                self._kept[reply_id] = known
        if known is not None and known.at(known.position_of(at)) is not None:
            self._show(reply_id, known, known.position_of(at))
            return
        why = self._why_not(reply.meta)
        if why:
            self.inside_failed.emit(why)
            return
        under_way = self._asked_for(reply_id)
        if under_way is not None:  # its pass is under way (or prepared): show this token when it ends
            self._asked[under_way] = (reply_id, at)
            return
        reply_ids = _ids_of(reply)
        prompt = self._prompt_ids.get(reply_id)
        if prompt is not None:
            request = self.slot.inside([*prompt, *reply_ids], len(prompt))
        else:  # a reply from history: its conversation rendered again, as its generation rendered it
            request = self._render_again(index, reply_ids)
        self._asked[request] = (reply_id, at)

    def _asked_for(self, reply_id: int) -> int | None:
        """The request of the pass under way (or prepared) over this reply, if any."""
        return next((request for request, (asked, _at) in self._asked.items() if asked == reply_id), None)

    def _render_again(self, index: int, reply_ids: list[int]) -> int:
        """A pass over the conversation before the reply at ``index`` with the system prompt and
        the room its generation kept, checked against the prompt's digest (when kept)."""
        meta = self.session.path[index][1].meta
        history = [m for _, m in self.session.path[:index]]
        if str(meta.get("system_prompt") or "").strip():
            history.insert(0, Message.of_text("system", str(meta["system_prompt"])))
        sampling = meta.get("sampling")
        reserve = (sampling.get("max_tokens") if isinstance(sampling, dict) else None) or UNSET_RESERVE
        digest = meta.get("prompt_digest")
        return self.slot.reply_inside(
            history, reply_ids, int(reserve), str(digest) if isinstance(digest, str) else None
        )

    def _why_not(self, meta: dict[str, Any]) -> str:
        """Why the model loaded now cannot give this reply's Inside view ("" when it can)."""
        info = self.slot.info
        family = str(meta.get("family") or "")
        if family == "remote" or (info is not None and info.family == "remote"):
            return "a served model has no inside to show (its weights are on the server)"
        # other families: the pass says in one line whether it has an Inside view yet
        made = f"{Path(str(meta.get('checkpoint', ''))).name} step {meta.get('step')}"
        if info is None or self.slot.is_loading:
            return f"the model that wrote this reply ({made}) is not loaded: load it to look inside"
        if str(meta.get("checkpoint", "")) != str(info.path) or meta.get("step") != info.step:
            return f"the model loaded is not the one that wrote this reply ({made}): load it to look inside"
        return ""

    def _ready(self, request: int, cache: Any) -> None:
        asked = self._asked.pop(request, None)
        self._prepared.pop(request, None)
        if asked is None:
            return
        reply_id, at = asked
        inside = ReplyInside.of_cache(cache)
        for kept in self._kept.values():
            kept.live = None  # one pass held at a time: hundreds of MB for a long reply
        old = self._kept.get(reply_id)
        if old is not None:
            inside.saved = {**old.saved, **inside.saved}
        self._kept[reply_id] = inside
        if at is None:
            self.inside_prepared.emit(reply_id)
        else:
            self._show(reply_id, inside, inside.position_of(at))

    def _failed(self, request: int, reason: str) -> None:
        asked, prepared = self._asked.pop(request, None), self._prepared.pop(request, None)
        if asked is None:
            return
        reply_id, at = asked
        if prepared is None:
            self.inside_failed.emit(reason)
        elif at is not None:  # a click waited on a prepared pass that gave way: ask for it now
            self._asked[self.slot.inside(*prepared)] = (reply_id, at)
        else:
            logger.info("the prepared Inside pass of reply %d ended: %s", reply_id, reason)

    def _show(self, reply_id: int, inside: ReplyInside, position: int) -> None:
        self.inside_ready.emit(inside, position)
        self.save(reply_id)

    def save(self, reply_id: int) -> None:
        """Keep the positions computed with the reply in history (its meta), once they change."""
        inside = self._kept.get(reply_id)
        if inside is None or not inside.changed:
            return
        for mid, message in self.session.path:
            if mid == reply_id:
                message.meta["inside"] = inside.to_meta()
                self.store.update_message(mid, message, complete=True)
                inside.changed = False
                return

    def reply_id_of(self, inside: ReplyInside) -> int | None:
        return next((rid for rid, kept in self._kept.items() if kept is inside), None)


def _ids_of(reply: Message) -> list[int]:
    """A reply's token ids as the model produced them (a decoder's flushed tail is no token)."""
    return [ev.id for ev in reply.tokens.events(len(reply.tokens)) if not ev.continues]
