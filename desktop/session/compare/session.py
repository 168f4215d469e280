"""The Compare screen's state without Qt: its panes, one round of replies, what was found about
the replies, and whether the result is saved.

The Qt controller (``desktop/qt/compare/controller.py``) owns the model slots and threads; it
tells this session what they did (a load started, finished or failed; a token arrived; a reply
finished) and asks it what to do next. Views re-render from the session's fields when one of
its events fires:

    pane_added(index), pane_removed(index)
    pane_changed(index): its pick, load state or overrides changed
    divergence_changed(index or None), diff_changed((a, b, [DiffSpan]) or None)
    notice(level, title, message)
    saved(conv_id), opened(prompt, SamplingParams)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from desktop import __version__
from desktop.config.settings import Settings
from desktop.engine.backend import ModelInfo
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.session.compare.analysis import (
    LETTERS,
    MAX_PANES,
    MIN_PANES,
    OVERRIDE_KEYS,
    DiffSpan,
    checkpoint_draft,
    cross_family_reason,
    first_divergence,
    token_diff,
)
from desktop.session.compare.pane_run import PaneRun
from desktop.session.compare.panes import Key, PaneState, key_of
from desktop.session.observable import Events
from desktop.store import HistoryStore

TITLE_CHARS = 48
SETTING = "compare_session"  # the panes' picks and the shown comparison, kept across restarts


class CompareSession:
    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        self.events = Events(
            "pane_added", "pane_removed", "pane_changed", "divergence_changed", "diff_changed", "notice",
            "saved", "opened",
        )  # fmt: skip
        self.panes: list[PaneState] = []
        # The round: one prompt for every pane.
        self.prompt = ""
        self.system_prompt = ""
        self.shared = SamplingParams()
        self.messages: list[Message] = []
        self.draft = ""  # speculative decoding's draft for every pane that can (StreamOptions.draft)
        self.drafter: PaneState | None = None  # or: this pane's checkpoint drafts for the others
        # Results.
        self.overlay = False
        self.diff_pair: tuple[int, int] | None = None
        self.divergence: int | None = None
        self._agreed = 0
        # Saving: the conversation the shown result is stored as (None: not saved).
        self.conv_id: int | None = None
        for _ in range(MIN_PANES):
            self.add_pane()

    # ----- panes -----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return any(p.run.running for p in self.panes)

    def index(self, pane: PaneState) -> int | None:
        return next((i for i, p in enumerate(self.panes) if p is pane), None)

    def add_pane(self) -> PaneState | None:
        """One more empty pane (at most four); None when there are already four."""
        if len(self.panes) >= MAX_PANES:
            return None
        pane = PaneState()
        self.panes.append(pane)
        self.events.pane_added.emit(len(self.panes) - 1)
        return pane

    def remove_pane(self, index: int) -> bool:
        """Drop a pane (never below two); its model slot goes with it (``pane_removed``)."""
        if len(self.panes) <= MIN_PANES or not 0 <= index < len(self.panes):
            return False
        pane = self.panes.pop(index)
        if pane is self.drafter:
            self.drafter = None  # its checkpoint went with it: speculative decoding is off
        self.events.pane_removed.emit(index)
        if self.diff_pair is not None and max(self.diff_pair) >= len(self.panes):
            self.diff_pair = (0, 1)
        self.recompute_divergence()
        self.update_diff()
        return True

    def resize(self, count: int) -> None:
        """Exactly ``count`` panes (within two to four), adding or dropping them at the end."""
        count = max(MIN_PANES, min(MAX_PANES, count))
        while len(self.panes) < count:
            self.add_pane()
        while len(self.panes) > count:
            self.remove_pane(len(self.panes) - 1)

    def pick(self, index: int, path: Path | str, step: int) -> None:
        """Pane ``index`` is to hold ``path`` at ``step`` (loaded or not)."""
        pane = self.panes[index]
        key = key_of(path, step)
        if pane.picked != key:
            pane.picked = key
            pane.failed = ""
            self.events.pane_changed.emit(index)

    def open_checkpoints(self, checkpoints: Sequence[tuple[Path | str, int]]) -> list[int]:
        """One pane per checkpoint (at most four), in order, each picking exactly that step and
        starting from the shared sampling values; the panes to load."""
        wanted = [key_of(path, step) for path, step in checkpoints][:MAX_PANES]
        self.resize(len(wanted))
        for i, key in enumerate(wanted):
            self.set_overrides(i, {})
            self.pick(i, *key)
        return list(range(len(wanted)))

    def set_overrides(self, index: int, overrides: dict) -> None:
        """Per-pane temperature / top-k / seed; None (or a missing key) means the shared value."""
        pane = self.panes[index]
        pane.overrides = {k: overrides.get(k) for k in OVERRIDE_KEYS if overrides.get(k) is not None}
        self.events.pane_changed.emit(index)

    # ----- what the model slots did ----------------------------------------------------------

    def set_loading(self, index: int, key: Key, percent: int = 0, message: str = "") -> None:
        pane = self.panes[index]
        pane.loading, pane.progress, pane.failed = key, (percent, message), ""
        if pane.picked is None:
            pane.picked = key
        self.events.pane_changed.emit(index)

    def set_loaded(self, index: int, info: ModelInfo) -> None:
        pane = self.panes[index]
        pane.info, pane.loading, pane.failed = info, None, ""
        if pane.picked is None:
            pane.picked = pane.loaded_key
        self.events.pane_changed.emit(index)

    def set_load_failed(self, index: int, reason: str) -> None:
        pane = self.panes[index]
        pane.loading, pane.failed = None, reason
        self.events.pane_changed.emit(index)

    def set_unloaded(self, index: int) -> None:
        pane = self.panes[index]
        pane.info, pane.loading = None, None
        if pane is self.drafter:
            self.drafter = None
        self.events.pane_changed.emit(index)

    # ----- speculative decoding --------------------------------------------------------------

    def choose_draft(self, draft: str = "", pane: int | None = None) -> None:
        """``draft`` in every pane that can (a self-draft, "" off), or pane ``pane``'s loaded
        checkpoint drafting for every other pane."""
        self.drafter = self.panes[pane] if pane is not None else None
        self.draft = "" if pane is not None else draft

    def drafters(self) -> list[tuple[int, str]]:
        """(pane, draft name) of every pane whose loaded checkpoint can draft for the others."""
        named = [(i, checkpoint_draft(p.info)) for i, p in enumerate(self.panes) if p.info is not None]
        return [(i, name) for i, name in named if name]

    def draft_for(self, pane: PaneState) -> tuple[str, str]:
        """The draft ``pane`` streams with, or why it decodes plainly ("" both: speculative
        decoding is off)."""
        source = self.drafter.info if self.drafter is not None else None
        draft = checkpoint_draft(source) if source is not None else self.draft
        if not draft or pane.info is None:
            return "", ""
        if pane is self.drafter:
            return "", "it is the draft"
        if why := pane.info.capabilities.why_not("draft"):
            return "", why
        if source is not None and (why := cross_family_reason(pane.info.family, source.family)):
            return "", why
        return draft, ""

    def picked(self) -> tuple[list[Key], list[Key], list[Key]]:
        """What the memory check weighs: the checkpoints picked in the panes, those loaded, and a
        copy of the drafting pane's checkpoint for each pane that loads it as its draft (loaded
        too where that pane's last reply drafted with it: it still holds it)."""
        selected = [p.picked for p in self.panes if p.picked]
        loaded = [k for p in self.panes if (k := p.loaded_key)]
        if self.drafter is None or (drafted := self.drafter.loaded_key) is None:
            return selected, loaded, []
        drafts = [(p, draft) for p in self.panes if (draft := self.draft_for(p)[0])]
        loaded += [drafted for p, draft in drafts if p.run.stats.get("draft") == draft]
        return selected, loaded, [drafted] * len(drafts)

    # ----- one round of replies --------------------------------------------------------------

    def begin_round(
        self, text: str, shared: SamplingParams, system_prompt: str = "", earlier: Iterable[Message] = ()
    ) -> None:
        """A new prompt for every pane: the earlier replies and their results are cleared."""
        self.system_prompt = system_prompt
        self.prompt = text
        self.shared = shared
        self.messages = [*(m.copy_text() for m in earlier), Message.of_text("user", text)]
        if self.system_prompt.strip():
            self.messages.insert(0, Message.of_text("system", self.system_prompt))
        self.conv_id = None
        for pane in self.panes:
            pane.run = PaneRun()

    def start_run(self, pane: PaneState, params: SamplingParams) -> PaneRun:
        """``pane`` starts replying with ``params``: its run, to fill with tokens. Its reply's meta
        names the draft it streams with (``draft``), or why it decodes plainly while the others
        draft (``draft_skipped``): the footer says either."""
        assert pane.info is not None
        pane.run = PaneRun(params, pane.info.reply_meta(), dict(pane.overrides), running=True)
        draft, plain = self.draft_for(pane)
        if draft:
            pane.run.reply.meta["draft"] = draft
        elif plain:
            pane.run.reply.meta["draft_skipped"] = f"decoded plainly: {plain}"
        return pane.run

    def add_token(self, pane: PaneState, ev: TokenEvent) -> int | None:
        """One streamed event of ``pane``'s reply: the index of its token, or None when the pane
        is not replying (a late event of a stopped run)."""
        if not pane.run.running:
            return None
        index = pane.run.add(ev)
        if not ev.continues and self.divergence is None:
            self.advance_divergence()
        return index

    def finish_run(self, pane: PaneState, stats: dict, error: str | None = None) -> bool:
        """``pane``'s reply ended (``error``: it failed); False when it was not replying."""
        run = pane.run
        if not run.running:
            return False
        run.running = False
        run.stats = dict(stats) if error is None else {"error": error}
        if error is None and run.reply.meta.get("draft"):
            run.stats["draft"] = run.reply.meta["draft"]
        elif error is None and run.reply.meta.get("draft_skipped"):
            run.stats["draft_skipped"] = run.reply.meta["draft_skipped"]  # a pane asked not to draft
        run.error = error
        if self.divergence is None:
            self.advance_divergence()
        if not self.busy:
            self.update_diff()
        return True

    def has_result(self) -> bool:
        return any(p.run.has_reply for p in self.panes)

    # ----- divergence and diff ---------------------------------------------------------------

    def _compared_runs(self) -> list[PaneRun]:
        """Runs of the current prompt that did not fail (a failed one says nothing about divergence)."""
        return [
            p.run for p in self.panes if (p.run.tokens or p.run.running or p.run.stats) and not p.run.error
        ]

    def comparable(self) -> bool:
        """Same-position tokens mean something only when every run is greedy or all share a seed."""
        runs = self._compared_runs()
        if len(runs) < 2:
            return False
        params = [r.params for r in runs if r.params is not None]
        greedy = all(p.greedy for p in params)
        return greedy or len({p.seed for p in params}) == 1

    def advance_divergence(self) -> None:
        if not self.comparable():
            return
        runs = self._compared_runs()
        found, self._agreed = first_divergence(
            comparable_tokens(runs), [not r.running for r in runs], self._agreed
        )
        if found is not None:
            self.divergence = found
            self.events.divergence_changed.emit(found)

    def recompute_divergence(self) -> None:
        self.divergence, self._agreed = None, 0
        self.events.divergence_changed.emit(None)
        self.advance_divergence()

    def divergence_status(self) -> str:
        """The status line under the panes: where the replies diverge, or why none is marked."""
        if not self.has_result():
            return ""
        if self.divergence is not None:
            agreed = f"{self.divergence} token{'' if self.divergence == 1 else 's'}"
            return f"The replies agree for {agreed}, then diverge (marked ▍ in each pane)."
        if self.busy:
            return "The replies agree so far…"
        if self.comparable():
            return "The replies are identical."
        return "Different seeds: token positions are not comparable, so no divergence is marked."

    def set_diff_pair(self, a: int | None, b: int | None = None) -> None:
        """Diff the replies of panes ``a`` and ``b`` token by token; None switches the diff off."""
        self.diff_pair = None if a is None or b is None or a == b else (a, b)
        self.update_diff()

    def diff(self) -> tuple[int, int, list[DiffSpan]] | None:
        if self.diff_pair is None or self.busy:
            return None
        a, b = self.diff_pair
        if max(a, b) >= len(self.panes):
            return None
        ta, tb = comparable_tokens([self.panes[a].run, self.panes[b].run])
        return a, b, token_diff(ta, tb)

    def update_diff(self) -> None:
        self.events.diff_changed.emit(self.diff())

    def agreement(self) -> list[list[float | None]]:
        """Row r, column c: how often pane r's checkpoint's most likely token is pane c's reply's
        token (greedy speculative decoding's acceptance rate, pane r drafting for pane c);
        None where it was not scored. The diagonal is a reply under its own checkpoint."""
        return [
            [p.run.cross_scores.get(LETTERS[r], {}).get("agreement") for p in self.panes]
            for r in range(len(self.panes))
        ]

    # ----- saving ----------------------------------------------------------------------------

    @property
    def saved(self) -> bool:
        """The result on screen is the conversation ``conv_id`` in history."""
        return self.conv_id is not None

    def comparison(self, scheduling: str) -> tuple[str, list[Message], dict]:
        """(title, [user, one assistant per pane with a reply], conversation meta) of the current run."""
        title = "Compare: " + (self.prompt[:TITLE_CHARS].splitlines() or ["prompt"])[0]
        messages = [Message.of_text("user", self.prompt)]
        letters = []
        for i, pane in enumerate(self.panes):
            if pane.run.has_reply:
                messages.append(pane.run.to_message(LETTERS[i]))
                letters.append(LETTERS[i])
        diff = self.diff()
        meta: dict[str, Any] = {
            "kind": "compare",
            "prompt": self.prompt,
            "system_prompt": self.system_prompt,
            "shared_sampling": self.shared.to_dict(),
            "panes": letters,
            "divergence": self.divergence,
            "scheduling": scheduling,
            "app_version": __version__,
        }
        if diff is not None:
            a, b, spans = diff
            meta["diff"] = {"a": LETTERS[a], "b": LETTERS[b], "spans": [s.to_dict() for s in spans]}
        return title, messages, meta

    def save(self, scheduling: str, title: str | None = None) -> int | None:
        """Store the comparison as a new 'compare' conversation; its id, or None when there is nothing."""
        if self.busy or not self.has_result():
            return None
        default_title, messages, meta = self.comparison(scheduling)
        self.conv_id = self.store.import_conversation(title or default_title, messages, "compare", meta)
        if self.store.last_error:
            self.events.notice.emit("warning", "History not saved yet", self.store.last_error)
        self.events.saved.emit(self.conv_id)
        return self.conv_id

    def open_comparison(self, conv_id: int) -> bool:
        """Show a saved comparison again: its replies, each pane picking the checkpoint that
        wrote its reply (not loaded)."""
        if self.busy:
            return False
        meta = self.store.conversation_meta(conv_id)
        messages = [m for _, m in self.store.active_path(conv_id)]
        if not messages:
            return False
        replies = [m for m in messages if m.role == "assistant"][:MAX_PANES]
        user = next((m for m in messages if m.role == "user"), None)
        self.resize(len(replies))
        self.prompt = str(meta.get("prompt") or (user.plain_text() if user else ""))
        self.system_prompt = str(meta.get("system_prompt") or "")
        try:
            self.shared = SamplingParams.from_dict(meta.get("shared_sampling") or {})
        except (ValueError, TypeError):
            self.shared = SamplingParams()
        self.messages = [Message.of_text("user", self.prompt)]
        if self.system_prompt.strip():
            self.messages.insert(0, Message.of_text("system", self.system_prompt))
        self.conv_id = conv_id
        for i, pane in enumerate(self.panes):
            pane.run = PaneRun.from_message(replies[i]) if i < len(replies) else PaneRun()
            ckpt, step = pane.run.model.get("checkpoint"), pane.run.model.get("step")
            if ckpt and isinstance(step, int) and Path(ckpt).is_dir():
                self.pick(i, ckpt, step)
            self.set_overrides(i, pane.run.overrides)
        self.events.opened.emit(self.prompt, self.shared)
        self.recompute_divergence()
        self.update_diff()
        return True

    # ----- across a restart ------------------------------------------------------------------

    def stop_runs(self) -> None:
        """Every reply still streaming ends here, as a stop would end it (the app is quitting)."""
        for pane in self.panes:
            if pane.run.running:
                self.finish_run(pane, {"new_tokens": len(pane.run.trace), "stopped": "cancelled"})

    def persist(self, settings: Settings, scheduling: str) -> None:
        """Keep the panes' picks and the result on screen (saved to history first if it is not)
        for the next start."""
        self.stop_runs()
        if self.has_result() and not self.saved:
            self.save(scheduling)
        panes = [p for pane in self.panes if (p := pane.persisted()) is not None]
        settings.set(SETTING, {"panes": panes, "conversation": self.conv_id})

    def restore(self, settings: Settings) -> None:
        """The session the last run of the app left: its result reopened, then its picks."""
        kept = settings.get(SETTING)
        conv_id = kept.get("conversation")
        if isinstance(conv_id, int) and self._is_comparison(conv_id):
            self.open_comparison(conv_id)
        panes = [p for p in kept.get("panes", []) if Path(p["dir"]).is_dir()]
        if panes:
            self.resize(max(len(panes), len(self.panes)))
        for i, p in enumerate(panes[:MAX_PANES]):
            self.pick(i, p["dir"], p["step"])
            self.set_overrides(i, p.get("overrides") or {})

    def _is_comparison(self, conv_id: int) -> bool:
        try:
            return self.store.conversation_meta(conv_id).get("kind") == "compare"
        except KeyError:  # deleted for good since
            return False


def comparable_tokens(runs: list[PaneRun]) -> list[list]:
    """Token ids when every reply has them, else every reply's token texts (a served model that
    gives text only is compared by text with the rest)."""
    if all(r.trace.has_ids or not r.trace.ids for r in runs):
        return [r.tokens for r in runs]
    return [list(r.trace.texts) for r in runs]
