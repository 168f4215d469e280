"""Compare view state: 2–4 panes, each with its own checkpoint and worker thread (GUI thread only).

One prompt goes to every loaded pane with the same sampling values and seed (a pane may
override temperature, top-k and seed), so differences between the replies come from the
checkpoints. This object keeps every pane's reply token by token (ids, text, part kind, forced
flag, log-probabilities), finds where same-seed replies first diverge, diffs two replies token by
token, scores one reply under every pane's checkpoint, warns when the selected checkpoints will
not fit in memory, and saves the comparison to history as a ``compare`` conversation.

CPU scheduling: panes on the CPU share its cores. ``parallel`` runs every pane at once with
``cores // panes`` intra-op threads each; ``interleaved`` gives each pane all the cores but lets
only one compute at a time (a first-come lock around each token step). The default on CPU is the
one ``benchmarks/bench_compare_cpu.py`` measured faster; GPU panes always run in parallel.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import os
import re
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import shiboken6
from PySide6.QtCore import QObject, Signal, Slot

from . import __version__
from .engine import memory
from .engine.discovery import PHASES, CheckpointSummary, summarize
from .engine.messages import (
    PYTHON,
    PYTHON_OUTPUT,
    TEXT,
    THOUGHT,
    TOOL_QUERY,
    TOOL_RESULT,
    Message,
    TokenEvent,
)
from .settings import Settings
from .store import HistoryStore
from .store.export import to_json
from .worker import TurnLock, WorkerHost

MIN_PANES, MAX_PANES = 2, 4
LETTERS = "ABCD"
TOP_ALTERNATIVES = 5
SCHEDULING_MODES = ("auto", "parallel", "interleaved")
# The faster CPU mode on the 2-core machine it was measured on (see the module doc and the bench).
CPU_DEFAULT_SCHEDULING = "parallel"
SWEEP_TEMPERATURES = (0.0, 0.6, 1.0, 1.4)
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_tokens", "seed")
OVERRIDE_KEYS = ("temperature", "top_k", "seed")
# What a reply records about the model that wrote it.
CHECKPOINT_KEYS = (
    "checkpoint",
    "source",
    "tag",
    "step",
    "era",
    "device",
    "dtype",
    "meta_hash",
    "tokenizer",
    "vocab_size",
)
TITLE_CHARS = 48
_FENCES = {PYTHON: "python", PYTHON_OUTPUT: "output", TOOL_QUERY: "tool-call", TOOL_RESULT: "tool-output"}


# ----- pure helpers ---------------------------------------------------------------------------


def sweep_steps(steps: Sequence[int], count: int = MAX_PANES) -> list[int]:
    """Up to ``count`` evenly spaced steps of ``steps``, the first and the latest included."""
    ordered = sorted(set(steps))
    if len(ordered) <= count:
        return ordered
    picks = sorted({round(i * (len(ordered) - 1) / (count - 1)) for i in range(count)})
    return [ordered[i] for i in picks]


def first_divergence(
    runs: Sequence[Sequence[int]], complete: Sequence[bool], start: int = 0
) -> tuple[int | None, int]:
    """(index where the token lists first differ or None, length known to agree so far).

    A list that has ended while another has a token at that index diverges there. A list still
    streaming that has not reached the index yet leaves the answer open (None), and the returned
    length lets the next call start where this one stopped, so streaming costs O(new tokens).
    """
    i = start
    while True:
        have = [i < len(r) for r in runs]
        if all(have):
            if any(r[i] != runs[0][i] for r in runs[1:]):
                return i, i
            i += 1
            continue
        ended = any(not h and done for h, done in zip(have, complete, strict=True))
        return (i if ended and any(have) else None), i


@dataclass(frozen=True)
class DiffSpan:
    """A token range that differs between reply A (``a_start:a_end``) and reply B (``b_start:b_end``).

    ``tag`` is difflib's: "delete" (only in A), "insert" (only in B) or "replace" (both sides differ).
    """

    tag: str
    a_start: int
    a_end: int
    b_start: int
    b_end: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def token_diff(a: Sequence[int], b: Sequence[int]) -> list[DiffSpan]:
    """The differing spans between two token-id lists (no junk heuristics: every token counts)."""
    matcher = difflib.SequenceMatcher(None, list(a), list(b), autojunk=False)
    return [DiffSpan(tag, i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def effective_params(shared: dict, overrides: dict) -> dict:
    """The sampling values a pane runs with: the shared ones, then its overrides that are set."""
    params = {k: shared[k] for k in SAMPLING_KEYS if k in shared}
    params.update({k: v for k, v in overrides.items() if k in OVERRIDE_KEYS and v is not None})
    return params


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_options(mode: str, count: int, cores: int) -> list[dict]:
    """Worker options for ``count`` panes sharing ``cores`` CPU cores under ``mode``.

    One pane keeps the defaults. "parallel": each gets ``cores // count`` intra-op threads and
    all compute at once. "interleaved": each keeps every core but waits its turn per token.
    """
    if count < 2:
        return [{} for _ in range(count)]
    if mode == "interleaved":
        lock = TurnLock()
        return [{"threads": cores, "step_lock": lock} for _ in range(count)]
    return [{"threads": max(1, cores // count)} for _ in range(count)]


def is_cpu(info: dict | None) -> bool:
    return str((info or {}).get("device", "cpu")).startswith("cpu")


def checkpoint_label(meta: dict) -> str:
    """A pane's checkpoint as "sft/d20 · step 1,500"."""
    step = meta.get("step")
    where = "/".join(x for x in (meta.get("source"), meta.get("tag")) if x) or "?"
    return f"{where} · step {step:,}" if isinstance(step, int) else where


