"""Compare view state: 2–4 panes, each with its own model slot (GUI thread only).

One prompt goes to every loaded pane with the same sampling values and seed (a pane may
override temperature, top-k and seed), so differences between the replies come from the
models. This object keeps every pane's reply token by token (a PaneRun), finds where same-seed
replies first diverge, diffs two replies token by token, scores one reply under every pane's
model, warns when the selected checkpoints will not fit in memory, and saves the comparison to
history as a ``compare`` conversation.

CPU scheduling: panes on the CPU share its cores. ``parallel`` runs every pane at once with
``cores // panes`` intra-op threads each; ``interleaved`` gives each pane all the cores but lets
only one compute at a time (a first-come lock around each token step). The default on CPU is the
one ``benchmarks/bench_compare_cpu.py`` measured faster; GPU panes always run in parallel.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from desktop import __version__
from desktop.config.settings import Settings
from desktop.engine.backend import ModelInfo, Prompt, StreamOptions
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.qt.compare.memory_check import Key, MemoryCheck
from desktop.qt.model.slot import ModelSlot
from desktop.qt.model.worker import TurnLock
from desktop.session.compare.analysis import (
    LETTERS,
    MAX_PANES,
    MIN_PANES,
    OVERRIDE_KEYS,
    DiffSpan,
    checkpoint_draft,
    cpu_cores,
    cpu_threads,
    cross_family_reason,
    draft_agreement,
    effective_params,
    first_divergence,
    same_tokenizer,
    sweep_steps,
    token_diff,
)
from desktop.session.compare.pane_run import Fork, PaneRun, fork_of
from desktop.session.compare.same_model import compare_replies
from desktop.store import HistoryStore
from desktop.store.export import comparison_markdown, to_json

TOP_ALTERNATIVES = 5
SCHEDULING_MODES = ("auto", "parallel", "interleaved")
# The faster CPU mode on the 2-core machine it was measured on (see the module doc and the bench).
CPU_DEFAULT_SCHEDULING = "parallel"
SWEEP_TEMPERATURES = (0.0, 0.6, 1.0, 1.4)
TITLE_CHARS = 48


class Pane(ModelSlot):
    """One pane: its model slot, the checkpoint picked, its overrides and its current reply."""

    def __init__(self, settings: Settings, parent: QObject) -> None:
        super().__init__(settings, parent, thread_name="nanoscope-compare-pane")
        self.selection: tuple[Path, int] | None = None
        self.overrides: dict[str, Any] = {}
        self.run = PaneRun()

    @property
    def loaded_key(self) -> tuple[Path, int] | None:
        info = self.info
        return (Path(info.path), int(info.step or 0)) if info is not None else None

    @property
    def ready(self) -> bool:
        return self.info is not None and not self.is_loading


class CompareController(QObject):
    """The panes of the Compare view. Pane indexes are positions (letters A–D follow them).

    Signals:
        pane_added(int), pane_removed(int): the pane row changed.
        pane_selected(int, Path, int): a pane's checkpoint choice changed here (sweeps, reopening).
        pane_overrides_changed(int, dict): a pane's overrides changed here (temperature sweep).
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
    pane_selected = Signal(int, Path, int)
    pane_overrides_changed = Signal(int, dict)
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
        self.prompt = ""
        self.system_prompt = ""
        self.shared = SamplingParams()
        self.draft = ""  # speculative decoding's draft for every pane that can (StreamOptions.draft)
        self.drafter: Pane | None = None  # or: this pane's checkpoint drafts for the others
        self.messages: list[Message] = []
        self.overlay = False
        self.diff_pair: tuple[int, int] | None = None
        self.divergence: int | None = None
        self.conv_id: int | None = None
        self._agreed = 0
        self._busy = False
        # A race waiting for its panes to load: (question, sampling, system prompt, earlier, fork).
        self._pending_race: tuple[str, SamplingParams, str, list[Message], Fork] | None = None
        self._same_model: tuple[Pane, Pane] | None = None  # a "Same model?" run in flight
        self._scores: dict[int, tuple[str, Pane, Pane]] = {}  # request -> (kind, source, scorer)
        self.memory = MemoryCheck(settings, self._picked, self)
        self.memory.checked.connect(self.memory_checked)
        for _ in range(MIN_PANES):
            self.add_pane()

    # ----- panes -----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return any(p.run.running for p in self.panes)

    def add_pane(self) -> bool:
        """One more pane (at most four), empty; False when there are already four."""
        if len(self.panes) >= MAX_PANES:
            return False
        pane = Pane(self.settings, self)
        pane.loading.connect(partial(self._pane_progress, pane))
        pane.loaded.connect(partial(self._pane_loaded, pane))
        pane.load_failed.connect(partial(self._pane_load_failed, pane))
        pane.notice.connect(partial(self._pane_notice, pane))
        pane.context.connect(partial(self._pane_context, pane))
        pane.token.connect(partial(self._pane_token, pane))
        pane.finished.connect(partial(self._pane_finished, pane))
        pane.failed.connect(partial(self._pane_failed, pane))
        pane.scored.connect(self._score_done)
        pane.score_failed.connect(lambda request, reason: self._score_done(request, {"error": reason}))
        self.panes.append(pane)
        self.pane_added.emit(len(self.panes) - 1)
        return True

    def remove_pane(self, index: int) -> bool:
        """Stop and shut down a pane's worker and drop it (never below two panes)."""
        if len(self.panes) <= MIN_PANES or not 0 <= index < len(self.panes):
            return False
        pane = self.panes.pop(index)
        if pane is self.drafter:
            self.drafter = None  # its checkpoint went with it: speculative decoding is off
        pane.shutdown()
        pane.deleteLater()
        self.pane_removed.emit(index)
        if self.diff_pair is not None and max(self.diff_pair) >= len(self.panes):
            self.diff_pair = (0, 1)
        self._recompute_divergence()
        self._update_diff()
        self._update_busy()
        self.memory.check()
        return True

    def select(self, index: int, path: Path, step: int) -> None:
        """The user picked a checkpoint in a pane (not loaded yet): re-check the memory needed."""
        self.panes[index].selection = (Path(path), int(step))
        self.memory.check()

    def load(self, index: int, path: Path, step: int) -> None:
        """Load ``path`` at ``step`` into pane ``index`` (a reply in progress there is stopped first)."""
        pane = self.panes[index]
        key = (Path(path), int(step))
        if pane.selection != key:
            pane.selection = key
            self.pane_selected.emit(index, key[0], key[1])
        if pane.loading_target == key or (not pane.is_loading and pane.loaded_key == key):
            return
        pane.load(*key)
        self.memory.check()

    def unload(self, index: int) -> None:
        """Free pane ``index``'s model; its last reply stays on screen."""
        self.panes[index].unload()
        if self.panes[index] is self.drafter:
            self.drafter = None
        self.pane_unloaded.emit(index)
        self.memory.check()

    def set_overrides(self, index: int, overrides: dict) -> None:
        """Per-pane temperature / top-k / seed; None (or a missing key) means the shared value."""
        pane = self.panes[index]
        pane.overrides = {k: overrides.get(k) for k in OVERRIDE_KEYS if overrides.get(k) is not None}
        self.pane_overrides_changed.emit(index, dict(pane.overrides))

    def step_sweep(self, entry: Any) -> list[int]:
        """Panes for up to four evenly spaced steps of one tag (a CheckpointEntry), the latest included."""
        if self.busy:
            return []
        steps = sweep_steps(entry.steps, MAX_PANES)
        count = max(MIN_PANES, len(steps))
        while len(self.panes) < count:
            self.add_pane()
        while len(self.panes) > count:
            self.remove_pane(len(self.panes) - 1)
        for i, step in enumerate(steps):
            self.set_overrides(i, {})
            self.load(i, Path(entry.path), step)
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
        self.drafter = self.panes[pane] if pane is not None else None
        self.draft = "" if pane is not None else draft
        self.memory.check()  # a pane's checkpoint as a draft is one more copy of it per pane

    def drafters(self) -> list[tuple[int, str]]:
        """(pane, draft name) of every pane whose loaded checkpoint can draft for the others."""
        named = [(i, checkpoint_draft(p.info)) for i, p in enumerate(self.panes) if p.info is not None]
        return [(i, name) for i, name in named if name]

    def _draft_for(self, pane: Pane) -> tuple[str, str]:
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
            ready = self._fork_ready(ready, fork)
            if not ready:
                return False
        self.system_prompt = system_prompt
        self.prompt = text
        self.shared = shared
        self.messages = [*(m.copy_text() for m in earlier or ()), Message.of_text("user", text)]
        if self.system_prompt.strip():
            self.messages.insert(0, Message.of_text("system", self.system_prompt))
        self.conv_id = None
        schedule = self._schedule(ready)
        self._say_plain(ready)
        for i, pane in enumerate(self.panes):
            pane.run = PaneRun()
            self.pane_refreshed.emit(i)
        for pane in ready:
            params = effective_params(self.shared, pane.overrides)
            assert pane.info is not None
            pane.run = PaneRun(params, pane.info.reply_meta(), dict(pane.overrides), running=True)
            options, lock = schedule[pane]
            draft, _plain = self._draft_for(pane)
            if draft:
                pane.run.reply.meta["draft"] = draft  # its footer says so
                options = replace(options, draft=draft, draft_k=self.settings.get("draft_k"))
            if fork is not None:
                # Each pane's reply holds what the fork said, with no probabilities: those were
                # the source model's, not this pane's.
                for ev in fork.said:
                    pane.run.add(replace(ev, logprob=None, top=None))
                pane.run.reply.meta["fork"] = {"at": len(fork.said)}
                options = replace(options, start=fork.start)
            pane.generate(self.messages, params, options, lock)
            self.pane_started.emit(self.panes.index(pane), params)
        self._recompute_divergence()
        self._update_diff()
        self._update_busy()
        return True

    def _say_plain(self, ready: list[Pane]) -> None:
        """With speculative decoding on, name the panes that decode plainly, and why."""
        why = {LETTERS[self.panes.index(p)]: self._draft_for(p)[1] for p in ready}
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
        if self.busy or not 0 <= index < len(self.panes) or not self.prompt:
            return False
        pane = self.panes[index]
        if pane.info is None:
            return False
        fork = fork_of(pane.run.trace, position, token_id, text, pane.info.tokenizer)
        if isinstance(fork, str):
            if fork:
                self.notice.emit("info", "Cannot fork there", fork)
            return False
        earlier = [m for m in self.messages if m.role != "system"][:-1]
        return self.send(self.prompt, shared, system_prompt, earlier, fork)

    def _fork_ready(self, ready: list[Pane], fork: Fork) -> list[Pane]:
        """The panes a fork can race on: its ids mean the same only under the same tokenizer."""
        same = [p for p in ready if p.info is not None and p.info.tokenizer == fork.tokenizer]
        others = [LETTERS[self.panes.index(p)] for p in ready if p not in same]
        if others:
            self.notice.emit(
                "warning",
                "Not raced on every pane",
                f"pane {', '.join(others)}: another tokenizer; a fork's tokens mean nothing there",
            )
        return same

    def race(
        self,
        question: str,
        fork: Fork,
        shared: SamplingParams,
        system_prompt: str = "",
        earlier: list[Message] | None = None,
    ) -> None:
        """Send the fork once every pane has finished loading (a step sweep was just asked for)."""
        self._pending_race = (question, shared, system_prompt, list(earlier or ()), fork)
        self._start_pending_race()

    def _start_pending_race(self) -> None:
        if self._pending_race is None or any(p.is_loading for p in self.panes) or self.busy:
            return
        question, shared, system_prompt, earlier, fork = self._pending_race
        self._pending_race = None
        self.send(question, shared, system_prompt, earlier, fork)

    def _schedule(self, ready: list[Pane]) -> dict[Pane, tuple[StreamOptions, TurnLock | None]]:
        """Per pane: stream options (log-probabilities, CPU threads) and the shared turn lock of
        interleaved CPU panes. Each run starts from an empty cache, so every pane computes the
        same thing whatever it answered before."""
        top = TOP_ALTERNATIVES if self.overlay or self._same_model else 0
        plan: dict[Pane, tuple[StreamOptions, TurnLock | None]] = {
            p: (StreamOptions(logprobs=top, reuse_cache=False), None) for p in ready
        }
        cpu = [p for p in ready if p.info is not None and p.info.device.startswith("cpu")]
        mode = self.cpu_scheduling()
        lock = TurnLock() if mode == "interleaved" and len(cpu) > 1 else None
        for pane, threads in zip(cpu, cpu_threads(mode, len(cpu), cpu_cores()), strict=True):
            plan[pane] = (StreamOptions(logprobs=top, threads=threads, reuse_cache=False), lock)
        return plan

    @Slot()
    def stop(self) -> None:
        """Stop every pane after its current token; partial replies are kept."""
        for pane in self.panes:
            pane.stop()

    def _index(self, pane: Pane) -> int | None:
        return self.panes.index(pane) if pane in self.panes else None

    def _picked(self) -> tuple[list[Key], list[Key], list[Key]]:
        """What the memory check weighs: the checkpoints picked in the panes, those loaded, and a
        copy of the drafting pane's checkpoint for each pane that loads it as its draft (loaded
        too where that pane's last reply drafted with it: it still holds it)."""
        selected = [p.selection for p in self.panes if p.selection]
        loaded = [p.loaded_key for p in self.panes if p.loaded_key]
        if self.drafter is None or (drafted := self.drafter.loaded_key) is None:
            return selected, loaded, []
        drafts = [(p, draft) for p in self.panes if (draft := self._draft_for(p)[0])]
        loaded += [drafted for p, draft in drafts if p.run.stats.get("draft") == draft]
        return selected, loaded, [drafted] * len(drafts)

    def _pane_progress(self, pane: Pane, percent: int, message: str) -> None:
        if (i := self._index(pane)) is not None:
            self.pane_loading.emit(i, percent, message)

    def _pane_loaded(self, pane: Pane, info: ModelInfo) -> None:
        QTimer.singleShot(0, self, self._start_pending_race)  # after the pane's own handlers
        if (i := self._index(pane)) is None:
            return
        self.pane_loaded.emit(i, info)
        self.memory.check()

    def _pane_notice(self, pane: Pane, level: str, title: str, message: str) -> None:
        if (i := self._index(pane)) is not None:
            self.notice.emit(level, f"Pane {LETTERS[i]}: {title[:1].lower()}{title[1:]}", message)

    def _pane_load_failed(self, pane: Pane, target: str, reason: str) -> None:
        QTimer.singleShot(0, self, self._start_pending_race)
        if (i := self._index(pane)) is None:
            return
        self.pane_load_failed.emit(i, reason)
        self.notice.emit("error", f"Pane {LETTERS[i]}: could not load {target}", reason)

    def _pane_context(self, pane: Pane, prompt: Prompt) -> None:
        pane.run.context = prompt.usage()
        if prompt.truncated and (i := self._index(pane)) is not None:
            self.notice.emit(
                "warning",
                f"Pane {LETTERS[i]}: prompt truncated",
                "the prompt is longer than this model's context; only its end was used",
            )

    def _pane_token(self, pane: Pane, ev: TokenEvent) -> None:
        if not pane.run.running:
            return
        index = pane.run.add(ev)
        if (i := self._index(pane)) is None:
            return
        self.pane_token.emit(i, index, ev)
        if not ev.continues and self.divergence is None:
            self._advance_divergence()

    def _pane_failed(self, pane: Pane, reason: str) -> None:
        self._pane_finished(pane, {}, reason)

    def _pane_finished(self, pane: Pane, stats: dict, error: str | None = None) -> None:
        if not pane.run.running:
            return
        run = pane.run
        run.running = False
        run.stats = dict(stats) if error is None else {"error": error}
        if error is None and run.reply.meta.get("draft"):
            run.stats["draft"] = run.reply.meta["draft"]
        run.error = error
        if (i := self._index(pane)) is None:
            return
        self.pane_finished.emit(i, run.stats)
        if error:
            self.notice.emit("error", f"Pane {LETTERS[i]}: generation failed", error)
        if self.divergence is None:
            self._advance_divergence()
        if not self.busy:
            self._update_diff()
        self._update_busy()
        if not self.busy:
            self._report_same_model()  # after busy_changed, so the report is the last word

    def _update_busy(self) -> None:
        if self.busy != self._busy:
            self._busy = self.busy
            self.busy_changed.emit(self._busy)

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

    def _advance_divergence(self) -> None:
        if not self.comparable():
            return
        runs = self._compared_runs()
        found, self._agreed = first_divergence(
            _comparable_tokens(runs), [not r.running for r in runs], self._agreed
        )
        if found is not None:
            self.divergence = found
            self.divergence_changed.emit(found)

    def _recompute_divergence(self) -> None:
        self.divergence, self._agreed = None, 0
        self.divergence_changed.emit(None)
        self._advance_divergence()

    def set_diff_pair(self, a: int | None, b: int | None = None) -> None:
        """Diff the replies of panes ``a`` and ``b`` token by token; None switches the diff off."""
        if a is None or b is None or a == b:
            self.diff_pair = None
        else:
            self.diff_pair = (a, b)
        self._update_diff()

    def diff(self) -> tuple[int, int, list[DiffSpan]] | None:
        if self.diff_pair is None or self.busy:
            return None
        a, b = self.diff_pair
        if max(a, b) >= len(self.panes):
            return None
        ta, tb = _comparable_tokens([self.panes[a].run, self.panes[b].run])
        return a, b, token_diff(ta, tb)

    def _update_diff(self) -> None:
        self.diff_changed.emit(self.diff())

    # ----- probabilities and cross-scoring ---------------------------------------------------

    def set_overlay(self, on: bool) -> None:
        """Show token probabilities. Replies generated without them are scored now to fill them in."""
        self.overlay = on
        if not on or self.busy:
            return
        for pane in self.panes:
            run, info = pane.run, pane.info
            same_model = (
                info is not None
                and pane.ready
                and info.capabilities.scoring
                and (info.path, info.step) == (run.model.get("checkpoint"), run.model.get("step"))
            )
            if run.trace.has_ids and not run.trace.has_logprobs and same_model:
                self._request_score("own", pane, pane, TOP_ALTERNATIVES)

    def cross_score(self, source: int) -> bool:
        """Score pane ``source``'s reply under every loaded pane's checkpoint (``cross_scored`` each)."""
        src = self.panes[source]
        if self.busy or not src.run.trace.ids:
            self.notice.emit("info", "Nothing to score", f"pane {LETTERS[source]} has no finished reply")
            return False
        src.run.cross_scores = {}
        for i, scorer in enumerate(self.panes):
            if scorer.info is None or not scorer.ready:
                continue
            reason = self._cannot_score(src.run, scorer.info)
            if reason:
                result = {"error": reason}
                src.run.cross_scores[LETTERS[i]] = result
                self.cross_scored.emit(source, i, result)
                continue
            if not same_tokenizer(src.run.model, scorer.info.reply_meta()):
                result = {"error": "another tokenizer: the reply's token ids mean other text here"}
                src.run.cross_scores[LETTERS[i]] = result
                self.cross_scored.emit(source, i, result)
                continue
            self._request_score("cross", src, scorer, 1)  # top-1: the draft agreement
        return True

    def cross_score_all(self) -> bool:
        """Every pane's reply under every pane: the agreement matrix (``agreement``)."""
        sources = [i for i, p in enumerate(self.panes) if p.run.trace.ids]
        if self.busy or len(sources) < 2:
            self.notice.emit("info", "Nothing to score", "the matrix needs two finished replies")
            return False
        return all([self.cross_score(i) for i in sources])

    def agreement(self) -> list[list[float | None]]:
        """Row r, column c: how often pane r's checkpoint's most likely token is pane c's reply's
        token (greedy speculative decoding's acceptance rate, pane r drafting for pane c);
        None where it was not scored. The diagonal is a reply under its own checkpoint."""
        return [
            [p.run.cross_scores.get(LETTERS[r], {}).get("agreement") for p in self.panes]
            for r in range(len(self.panes))
        ]

    @staticmethod
    def _cannot_score(run: PaneRun, scorer: ModelInfo) -> str:
        """Why ``scorer`` cannot score ``run``'s reply, or "" when it can."""
        if not scorer.capabilities.scoring:
            return scorer.capabilities.why_not("scoring") or "this model cannot score a given reply"
        if not run.trace.has_ids:
            return "the reply has no token ids to score"
        return ""

    def _request_score(self, kind: str, source: Pane, scorer: Pane, top: int) -> None:
        skip = (
            source.run.trace.forced if kind == "cross" else None
        )  # forced tokens were not the model's choice
        request = scorer.score(self.messages, list(source.run.trace.ids), top, skip)
        self._scores[request] = (kind, source, scorer)

    def _score_done(self, request_id: int, result: dict) -> None:
        entry = self._scores.pop(request_id, None)
        if entry is None:
            return
        kind, source, scorer = entry
        si, ti = self._index(source), self._index(scorer)
        if si is None or ti is None:
            return
        if kind == "own":
            top = result.get("top")
            if top is not None and len(top) == len(source.run.trace):
                source.run.trace.set_logprobs(result["token_logprobs"], top)
                self.pane_refreshed.emit(si)
            return
        trace = source.run.trace
        # Only the model's own choices count: not the calculator's, the user's, or a race's start.
        fork = source.run.reply.meta.get("fork")
        at = fork.get("at", 0) if isinstance(fork, dict) else 0
        skip = [f or g or i < at for i, (f, g) in enumerate(zip(trace.forced, trace.given, strict=True))]
        agreement = draft_agreement(trace.ids, skip, result.get("top") or [])
        result = {k: v for k, v in result.items() if k != "top"}
        result["agreement"] = agreement
        result["checkpoint"] = scorer.info.name if scorer.info is not None else "?"
        source.run.cross_scores[LETTERS[ti]] = result
        self.cross_scored.emit(si, ti, result)

    # ----- "Same model?" ---------------------------------------------------------------------

    def same_model(self, a: int, b: int, text: str, shared: SamplingParams) -> bool:
        """Run panes ``a`` and ``b`` (say a local checkpoint and its served copy) greedy on ``text``
        with ``shared``'s seed and length, asking for log-probabilities; ``same_model_reported``
        follows."""
        if self.busy or not (self.panes[a].ready and self.panes[b].ready) or a == b:
            return False
        for i in (a, b):
            self.set_overrides(i, {})
        self._same_model = (self.panes[a], self.panes[b])
        if not self.send(text, shared.with_values(temperature=0.0), self.system_prompt):
            self._same_model = None
            return False
        return True

    def _report_same_model(self) -> None:
        pair, self._same_model = self._same_model, None
        if pair is None:
            return
        ia, ib = self._index(pair[0]), self._index(pair[1])
        if ia is None or ib is None:
            return
        ra, rb = pair[0].run, pair[1].run
        if ra.error or rb.error:
            return  # the failure was reported already
        by_ids = ra.trace.has_ids and rb.trace.has_ids and same_tokenizer(ra.model, rb.model)
        self.same_model_reported.emit(ia, ib, compare_replies(ra.trace, rb.trace, by_ids))

    # ----- history and export ----------------------------------------------------------------

    def has_result(self) -> bool:
        return any(p.run.has_reply for p in self.panes)

    def comparison(self) -> tuple[str, list[Message], dict]:
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
            "scheduling": self.cpu_scheduling(),
            "app_version": __version__,
        }
        if diff is not None:
            a, b, spans = diff
            meta["diff"] = {"a": LETTERS[a], "b": LETTERS[b], "spans": [s.to_dict() for s in spans]}
        return title, messages, meta

    def save(self, title: str | None = None) -> int | None:
        """Store the comparison as a new 'compare' conversation; its id, or None when there is nothing."""
        if self.busy or not self.has_result():
            return None
        default_title, messages, meta = self.comparison()
        self.conv_id = self.store.import_conversation(title or default_title, messages, "compare", meta)
        if self.store.last_error:
            self.notice.emit("warning", "History not saved yet", self.store.last_error)
        self.saved.emit(self.conv_id)
        return self.conv_id

    def export(self, fmt: str, target: Path) -> None:
        """Write the comparison as Markdown ("md") or JSON ("json", the conversation export format)."""
        title, messages, meta = self.comparison()
        text = to_json(title, messages, meta) if fmt == "json" else comparison_markdown(title, messages, meta)
        Path(target).write_text(text, encoding="utf-8")
        self.notice.emit("info", "Exported", f"saved {target}")

    def open_comparison(self, conv_id: int) -> bool:
        """Show a saved comparison again (its replies; the models are picked, not loaded)."""
        if self.busy:
            return False
        meta = self.store.conversation_meta(conv_id)
        messages = [m for _, m in self.store.active_path(conv_id)]
        replies = [m for m in messages if m.role == "assistant"][:MAX_PANES]
        user = next((m for m in messages if m.role == "user"), None)
        count = max(MIN_PANES, len(replies))
        while len(self.panes) < count:
            self.add_pane()
        while len(self.panes) > count:
            self.remove_pane(len(self.panes) - 1)
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
                pane.selection = (Path(ckpt), step)
                self.pane_selected.emit(i, Path(ckpt), step)
            self.set_overrides(i, pane.run.overrides)
            self.pane_refreshed.emit(i)
        self.comparison_opened.emit(self.prompt, self.shared)
        self._recompute_divergence()
        self._update_diff()
        return True

    def shutdown(self) -> None:
        """Stop every pane, then quit and wait for each worker thread."""
        self.stop()
        for pane in self.panes:
            pane.shutdown()
        self.memory.shutdown()


def _comparable_tokens(runs: list[PaneRun]) -> list[list]:
    """Token ids when every reply has them, else every reply's token texts (a served model that
    gives text only is compared by text with the rest)."""
    if all(r.trace.has_ids or not r.trace.ids for r in runs):
        return [r.tokens for r in runs]
    return [list(r.trace.texts) for r in runs]
