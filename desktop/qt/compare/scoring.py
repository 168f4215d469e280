"""Scoring replies under the panes' models for Compare: probabilities filled in afterwards,
cross-scores (one reply under every pane's checkpoint, the agreement matrix) and the "Same
model?" run. The requests go to the panes' model slots; the results land in the session's runs
and are announced through the controller's signals (GUI thread only).
"""

from __future__ import annotations

from typing import Any, Protocol

from PySide6.QtCore import QObject, Slot

from desktop.engine.backend import ModelInfo
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.qt.compare.pane_slot import Pane
from desktop.session.compare.analysis import LETTERS, draft_agreement, same_tokenizer
from desktop.session.compare.pane_run import PaneRun
from desktop.session.compare.same_model import compare_replies
from desktop.session.compare.session import CompareSession

TOP_ALTERNATIVES = 5


class Host(Protocol):
    """What scoring needs of the Compare controller (which imports this module)."""

    panes: list[Pane]
    notice: Any
    cross_scored: Any
    pane_refreshed: Any
    same_model_reported: Any
    session: CompareSession

    @property
    def busy(self) -> bool: ...
    @property
    def messages(self) -> list[Message]: ...
    def index_of(self, pane: Pane) -> int | None: ...
    def set_overrides(self, index: int, overrides: dict) -> None: ...
    def send(self, text: str, shared: SamplingParams, system_prompt: str = "") -> bool: ...


class Scoring(QObject):
    """Score requests in flight and what to do with their results (a child of the controller)."""

    def __init__(self, controller: Host, parent: QObject) -> None:
        super().__init__(parent)
        self.c = controller
        self._scores: dict[int, tuple[str, Pane, Pane]] = {}  # request -> (kind, source, scorer)
        self._same_model: tuple[Pane, Pane] | None = None  # a "Same model?" run in flight

    @property
    def same_model_pending(self) -> bool:
        return self._same_model is not None

    def fill_probabilities(self) -> None:
        """Score the replies generated without probabilities under the model that wrote them."""
        for pane in self.c.panes:
            run, info = pane.run, pane.info
            same_model = (
                info is not None
                and pane.ready
                and info.capabilities.scoring
                and (info.path, info.step) == (run.model.get("checkpoint"), run.model.get("step"))
            )
            if run.trace.has_ids and not run.trace.has_logprobs and same_model:
                self._request("own", pane, pane, TOP_ALTERNATIVES)

    def cross_score(self, source: int) -> bool:
        """Score pane ``source``'s reply under every loaded pane's checkpoint (``cross_scored`` each)."""
        c = self.c
        src = c.panes[source]
        if c.busy or not src.run.trace.ids:
            c.notice.emit("info", "Nothing to score", f"pane {LETTERS[source]} has no finished reply")
            return False
        src.run.cross_scores = {}
        for i, scorer in enumerate(c.panes):
            if scorer.info is None or not scorer.ready:
                continue
            reason = cannot_score(src.run, scorer.info)
            if not reason and not same_tokenizer(src.run.model, scorer.info.reply_meta()):
                reason = "another tokenizer: the reply's token ids mean other text here"
            if reason:
                result = {"error": reason}
                src.run.cross_scores[LETTERS[i]] = result
                c.cross_scored.emit(source, i, result)
                continue
            self._request("cross", src, scorer, 1)  # top-1: the draft agreement
        return True

    def cross_score_all(self) -> bool:
        """Every pane's reply under every pane: the agreement matrix."""
        c = self.c
        sources = [i for i, p in enumerate(c.panes) if p.run.trace.ids]
        if c.busy or len(sources) < 2:
            c.notice.emit("info", "Nothing to score", "the matrix needs two finished replies")
            return False
        return all([self.cross_score(i) for i in sources])

    def _request(self, kind: str, source: Pane, scorer: Pane, top: int) -> None:
        # Forced tokens were not the model's choice.
        skip = source.run.trace.forced if kind == "cross" else None
        request = scorer.score(self.c.messages, list(source.run.trace.ids), top, skip)
        self._scores[request] = (kind, source, scorer)

    @Slot(int, dict)
    def done(self, request_id: int, result: dict) -> None:
        entry = self._scores.pop(request_id, None)
        if entry is None:
            return
        kind, source, scorer = entry
        si, ti = self.c.index_of(source), self.c.index_of(scorer)
        if si is None or ti is None:
            return
        if kind == "own":
            top = result.get("top")
            if top is not None and len(top) == len(source.run.trace):
                source.run.trace.set_logprobs(result["token_logprobs"], top)
                self.c.pane_refreshed.emit(si)
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
        self.c.cross_scored.emit(si, ti, result)

    # ----- "Same model?" ---------------------------------------------------------------------

    def same_model(self, a: int, b: int, text: str, shared: SamplingParams) -> bool:
        """Run panes ``a`` and ``b`` (say a local checkpoint and its served copy) greedy on ``text``
        with ``shared``'s seed and length, asking for log-probabilities; ``same_model_reported``
        follows."""
        c = self.c
        if c.busy or not (c.panes[a].ready and c.panes[b].ready) or a == b:
            return False
        for i in (a, b):
            c.set_overrides(i, {})
        self._same_model = (c.panes[a], c.panes[b])
        if not c.send(text, shared.with_values(temperature=0.0), c.session.system_prompt):
            self._same_model = None
            return False
        return True

    def report_same_model(self) -> None:
        pair, self._same_model = self._same_model, None
        if pair is None:
            return
        ia, ib = self.c.index_of(pair[0]), self.c.index_of(pair[1])
        if ia is None or ib is None:
            return
        ra, rb = pair[0].run, pair[1].run
        if ra.error or rb.error:
            return  # the failure was reported already
        by_ids = ra.trace.has_ids and rb.trace.has_ids and same_tokenizer(ra.model, rb.model)
        self.c.same_model_reported.emit(ia, ib, compare_replies(ra.trace, rb.trace, by_ids))


def cannot_score(run: PaneRun, scorer: ModelInfo) -> str:
    """Why ``scorer`` cannot score ``run``'s reply, or "" when it can."""
    if not scorer.capabilities.scoring:
        return scorer.capabilities.why_not("scoring") or "this model cannot score a given reply"
    if not run.trace.has_ids:
        return "the reply has no token ids to score"
    return ""