def describe_sampling(params: dict) -> str:
    """Sampling values as "greedy" or "T 0.8 · top-k 50 · seed 42"."""
    if params.get("temperature") == 0:
        return "greedy"
    bits = [f"T {params.get('temperature', 1.0):g}"]
    if params.get("top_k"):
        bits.append(f"top-k {params['top_k']}")
    if params.get("seed") is not None:
        bits.append(f"seed {params['seed']}")
    return " · ".join(bits)


def _file_digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return path


def same_tokenizer(a: dict, b: dict) -> bool:
    """Whether token ids mean the same text in two loaded models (same file, or same bytes)."""
    ta, tb = a.get("tokenizer"), b.get("tokenizer")
    if not ta or not tb or a.get("vocab_size") != b.get("vocab_size"):
        return False
    return ta == tb or _file_digest(ta) == _file_digest(tb)


# ----- per-pane state -------------------------------------------------------------------------


@dataclass
class PaneRun:
    """One pane's reply to the current prompt, token by token, with what produced it."""

    params: dict = field(default_factory=dict)
    checkpoint: dict = field(default_factory=dict)  # path, source, tag, step, era, device, dtype, tokenizer
    tokens: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # the clean text each token added
    kinds: list[str] = field(default_factory=list)  # the message part each token belongs to
    specials: list[str | None] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    # Per token: (logprob of the token, [[id, label, logprob] x TOP_ALTERNATIVES]) or None.
    logprobs: list[tuple[float, list] | None] = field(default_factory=list)
    message: Message = field(default_factory=lambda: Message("assistant"))
    stats: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)
    cross_scores: dict[str, dict] = field(default_factory=dict)  # scoring pane letter -> score
    error: str | None = None
    running: bool = False
    _early_logprobs: dict[int, tuple[float, list]] = field(default_factory=dict)

    def add(self, ev: TokenEvent) -> int:
        """Record one streamed event; the index of the token its text belongs to."""
        if ev.text and (ev.special is None or ev.kind != TEXT):
            self.message.append(ev.kind, ev.text)
        if ev.id < 0:  # the decoder's held-back tail: more text of the last token
            if self.texts:
                self.texts[-1] += ev.text
            return len(self.tokens) - 1
        self.tokens.append(ev.id)
        self.texts.append(ev.text)
        self.kinds.append(ev.kind)
        self.specials.append(ev.special)
        self.forced.append(ev.forced)
        self.logprobs.append(self._early_logprobs.pop(len(self.tokens) - 1, None))
        return len(self.tokens) - 1

    def note_logprobs(self, index: int, entry: tuple[float, list]) -> None:
        """The worker reports a token's log-probabilities just before the token itself."""
        if index < len(self.logprobs):
            self.logprobs[index] = entry
        else:
            self._early_logprobs[index] = entry

    @property
    def has_logprobs(self) -> bool:
        return bool(self.tokens) and all(lp is not None for lp in self.logprobs)

    def to_meta(self, letter: str) -> dict:
        """Everything needed to show this reply again (and to know what wrote it)."""
        meta: dict[str, Any] = {
            "pane": letter,
            **{k: self.checkpoint.get(k) for k in CHECKPOINT_KEYS},
            "seed": self.params.get("seed"),
            "sampling": {k: self.params.get(k) for k in SAMPLING_KEYS},
            "stats": dict(self.stats),
            "token_ids": list(self.tokens),
            "token_texts": list(self.texts),
            "token_kinds": list(self.kinds),
            "token_specials": list(self.specials),
            "token_forced": list(self.forced),
            "app_version": __version__,
        }
        if self.has_logprobs:
            meta["token_logprobs"] = [lp[0] for lp in self.logprobs if lp is not None]
            meta["top_logprobs"] = [lp[1] for lp in self.logprobs if lp is not None]
        if self.cross_scores:
            meta["cross_scores"] = copy.deepcopy(self.cross_scores)
        if self.error:
            meta["error"] = self.error
        return meta

    @classmethod
    def from_message(cls, message: Message) -> PaneRun:
        """The reverse of ``to_meta`` for a saved assistant message."""
        m = message.meta
        tokens = [int(t) for t in m.get("token_ids", [])]
        n = len(tokens)
        chosen, top = m.get("token_logprobs"), m.get("top_logprobs")
        logprobs = (
            [(float(c), t) for c, t in zip(chosen, top, strict=True)]
            if chosen is not None and top is not None and len(chosen) == n
            else [None] * n
        )
        return cls(
            params=dict(m.get("sampling") or {}),
            checkpoint={k: m.get(k) for k in CHECKPOINT_KEYS},
            tokens=tokens,
            texts=list(m.get("token_texts") or [""] * n),
            kinds=list(m.get("token_kinds") or [TEXT] * n),
            specials=list(m.get("token_specials") or [None] * n),
            forced=[bool(f) for f in m.get("token_forced") or [False] * n],
            logprobs=logprobs,
            message=Message("assistant", copy.deepcopy(message.parts), {}),
            stats=dict(m.get("stats") or {}),
            cross_scores=dict(m.get("cross_scores") or {}),
            error=m.get("error"),
        )


