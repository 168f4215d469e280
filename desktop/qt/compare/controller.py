"""The Qt side of Compare: 2–4 panes, each with its own model slot (GUI thread only).

The state of the screen lives in a Qt-free :class:`CompareSession` (the panes' picks and load
states, the round, divergence, diff and saving). This object owns what needs Qt: each pane's
model slot and thread, the scheduling of a round over them, and the timers; it tells the session
what the slots did and re-emits the session's events as Qt signals for the window.

One prompt goes to every loaded pane with the same sampling values and seed (a pane may
override temperature, top-k and seed), so differences between the replies come from the models.

CPU scheduling: panes on the CPU share its cores. ``parallel`` runs every pane at once with
``cores // panes`` intra-op threads each; ``interleaved`` gives each pane all the cores but lets
only one compute at a time (a first-come lock around each token step). The default on CPU is the
one ``benchmarks/bench_compare_cpu.py`` measured faster; GPU panes always run in parallel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from desktop.config.settings import Settings
from desktop.engine.backend import ModelInfo, Prompt
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.qt.compare.memory_check import MemoryCheck
from desktop.qt.compare.pane_slot import Pane
from desktop.qt.compare.rounds import Races, schedule
from desktop.qt.compare.scoring import TOP_ALTERNATIVES, Scoring
from desktop.session.compare.analysis import (
    LETTERS,
    MAX_PANES,
    effective_params,
    sweep_steps,
)
from desktop.session.compare.inside import ASKING, NOT_LOADED, SERVED, STILL, CompareInside
from desktop.session.compare.pane_run import Fork
from desktop.session.compare.panes import Key, key_of
from desktop.session.compare.session import CompareSession
from desktop.store import HistoryStore
from desktop.store.export import comparison_markdown, to_json

SCHEDULING_MODES = ("auto", "parallel", "interleaved")
# The faster CPU mode on the 2-core machine it was measured on (see the module doc and the bench).
CPU_DEFAULT_SCHEDULING = "parallel"
SWEEP_TEMPERATURES = (0.0, 0.6, 1.0, 1.4)


class CompareController(QObject):
    """The panes of the Compare view. Pane indexes are positions (letters A–D follow them).

    Signals:
        pane_added(int), pane_removed(int): the pane row changed.
        pane_changed(int): a pane's pick, load state or overrides changed: redraw its header
            from ``session.panes[i]``.
        pane_loading(int, int, str), pane_loaded(int, object), pane_load_failed(int, str),
            pane_unloaded(int): model state per pane (pane_loaded carries the ModelInfo).
        pane_started(int, object): a pane began replying with these SamplingParams.
        pane_token(int, int, object): pane, token index, TokenEvent (a ``continues`` event adds
            text to that token).
        pane_finished(int, dict): the pane's stats (``{"error": …}`` when it failed).
        pane_refreshed(int): the pane's reply was replaced or completed (probabilities filled in
            later, a saved comparison reopened); redraw it from ``panes[i].run``.
        busy_changed(bool): any pane is replying, or none is.
        divergence_changed(object): first index where same-seed replies differ, or None.
        diff_changed(object): (pane a, pane b, [DiffSpan]) or None.
        cross_scored(int, int, dict): source pane, scoring pane, score (or {"error": …}).
        memory_checked(bool, str): whether the selected checkpoints fit, and a message if not.
        comparison_opened(str, object): a saved comparison was reopened (prompt, the shared
            SamplingParams).
        saved(int): the comparison was stored as this conversation.
        notice(str, str, str): level, title, message.
    """

    pane_added = Signal(int)
    pane_removed = Signal(int)
    pane_changed = Signal(int)
    pane_loading = Signal(int, int, str)
    pane_loaded = Signal(int, object)
    pane_load_failed = Signal(int, str)
    pane_unloaded = Signal(int)
    pane_started = Signal(int, object)
    pane_token = Signal(int, int, object)
    pane_finished = Signal(int, dict)
    pane_refreshed = Signal(int)
    busy_changed = Signal(bool)
    divergence_changed = Signal(object)
    diff_changed = Signal(object)
    cross_scored = Signal(int, int, dict)
    memory_checked = Signal(bool, str)
    comparison_opened = Signal(str, object)  # object: a SamplingParams is no dict to Qt
    saved = Signal(int)
    notice = Signal(str, str, str)
    same_model_reported = Signal(int, int, object)  # pane a, pane b, same_model.SameModelReport
    inside_changed = Signal(object)  # the CompareInside shown (a column answered, or a new one)

    def __init__(
        self,
        store: HistoryStore,
        settings: Settings,
        parent: QObject | None = None,
        *,
        scheduling: str = "auto",
    ) -> None:
        super().__init__(parent)
        if scheduling not in SCHEDULING_MODES:
            raise ValueError(f"scheduling must be one of {SCHEDULING_MODES}, got {scheduling!r}")
        self.store = store
        self.settings = settings
        self.scheduling = scheduling
        self.panes: list[Pane] = []
        self._busy = False
        self.inside: CompareInside | None = None  # the Inside view across steps (issue #45)
        self.memory = MemoryCheck(settings, self._picked, self)
        self.memory.checked.connect(self.memory_checked)
        self.scoring = Scoring(self, self)
        self.races = Races(self, self)
        self.session = CompareSession(store)
        for i in range(len(self.session.panes)):
            self._add_slot(i)
        events = self.session.events
        events.pane_added.connect(self._add_slot)
        events.pane_removed.connect(self._remove_slot)
        events.pane_changed.connect(self._on_pane_changed)
        events.divergence_changed.connect(self.divergence_changed.emit)
        events.diff_changed.connect(self.diff_changed.emit)
        events.notice.connect(self.notice.emit)
        events.saved.connect(self.saved.emit)
        events.opened.connect(self._on_opened)
        self.session.restore(settings)  # the session the app's last run left, if any
        self.memory.check()  # of the picks restored

    # ----- the session's round, as the window and tests read it ------------------------------

    @property
    def busy(self) -> bool:
        return self.session.busy

    @property
    def prompt(self) -> str:
        return self.session.prompt

    @property
    def messages(self) -> list[Message]:
        return self.session.messages

    @property
    def divergence(self) -> int | None:
        return self.session.divergence

    @property
    def conv_id(self) -> int | None:
        return self.session.conv_id

    @property
    def draft(self) -> str:
        return self.session.draft

    @property
    def drafter(self) -> Pane | None:
        drafter = self.session.drafter
        return next((p for p in self.panes if p.state is drafter), None) if drafter else None

    # ----- panes -----------------------------------------------------------------------------

    def add_pane(self) -> bool:
        """One more pane (at most four), empty; False when there are already four."""
        return self.session.add_pane() is not None

    def remove_pane(self, index: int) -> bool:
        """Stop and shut down a pane's worker and drop it (never below two panes)."""
        if not self.session.remove_pane(index):
            return False
        self._update_busy()
        self.memory.check()
        return True

    def _add_slot(self, index: int) -> None:
        pane = Pane(self.settings, self, self.session.panes[index])
        pane.loading.connect(partial(self._pane_progress, pane))
        pane.loaded.connect(partial(self._pane_loaded, pane))
        pane.load_failed.connect(partial(self._pane_load_failed, pane))
        pane.notice.connect(partial(self._pane_notice, pane))
        pane.context.connect(partial(self._pane_context, pane))
        pane.token.connect(partial(self._pane_token, pane))
        pane.finished.connect(partial(self._pane_finished, pane))
        pane.failed.connect(partial(self._pane_failed, pane))
        pane.scored.connect(self.scoring.done)
        pane.score_failed.connect(lambda request, reason: self.scoring.done(request, {"error": reason}))
        pane.inside_ready.connect(self._on_inside_ready)
        pane.inside_failed.connect(self._on_inside_failed)
        self.panes.insert(index, pane)
        self.pane_added.emit(index)

    def _remove_slot(self, index: int) -> None:
        pane = self.panes.pop(index)
        pane.shutdown()
        pane.deleteLater()
        self.pane_removed.emit(index)

    def _on_pane_changed(self, index: int) -> None:
        if index < len(self.panes):  # a pane the session made is announced once its slot exists
            self.pane_changed.emit(index)

    def select(self, index: int, path: Path, step: int) -> None:
        """The user picked a checkpoint in a pane (not loaded yet): re-check the memory needed."""
        self.session.pick(index, path, step)
        self.memory.check()

    def open_checkpoints(self, checkpoints: Sequence[tuple[Path, int]]) -> list[int]:
        """One pane per checkpoint, holding exactly that step, each loaded (Run's marked steps);
        the panes used."""
        if self.busy:
            self.stop()
        used = self.session.open_checkpoints(checkpoints)
        for i in used:
            if (key := self.session.panes[i].picked) is not None:
                self.load(i, *key)
        self._update_busy()  # a stopped pane may have gone with the panes not needed
        return used

    def follow(self, index: int, on: bool) -> None:
        """Pane ``index`` follows its run's newest step ("Latest"), or stays on the one picked."""
        self.session.panes[index].following.follow(on)

    def runs_listed(self, entries: list) -> None:
        """A scan listed the runs: each pane holding a run with a newer step says so once; a pane
        that follows loads it now, or once the round streaming ends (never in its middle)."""
        saved = [(e.path, e.steps) for e in entries if e.source != "remote"]
        for i, state in enumerate(self.session.panes):
            landing = state.following.listed(saved, self.busy)
            if landing is None:
                continue
            title, message = landing.notice("This pane", "the pane's Step list")
            self.notice.emit("info", f"Pane {LETTERS[i]}: {title}", message)
            if landing.load_now:
                self.load(i, landing.folder, landing.step)

    def _load_waiting(self) -> None:
        """The round ended: a following pane loads the step that landed during it."""
        for i, state in enumerate(self.session.panes):
            folder, step = state.following.folder, state.following.reply_ended()
            if folder is not None and step is not None:
                self.load(i, folder, step)

    def load(self, index: int, path: Path, step: int) -> None:
        """Load ``path`` at ``step`` into pane ``index`` (a reply in progress there is stopped first)."""
        pane = self.panes[index]
        key = key_of(path, step)
        self.session.pick(index, *key)
        if pane.loading_target == key or (not pane.is_loading and pane.loaded_key == key):
            return
        pane.load(*key)
        self.memory.check()

    def unload(self, index: int) -> None:
        """Free pane ``index``'s model; its last reply stays on screen."""
        self.panes[index].unload()
        self.session.set_unloaded(index)
        self.pane_unloaded.emit(index)
        self.memory.check()

    def set_overrides(self, index: int, overrides: dict) -> None:
        """Per-pane temperature / top-k / seed; None (or a missing key) means the shared value."""
        self.session.set_overrides(index, overrides)

    def step_sweep(self, entry: Any) -> list[int]:
        """Panes for up to four evenly spaced steps of one tag (a CheckpointEntry), the latest included."""
        if self.busy:
            return []
        steps = sweep_steps(entry.steps, MAX_PANES)
        self.open_checkpoints([(Path(entry.path), step) for step in steps])
        return steps

    def temperature_sweep(self) -> bool:
        """Every pane on the first pane's checkpoint, at temperatures 0, 0.6, 1.0, 1.4 (same seed)."""
        if self.busy:
            return False
        base = next((p.loaded_key or p.selection for p in self.panes if p.loaded_key or p.selection), None)
        if base is None:
            self.notice.emit("warning", "No checkpoint picked", "pick a checkpoint in the first pane first")
            return False
        for i in range(len(self.panes)):
            self.set_overrides(i, {"temperature": SWEEP_TEMPERATURES[i]})
            self.load(i, *base)
        return True

    # ----- speculative decoding --------------------------------------------------------------

    def choose_draft(self, draft: str = "", pane: int | None = None) -> None:
        """Speculative decoding for the next replies: ``draft`` in every pane that can (a self-draft,
        "" off), or pane ``pane``'s loaded checkpoint drafting for every other pane."""
        self.session.choose_draft(draft, pane)
        self.memory.check()  # a pane's checkpoint as a draft is one more copy of it per pane

    def drafters(self) -> list[tuple[int, str]]:
        """(pane, draft name) of every pane whose loaded checkpoint can draft for the others."""
        return self.session.drafters()

    # ----- generation ------------------------------------------------------------------------

    def cpu_scheduling(self) -> str:
        """How CPU panes share the cores: "parallel" or "interleaved"."""
        return CPU_DEFAULT_SCHEDULING if self.scheduling == "auto" else self.scheduling

    def send(
        self,
        text: str,
        shared: SamplingParams,
        system_prompt: str = "",
        earlier: list[Message] | None = None,
        fork: Fork | None = None,
    ) -> bool:
        """Send ``text`` to every loaded pane; False (nothing changed) if refused. ``earlier``:
        the conversation before it; ``fork``: every reply begins as that fork does."""
        text = text.strip()
        if not text or self.busy:
            return False
        ready = [p for p in self.panes if p.ready]
        if not ready:
            self.notice.emit("warning", "No model loaded", "load a checkpoint in at least one pane first")
            return False
        if fork is not None:
            ready = self.races.ready_for(ready, fork)
            if not ready:
                return False
        self.session.begin_round(text, shared, system_prompt, earlier or ())
        top = TOP_ALTERNATIVES if self.session.overlay or self.scoring.same_model_pending else 0
        plan = schedule(ready, self.cpu_scheduling(), top)
        self._say_plain(ready)
        for i in range(len(self.panes)):
            self.pane_refreshed.emit(i)
        for pane in ready:
            params = effective_params(shared, pane.overrides)
            run = self.session.start_run(pane.state, params)
            options, lock = plan[pane]
            if draft := run.reply.meta.get("draft"):
                options = replace(options, draft=draft, draft_k=self.settings.get("draft_k"))
            if fork is not None:
                # Each pane's reply holds what the fork said, with no probabilities: those were
                # the source model's, not this pane's.
                for ev in fork.said:
                    run.add(replace(ev, logprob=None, top=None))
                run.reply.meta["fork"] = {"at": len(fork.said)}
                options = replace(options, start=fork.start)
            pane.generate(self.messages, params, options, lock)
            self.pane_started.emit(self.panes.index(pane), params)
        self.session.recompute_divergence()
        self.session.update_diff()
        self._update_busy()
        return True

    def _say_plain(self, ready: list[Pane]) -> None:
        """With speculative decoding on, name the panes that decode plainly, and why."""
        why = {LETTERS[self.panes.index(p)]: self.session.draft_for(p.state)[1] for p in ready}
        plain = {letter: reason for letter, reason in why.items() if reason}
        if plain:
            lines = "; ".join(f"pane {letter}: {reason}" for letter, reason in plain.items())
            self.notice.emit("info", "Not every pane decodes speculatively", lines)

    def fork_pane(
        self,
        index: int,
        position: int,
        shared: SamplingParams,
        system_prompt: str = "",
        token_id: int = -1,
        text: str = "",
    ) -> bool:
        """Fork pane ``index``'s reply at token ``position`` (an alternative's id, or ``text``
        the user wrote) and race that fork on every pane; False (nothing changed) if refused."""
        return self.races.fork_pane(index, position, shared, system_prompt, token_id, text)

    def race(
        self,
        question: str,
        fork: Fork,
        shared: SamplingParams,
        system_prompt: str = "",
        earlier: list[Message] | None = None,
    ) -> None:
        """Send the fork once every pane has finished loading (a step sweep was just asked for)."""
        self.races.race(question, fork, shared, system_prompt, earlier)

    @Slot()
    def stop(self) -> None:
        """Stop every pane after its current token; partial replies are kept."""
        for pane in self.panes:
            pane.stop()

    def index_of(self, pane: Pane) -> int | None:
        return self.panes.index(pane) if pane in self.panes else None

    def _picked(self) -> tuple[list[Key], list[Key], list[Key]]:
        return self.session.picked()

    # ----- what the model slots did ----------------------------------------------------------

    def _pane_progress(self, pane: Pane, percent: int, message: str) -> None:
        if (i := self.index_of(pane)) is not None and pane.loading_target is not None:
            path, step = pane.loading_target
            self.session.set_loading(i, key_of(path, step or 0), percent, message)
            self.pane_loading.emit(i, percent, message)

    def _pane_loaded(self, pane: Pane, info: ModelInfo) -> None:
        self.races.pane_settled()
        if (i := self.index_of(pane)) is None:
            return
        self.session.set_loaded(i, info)
        self.session.panes[i].following.loaded(Path(info.path), info.step)
        self.pane_loaded.emit(i, info)
        self.memory.check()

    def _pane_notice(self, pane: Pane, level: str, title: str, message: str) -> None:
        if (i := self.index_of(pane)) is not None:
            self.notice.emit(level, f"Pane {LETTERS[i]}: {title[:1].lower()}{title[1:]}", message)

    def _pane_load_failed(self, pane: Pane, target: str, reason: str) -> None:
        self.races.pane_settled()
        if (i := self.index_of(pane)) is None:
            return
        self.session.set_load_failed(i, reason)
        self.pane_load_failed.emit(i, reason)
        self.notice.emit("error", f"Pane {LETTERS[i]}: could not load {target}", reason)

    def _pane_context(self, pane: Pane, prompt: Prompt) -> None:
        pane.run.context = prompt.usage()
        pane.run.prompt_ids = prompt.ids
        if prompt.truncated and (i := self.index_of(pane)) is not None:
            self.notice.emit(
                "warning",
                f"Pane {LETTERS[i]}: prompt truncated",
                "the prompt is longer than this model's context; only its end was used",
            )

    def _pane_token(self, pane: Pane, ev: TokenEvent) -> None:
        index = self.session.add_token(pane.state, ev)
        if index is not None and (i := self.index_of(pane)) is not None:
            self.pane_token.emit(i, index, ev)

    def _pane_failed(self, pane: Pane, reason: str) -> None:
        self._pane_finished(pane, {}, reason)

    def _pane_finished(self, pane: Pane, stats: dict, error: str | None = None) -> None:
        if not self.session.finish_run(pane.state, stats, error):
            return
        if (i := self.index_of(pane)) is None:
            return
        self.pane_finished.emit(i, pane.run.stats)
        if error:
            self.notice.emit("error", f"Pane {LETTERS[i]}: generation failed", error)
        self._update_busy()
        if not self.busy:
            self.scoring.report_same_model()  # after busy_changed, so the report is the last word
            self._load_waiting()

    def _update_busy(self) -> None:
        if self.busy != self._busy:
            self._busy = self.busy
            self.busy_changed.emit(self._busy)

    # ----- results ---------------------------------------------------------------------------

    def set_overlay(self, on: bool) -> None:
        """Show token probabilities. Replies generated without them are scored now to fill them in."""
        self.session.overlay = on
        if on and not self.busy:
            self.scoring.fill_probabilities()

    def cross_score(self, source: int) -> bool:
        """Score pane ``source``'s reply under every loaded pane's checkpoint (``cross_scored`` each)."""
        return self.scoring.cross_score(source)

    def cross_score_all(self) -> bool:
        """Every pane's reply under every pane: the agreement matrix (``agreement``)."""
        return self.scoring.cross_score_all()

    def agreement(self) -> list[list[float | None]]:
        return self.session.agreement()

    def same_model(self, a: int, b: int, text: str, shared: SamplingParams) -> bool:
        """Run panes ``a`` and ``b`` greedy on ``text``; ``same_model_reported`` follows."""
        return self.scoring.same_model(a, b, text, shared)

    # ----- Inside across steps (#45) ---------------------------------------------------------

    def inside_at(self, token: int) -> CompareInside:
        """Reply token ``token`` in every pane: each pane with a reply asks its own model (off the
        GUI thread) for the Inside at that token of its own reply; ``inside_changed`` follows
        now and as each pass ends."""
        inside = CompareInside(token)
        self.inside = inside
        for i, pane in enumerate(self.panes):
            run = pane.run
            step = run.model.get("step", pane.info.step if pane.info is not None else None)
            col = inside.column_for(run.trace, LETTERS[i], step)
            if col.line:
                continue
            info = pane.info
            if run.running:
                col.line = STILL
            elif run.model.get("family") == "remote" or (info is not None and info.family == "remote"):
                col.line = SERVED
            elif info is None or pane.is_loading:
                col.line = NOT_LOADED
            elif str(run.model.get("checkpoint", info.path)) != str(info.path) or step != info.step:
                col.line = "the model loaded is not the one that wrote this reply: load it to look inside"
            else:
                col.line = ASKING
                reply_ids = list(run.trace.ids)
                inside.asked[i] = (
                    pane.inside([*run.prompt_ids, *reply_ids], len(run.prompt_ids))
                    if run.prompt_ids is not None  # the ids the pane's model was fed
                    else pane.reply_inside(self.messages, reply_ids)
                )
        self.inside_changed.emit(inside)
        return inside

    def _on_inside_ready(self, request: int, cache: Any) -> None:
        from desktop.session.conversation import ReplyInside

        if self.inside is not None and self.inside.ready(request, ReplyInside.of_cache(cache)) is not None:
            self.inside_changed.emit(self.inside)

    def _on_inside_failed(self, request: int, reason: str) -> None:
        if self.inside is not None and self.inside.failed(request, reason) is not None:
            self.inside_changed.emit(self.inside)

    # ----- history and export ----------------------------------------------------------------

    def comparison(self) -> tuple[str, list[Message], dict]:
        """(title, [user, one assistant per pane with a reply], conversation meta) of the current run."""
        return self.session.comparison(self.cpu_scheduling())

    def save(self, title: str | None = None) -> int | None:
        """Store the comparison as a new 'compare' conversation; its id, or None when there is nothing."""
        return self.session.save(self.cpu_scheduling(), title)

    def export(self, fmt: str, target: Path) -> None:
        """Write the comparison as Markdown ("md") or JSON ("json", the conversation export format)."""
        title, messages, meta = self.comparison()
        text = to_json(title, messages, meta) if fmt == "json" else comparison_markdown(title, messages, meta)
        Path(target).write_text(text, encoding="utf-8")
        self.notice.emit("info", "Exported", f"saved {target}")

    def open_comparison(self, conv_id: int) -> bool:
        """Show a saved comparison again (its replies; the models are picked, not loaded)."""
        return self.session.open_comparison(conv_id)

    def _on_opened(self, prompt: str, shared: SamplingParams) -> None:
        for i in range(len(self.panes)):
            self.pane_refreshed.emit(i)
        self.comparison_opened.emit(prompt, shared)

    def shutdown(self) -> None:
        """Keep the session for the next start, stop every pane, then quit and wait for each
        worker thread."""
        self.session.persist(self.settings, self.cpu_scheduling())
        self.stop()
        for pane in self.panes:
            pane.shutdown()
        self.memory.shutdown()