def checkpoint_meta(info: dict) -> dict:
    """The part of a loaded model's info a reply records."""
    path = Path(info.get("path", ""))
    return {
        "checkpoint": info.get("path"),
        "source": PHASES.get(path.parent.name, "folder"),
        "tag": path.name,
        **{k: info.get(k) for k in CHECKPOINT_KEYS if k not in ("checkpoint", "source", "tag")},
    }


class Pane(QObject):
    """One pane: its worker thread, the checkpoint picked and loaded, overrides and the current reply.

    Lives on the GUI thread, so the worker's signals reach these slots queued; each slot hands
    the event to the controller together with the pane it came from. The controller is found
    as the Qt parent, never kept in an attribute: a Python reference cycle between QObjects
    would leave them to the cyclic garbage collector, which may run on a worker thread and
    delete them there.
    """

    def __init__(self, controller: CompareController) -> None:
        super().__init__(controller)
        self.host = WorkerHost(self)
        self.host.thread.setObjectName("nanoscope-compare-pane")
        self.selection: tuple[Path, int] | None = None
        self.loading: tuple[Path, int] | None = None
        self.info: dict | None = None
        self.overrides: dict[str, Any] = {}
        self.run = PaneRun()
        self.request = 0
        w = self.host.worker
        w.progress.connect(self._on_progress)
        w.loaded.connect(self._on_loaded)
        w.load_failed.connect(self._on_load_failed)
        w.context.connect(self._on_context)
        w.logprobs.connect(self._on_logprobs)
        w.token.connect(self._on_token)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.scored.connect(self._on_scored)

    @property
    def controller(self) -> CompareController | None:
        """The owning controller; None once the pane was removed."""
        parent = self.parent()
        return parent if isinstance(parent, CompareController) else None

    @property
    def loaded_key(self) -> tuple[Path, int] | None:
        return (Path(self.info["path"]), int(self.info["step"])) if self.info else None

    @Slot(int, str)
    def _on_progress(self, percent: int, message: str) -> None:
        if (c := self.controller) is not None:
            c._pane_progress(self, percent, message)

    @Slot(dict)
    def _on_loaded(self, info: dict) -> None:
        if (c := self.controller) is not None:
            c._pane_loaded(self, info)

    @Slot(str)
    def _on_load_failed(self, reason: str) -> None:
        if (c := self.controller) is not None:
            c._pane_load_failed(self, reason)

    @Slot(int, dict)
    def _on_context(self, request_id: int, ctx: dict) -> None:
        if request_id == self.request and (c := self.controller) is not None:
            c._pane_context(self, ctx)

    @Slot(int, int, object)
    def _on_logprobs(self, request_id: int, index: int, entry: object) -> None:
        if request_id == self.request:
            self.run.note_logprobs(index, entry)  # type: ignore[arg-type]

    @Slot(int, object)
    def _on_token(self, request_id: int, ev: TokenEvent) -> None:
        if request_id == self.request and self.run.running and (c := self.controller) is not None:
            c._pane_token(self, ev)

    @Slot(int, dict)
    def _on_finished(self, request_id: int, stats: dict) -> None:
        if request_id == self.request and self.run.running and (c := self.controller) is not None:
            c._pane_finished(self, stats, None)

    @Slot(int, str)
    def _on_failed(self, request_id: int, reason: str) -> None:
        if (c := self.controller) is None:
            return
        if request_id == self.request and self.run.running:
            c._pane_finished(self, {}, reason)
        else:
            c._score_done(request_id, {"error": reason})

    @Slot(int, dict)
    def _on_scored(self, request_id: int, result: dict) -> None:
        if (c := self.controller) is not None:
            c._score_done(request_id, result)


# ----- the controller -------------------------------------------------------------------------


class CompareController(QObject):
    """The panes of the Compare view. Pane indexes are positions (letters A–D follow them).

    Signals:
        pane_added(int), pane_removed(int): the pane row changed.
        pane_selected(int, Path, int): a pane's checkpoint choice changed here (sweeps, reopening).
        pane_overrides_changed(int, dict): a pane's overrides changed here (temperature sweep).
        pane_loading(int, int, str), pane_loaded(int, dict), pane_load_failed(int, str),
            pane_unloaded(int): model state per pane.
        pane_started(int, dict): a pane began replying with these sampling values.
        pane_token(int, int, object, object): pane, token index, TokenEvent, log-probabilities
            (see ``PaneRun.logprobs``) or None. An event with id -1 adds text to that token.
        pane_finished(int, dict): the pane's stats (``{"error": …}`` when it failed).
        pane_refreshed(int): the pane's reply was replaced or completed (probabilities filled in
            later, a saved comparison reopened); redraw it from ``panes[i].run``.
        busy_changed(bool): any pane is replying, or none is.
        divergence_changed(object): first index where same-seed replies differ, or None.
        diff_changed(object): (pane a, pane b, [DiffSpan]) or None.
        cross_scored(int, int, dict): source pane, scoring pane, score (or {"error": …}).
        memory_checked(bool, str): whether the selected checkpoints fit, and a message if not.
        comparison_opened(str, dict): a saved comparison was reopened (prompt, shared sampling).
        saved(int): the comparison was stored as this conversation.
        notice(str, str, str): level, title, message.
    """

    pane_added = Signal(int)
    pane_removed = Signal(int)
    pane_selected = Signal(int, Path, int)
    pane_overrides_changed = Signal(int, dict)
    pane_loading = Signal(int, int, str)
    pane_loaded = Signal(int, dict)
    pane_load_failed = Signal(int, str)
    pane_unloaded = Signal(int)
    pane_started = Signal(int, dict)
    pane_token = Signal(int, int, object, object)
    pane_finished = Signal(int, dict)
    pane_refreshed = Signal(int)
    busy_changed = Signal(bool)
    divergence_changed = Signal(object)
    diff_changed = Signal(object)
    cross_scored = Signal(int, int, dict)
    memory_checked = Signal(bool, str)
    comparison_opened = Signal(str, dict)
    saved = Signal(int)
    notice = Signal(str, str, str)

    _summary_ready = Signal(object, object)  # from the summary thread: (path, step), summary

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
        self.shared: dict[str, Any] = {}
        self.messages: list[Message] = []
        self.overlay = False
        self.diff_pair: tuple[int, int] | None = None
        self.divergence: int | None = None
        self.conv_id: int | None = None
        self.last_memory: tuple[bool, int, int, str] | None = None
        self._agreed = 0
        self._busy = False
        self._next_request = 0
        self._scores: dict[int, tuple[str, Pane, Pane]] = {}  # request -> (kind, source, scorer)
        self._summaries: dict[tuple[Path, int], CheckpointSummary] = {}
        self._summarizing: set[tuple[Path, int]] = set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nanoscope-compare-summary")
        self._summary_ready.connect(self._on_summary)
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
        self.panes.append(Pane(self))
        self.pane_added.emit(len(self.panes) - 1)
        return True

    def remove_pane(self, index: int) -> bool:
        """Stop and shut down a pane's worker and drop it (never below two panes)."""
        if len(self.panes) <= MIN_PANES or not 0 <= index < len(self.panes):
            return False
        pane = self.panes.pop(index)
        _dispose(pane)
        pane.setParent(None)  # late queued events find no controller; the pane dies with its last reference
        pane.deleteLater()
        self.pane_removed.emit(index)
        if self.diff_pair is not None and max(self.diff_pair) >= len(self.panes):
            self.diff_pair = (0, 1)
        self._recompute_divergence()
        self._update_diff()
        self._update_busy()
        self._check_memory()
        return True

    def select(self, index: int, path: Path, step: int) -> None:
        """The user picked a checkpoint in a pane (not loaded yet): re-check the memory needed."""
        self.panes[index].selection = (Path(path), int(step))
        self._check_memory()

    def load(self, index: int, path: Path, step: int) -> None:
        """Load ``path`` at ``step`` into pane ``index`` (a reply in progress there is stopped first)."""
        pane = self.panes[index]
        key = (Path(path), int(step))
        if pane.selection != key:
            pane.selection = key
            self.pane_selected.emit(index, key[0], key[1])
        if pane.loading == key or (pane.loading is None and pane.loaded_key == key):
            return
        if pane.run.running:
            pane.host.stop()
        pane.loading = key
        options = {"step": key[1], "device": self.settings.get("device"), "dtype": self.settings.get("dtype")}
        self.pane_loading.emit(index, 0, f"loading {key[0].name} step {key[1]}")
        pane.host.load(str(key[0]), options)
        self._check_memory()

    def unload(self, index: int) -> None:
        """Free pane ``index``'s model; its last reply stays on screen."""
        pane = self.panes[index]
        if pane.run.running:
            pane.host.stop()
        pane.host.unload()
        pane.info = None
        self.pane_unloaded.emit(index)
        self._check_memory()

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

    # ----- generation ------------------------------------------------------------------------

    def cpu_scheduling(self) -> str:
        """How CPU panes share the cores: "parallel" or "interleaved"."""
        return CPU_DEFAULT_SCHEDULING if self.scheduling == "auto" else self.scheduling

    def send(self, text: str, shared: dict) -> bool:
        """Send ``text`` to every loaded pane; False (nothing changed) if refused."""
        text = text.strip()
        if not text or self.busy:
            return False
        ready = [p for p in self.panes if p.info is not None and p.loading is None]
        if not ready:
            self.notice.emit("warning", "No model loaded", "load a checkpoint in at least one pane first")
            return False
        shared = dict(shared)
        self.system_prompt = str(shared.pop("system_prompt", "") or "")
        self.prompt = text
        self.shared = {k: shared[k] for k in SAMPLING_KEYS if k in shared}
        self.messages = [Message.of_text("user", text)]
        if self.system_prompt.strip():
            self.messages.insert(0, Message.of_text("system", self.system_prompt))
        self.conv_id = None
        options = self._schedule(ready)
        for i, pane in enumerate(self.panes):
            pane.run = PaneRun()
            self.pane_refreshed.emit(i)
        for pane in ready:
            self._next_request += 1
            pane.request = self._next_request
            params = effective_params(self.shared, pane.overrides)
            pane.run = PaneRun(params=params, checkpoint=checkpoint_meta(pane.info or {}), running=True)
            pane.host.generate_detailed(pane.request, copy.deepcopy(self.messages), params, options[pane])
            self.pane_started.emit(self.panes.index(pane), params)
        self._recompute_divergence()
        self._update_diff()
        self._update_busy()
        return True

    def _schedule(self, ready: list[Pane]) -> dict[Pane, dict]:
        """Per pane: the worker options (log-probabilities, CPU threads or the shared turn lock)."""
        top = TOP_ALTERNATIVES if self.overlay else 0
        options: dict[Pane, dict] = {p: {"logprobs": top} for p in ready}
        cpu = [p for p in ready if is_cpu(p.info)]
        for pane, extra in zip(cpu, cpu_options(self.cpu_scheduling(), len(cpu), cpu_cores()), strict=True):
            options[pane].update(extra)
        return options

    @Slot()
    def stop(self) -> None:
        """Stop every pane after its current token; partial replies are kept."""
        for pane in self.panes:
            pane.host.stop()

    def _index(self, pane: Pane) -> int | None:
        return self.panes.index(pane) if pane in self.panes else None

    def _pane_progress(self, pane: Pane, percent: int, message: str) -> None:
        if (i := self._index(pane)) is not None:
            self.pane_loading.emit(i, percent, message)

    def _pane_loaded(self, pane: Pane, info: dict) -> None:
        pane.loading = None
        pane.info = info
        if (i := self._index(pane)) is None:
            return
        self.pane_loaded.emit(i, info)
        for warning in info.get("warnings", []):
            self.notice.emit("warning", f"Pane {LETTERS[i]}: checkpoint warning", warning)
        self._check_memory()

    def _pane_load_failed(self, pane: Pane, reason: str) -> None:
        failed = pane.loading
        pane.loading = None
        if (i := self._index(pane)) is None:
            return
        self.pane_load_failed.emit(i, reason)
        where = f"{failed[0]} step {failed[1]}" if failed else "checkpoint"
        self.notice.emit("error", f"Pane {LETTERS[i]}: could not load {where}", reason)

    def _pane_context(self, pane: Pane, ctx: dict) -> None:
        pane.run.context = dict(ctx)
        if ctx.get("truncated") and (i := self._index(pane)) is not None:
            self.notice.emit(
                "warning",
                f"Pane {LETTERS[i]}: prompt truncated",
                "the prompt is longer than this model's context; only its end was used",
            )

    def _pane_token(self, pane: Pane, ev: TokenEvent) -> None:
        index = pane.run.add(ev)
        if (i := self._index(pane)) is None:
            return
        lp = pane.run.logprobs[index] if ev.id >= 0 else None
        self.pane_token.emit(i, index, ev, lp)
        if ev.id >= 0 and self.divergence is None:
            self._advance_divergence()

    def _pane_finished(self, pane: Pane, stats: dict, error: str | None) -> None:
        run = pane.run
        run.running = False
        run.stats = dict(stats) if error is None else {"error": error}
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
        greedy = all(r.params.get("temperature") == 0 for r in runs)
        return greedy or len({r.params.get("seed") for r in runs}) == 1

    def _advance_divergence(self) -> None:
        if not self.comparable():
            return
        runs = self._compared_runs()
        found, self._agreed = first_divergence(
            [r.tokens for r in runs], [not r.running for r in runs], self._agreed
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
        return a, b, token_diff(self.panes[a].run.tokens, self.panes[b].run.tokens)

    def _update_diff(self) -> None:
        self.diff_changed.emit(self.diff())

    # ----- probabilities and cross-scoring ---------------------------------------------------

    def set_overlay(self, on: bool) -> None:
        """Show token probabilities. Replies generated without them are scored now to fill them in."""
        self.overlay = on
        if not on or self.busy:
            return
        for pane in self.panes:
            run = pane.run
            same_model = (
                pane.info is not None
                and pane.loading is None
                and (
                    (pane.info.get("path"), pane.info.get("step"))
                    == (run.checkpoint.get("checkpoint"), run.checkpoint.get("step"))
                )
            )
            if run.tokens and not run.has_logprobs and same_model:
                self._request_score("own", pane, pane, TOP_ALTERNATIVES)

    def cross_score(self, source: int) -> bool:
        """Score pane ``source``'s reply under every loaded pane's checkpoint (``cross_scored`` each)."""
        src = self.panes[source]
        if self.busy or not src.run.tokens:
            self.notice.emit("info", "Nothing to score", f"pane {LETTERS[source]} has no finished reply")
            return False
        src.run.cross_scores = {}
        for i, scorer in enumerate(self.panes):
            if scorer.info is None or scorer.loading is not None:
                continue
            if not same_tokenizer(src.run.checkpoint, scorer.info):
                result = {"error": "another tokenizer: the reply's token ids mean other text here"}
                src.run.cross_scores[LETTERS[i]] = result
                self.cross_scored.emit(source, i, result)
                continue
            self._request_score("cross", src, scorer, 0)
        return True

    def _request_score(self, kind: str, source: Pane, scorer: Pane, top: int) -> None:
        self._next_request += 1
        self._scores[self._next_request] = (kind, source, scorer)
        skip = source.run.forced if kind == "cross" else None  # forced tokens were not the model's choice
        scorer.host.score(self._next_request, copy.deepcopy(self.messages), source.run.tokens, top, skip)

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
            if top is not None and len(top) == len(source.run.tokens):
                source.run.logprobs = list(zip(result["token_logprobs"], top, strict=True))
                self.pane_refreshed.emit(si)
            return
        result = {k: v for k, v in result.items() if k != "top"}
        result["checkpoint"] = checkpoint_label(checkpoint_meta(scorer.info or {}))
        source.run.cross_scores[LETTERS[ti]] = result
        self.cross_scored.emit(si, ti, result)

    # ----- memory ----------------------------------------------------------------------------

    def _check_memory(self) -> None:
        """Estimate the memory of every pane's selected checkpoint against what is free (async)."""
        keys = {p.selection for p in self.panes if p.selection} | {
            p.loaded_key for p in self.panes if p.loaded_key
        }
        missing = [k for k in keys if k is not None and k not in self._summaries]
        for key in missing:
            if key not in self._summarizing:
                self._summarizing.add(key)
                future = self._executor.submit(summarize, *key)
                future.add_done_callback(lambda f, key=key: self._summary_ready.emit(key, _result(f)))
        if missing:
            return
        selected = [self._summaries[p.selection] for p in self.panes if p.selection]
        loaded = [self._summaries[p.loaded_key] for p in self.panes if p.loaded_key]
        self.last_memory = memory.fits(
            selected, self.settings.get("device"), self.settings.get("dtype"), loaded=loaded
        )
        ok, _needed, _available, message = self.last_memory
        self.memory_checked.emit(ok, message)

    @Slot(object, object)
    def _on_summary(self, key: tuple[Path, int], summary: CheckpointSummary | None) -> None:
        self._summarizing.discard(key)
        if summary is not None:
            self._summaries[key] = summary
            self._check_memory()

    # ----- history and export ----------------------------------------------------------------

    def has_result(self) -> bool:
        return any(p.run.tokens or p.run.error for p in self.panes)

    def comparison(self) -> tuple[str, list[Message], dict]:
        """(title, [user, one assistant per pane with a reply], conversation meta) of the current run."""
        title = "Compare: " + (self.prompt[:TITLE_CHARS].splitlines() or ["prompt"])[0]
        messages = [Message.of_text("user", self.prompt)]
        letters = []
        for i, pane in enumerate(self.panes):
            if pane.run.tokens or pane.run.error:
                run = pane.run
                messages.append(
                    Message("assistant", copy.deepcopy(run.message.parts), run.to_meta(LETTERS[i]))
                )
                letters.append(LETTERS[i])
        diff = self.diff()
        meta: dict[str, Any] = {
            "kind": "compare",
            "prompt": self.prompt,
            "system_prompt": self.system_prompt,
            "shared_sampling": dict(self.shared),
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
        self.shared = dict(meta.get("shared_sampling") or {})
        self.messages = [Message.of_text("user", self.prompt)]
        if self.system_prompt.strip():
            self.messages.insert(0, Message.of_text("system", self.system_prompt))
        self.conv_id = conv_id
        for i, pane in enumerate(self.panes):
            pane.run = PaneRun.from_message(replies[i]) if i < len(replies) else PaneRun()
            ckpt, step = pane.run.checkpoint.get("checkpoint"), pane.run.checkpoint.get("step")
            if ckpt and isinstance(step, int) and Path(ckpt).is_dir():
                pane.selection = (Path(ckpt), step)
                self.pane_selected.emit(i, Path(ckpt), step)
            self.pane_refreshed.emit(i)
        self.comparison_opened.emit(self.prompt, dict(self.shared))
        self._recompute_divergence()
        self._update_diff()
        return True

    def shutdown(self) -> None:
        """Stop every pane, then quit and wait for each worker thread."""
        self.stop()
        for pane in self.panes:
            _dispose(pane)
        self._executor.shutdown(wait=True, cancel_futures=True)


def _dispose(pane: Pane) -> None:
    """Shut a pane's worker thread down, then delete the worker object here, on the GUI thread.

    Left to Python, the worker could be freed by the cyclic garbage collector on whatever thread
    happens to run it (torch's lazy imports during a first load tie the loading frame, and with
    it the worker, into a reference cycle), and a QObject must not be deleted from a random thread.
    """
    if pane.host.shutdown():
        shiboken6.delete(pane.host.worker)


def _result(future: Future) -> CheckpointSummary | None:
    return None if future.cancelled() or future.exception() is not None else future.result()


def _part_markdown(kind: str, text: str) -> str:
    if kind == TEXT:
        return text.strip("\n")
    if kind == THOUGHT:
        return "\n".join("> " + line if line else ">" for line in text.strip("\n").split("\n"))
    # A fence longer than any backtick run inside, so code containing ``` cannot end it early.
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = text if text.endswith("\n") else text + "\n"
    return f"{fence}{_FENCES.get(kind, kind)}\n{body}{fence}"


def comparison_markdown(title: str, messages: list[Message], meta: dict) -> str:
    """A readable report: the prompt, a table of panes, the divergence, each reply, cross-scores."""
    replies = [m for m in messages if m.role == "assistant"]
    lines = [f"# {title}", "", "**Prompt**", ""]
    lines += ["> " + line if line else ">" for line in str(meta.get("prompt", "")).split("\n")]
    lines += ["", "| pane | checkpoint | sampling | tokens | tok/s | TTFT |", "|---|---|---|--:|--:|--:|"]
    for m in replies:
        stats = m.meta.get("stats") or {}
        tok_s = f"{stats['decode_tok_s']:.1f}" if stats.get("decode_tok_s") else "–"
        ttft = f"{stats['ttft_ms']:.0f} ms" if stats.get("ttft_ms") else "–"
        lines.append(
            f"| {m.meta.get('pane', '?')} | {checkpoint_label(m.meta)} | "
            f"{describe_sampling(m.meta.get('sampling') or {})} | {len(m.meta.get('token_ids', []))} | "
            f"{tok_s} | {ttft} |"
        )
    divergence = meta.get("divergence")
    lines.append("")
    if divergence is not None:
        lines.append(f"The replies first differ at token {divergence}.")
    for m in replies:
        lines += ["", f"## {m.meta.get('pane', '?')} · {checkpoint_label(m.meta)}", ""]
        lines += [md for p in m.parts if (md := _part_markdown(p.kind, p.text))] or ["*(empty reply)*"]
        if m.meta.get("error"):
            lines += ["", f"*Failed: {m.meta['error']}*"]
    scored = [m for m in replies if m.meta.get("cross_scores")]
    if scored:
        lines += [
            "",
            "## Cross-scores",
            "",
            "| reply | scored by | bits/byte | mean log p |",
            "|---|---|--:|--:|",
        ]
        for m in scored:
            for letter, s in m.meta["cross_scores"].items():
                bpb = f"{s['bits_per_byte']:.3f}" if s.get("bits_per_byte") is not None else "–"
                mean = (
                    f"{s['mean_logprob']:.3f}" if s.get("mean_logprob") is not None else s.get("error", "–")
                )
                lines.append(f"| {m.meta.get('pane')} | {letter} | {bpb} | {mean} |")
    return "\n".join(lines) + "\n"
