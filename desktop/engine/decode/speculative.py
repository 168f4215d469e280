"""Speculative decoding: a cheap draft proposes tokens, the target checks them in one pass.

Batch-1 decoding on a CPU is memory bound: one step streams every weight to emit one token, and
a pass over a few tokens costs about the same as a pass over one. A draft (the target's own int8
or 16-bit copy, or an earlier or smaller checkpoint with the same tokenizer) proposes ``k``
tokens; the target computes its distributions at all of them in one pass over the pending token
and the proposals, and rejection sampling (Leviathan et al. 2023; Chen et al. 2023) keeps draft
token ``x`` with probability ``min(1, p(x) / q(x))``; at the first rejection it samples from
``max(0, p - q)`` renormalised, and when every proposal is kept it samples one more token from
the target. The tokens streamed are then distributed exactly as the target's own: ``p`` and
``q`` are both :func:`~.sampling.next_token_probs`, the distribution the plain loop draws from
(temperature, top-k, top-p, min-p, the repetition penalty over every token before the position).
Greedy decoding keeps a draft token when it is the target's most likely one.

What it cannot keep is nanochat's seeded random stream (the draws are others), so it is a named
option (``StreamOptions.draft``), never on by itself; a seed still repeats a reply, because
how many tokens are drafted depends only on how many were accepted and on the measured costs
(:class:`DraftLength`), and those are measured once per model and machine and kept
(:class:`~.pass_timing.Decisions`), so the next session repeats it too.

The calculator's forced tokens and the user's given tokens are never drafted: they are known, so
they go through the target as a block (for their probabilities); the draft stops proposing after
a token that would end the reply or close a calculator call (``generation``'s state machine, run
on a copy of the row). After a rejection both caches roll back with ``truncate`` (exact for every
era: the caches keep per-position histories).

A draft may read the target's own states (the fork's MTP head reads the target's last hidden
state, ``Draft.follow``); such a draft proposes one token a round (``Draft.cap``), since the
state at the token it proposes is the verifying pass's to compute.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from desktop.engine.backend import GenerationStats, StreamOptions
from desktop.engine.calculator import calculate
from desktop.engine.decode.compiled_draft import CompiledTwin, Switched, take_compiled
from desktop.engine.decode.compiled_step import CompiledStep
from desktop.engine.decode.drafts import DraftSpec, parse_draft
from desktop.engine.decode.generation import PartTracker, Row, Specials, _step_row, replay_row, stream_reply
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.pass_timing import TIMED_ROWS, Decisions, rounded_cost, timed_ms
from desktop.engine.decode.protocols import DecodingModel, Tokenizer
from desktop.engine.decode.sampling import GreedyFallback, draw_token, next_token_probs
from desktop.engine.decode.scoring import token_label
from desktop.engine.decode.verifier import Verifier
from desktop.engine.errors import ContextError, NanoscopeError
from desktop.engine.foreground import hold_background
from desktop.engine.kernels.gemv import few_rows
from desktop.engine.kernels.memory import release_freed_memory
from desktop.engine.kernels.threads import torch_threads
from desktop.engine.messages import TokenEvent
from desktop.engine.params import SamplingParams

logger = logging.getLogger(__name__)

# The most tokens drafted in one adaptive round (with the pending token, the verifying pass stays
# within kernels.gemv.FEW_ROWS rows); a draft's own cap (Draft.cap) may be lower.
K_MAX = 6
# What the acceptance rate is taken to be before a reply has drafted anything.
PRIOR_ACCEPTANCE = 0.8
# What a drafting round costs besides its passes, as a share of one target step: the draft
# catching up on the tokens decoded since it last ran, the rounds' bookkeeping, the caches'
# rollbacks. Without it, rounds the costs said would gain up to 14% lost 10-20% on a 2-core
# AMD EPYC, and at 0.25 a draft that was never right still cost 18% in probes (docs/
# PERFORMANCE.md, speculative); at 0.35 neither drafts there.
ROUND_COST = 0.35
# The kept decisions of a draft (pass_timing.Decisions): its measured costs, and whether its
# compiled forward is faster (and its cost then).
COSTS = "costs"
DRAFT_COMPILED = "draft compiled"
# The weight of the latest round in the running acceptance rate.
SMOOTHING = 0.3
# The highest acceptance a draft length is chosen for. A rate of 1.0 comes from a few proposals
# (a probe's two), and a draft whose step and check cost 0.9 of a target step pays at 1.0 (by 4%,
# at k = 6) but loses half its speed when one proposal in four is rejected: the d12 int8
# self-draft ran 0.79x of plain on a 2-core AMD EPYC until its lengths were chosen for at most this.
MAX_ACCEPTANCE = 0.95
# After falling back to plain decoding, the draft is tried again (PROBE_K tokens) after
# PROBE_FIRST plain tokens, then after twice as many, at most MAX_PROBES times in a reply.
PROBE_K = 2
PROBE_FIRST = 16
MAX_PROBES = 3
# A draft that has proposed this many tokens in a reply and had fewer than GIVE_UP_RATE of them
# kept is unrelated to the target: it is not probed again (a probe costs the draft's catching up
# on every token decoded meanwhile). Nor is one whose probe kept nothing when nothing was kept
# before it in the reply.
GIVE_UP_AFTER = 8
GIVE_UP_RATE = 0.1


# (logits (B, V), params, history (B, N) or None, told of rows that fell back) -> (B, V) probabilities
ProbsFn = Callable[[torch.Tensor, SamplingParams, torch.Tensor | None, GreedyFallback | None], torch.Tensor]


def _any_result(_expr: str) -> object:
    """The calculator as drafting sees it (on a copy of the row): every call has a result, so
    the draft stops at any call's end without evaluating it."""
    return 0


@dataclass
class Draft:
    """A model that proposes tokens for a target whose token ids mean the same (the backends make
    one from ``StreamOptions.draft``). ``limit``: the most positions it attends to;
    ``new_cache(capacity)`` makes its cache, which is kept between requests like the target's
    (prefix reuse). ``cost``: one draft step as a share of one target step; ``verify_cost``:
    each row a target pass has beyond the first, as a share of one target step (both measured
    on this machine by :func:`measure_costs` when the draft is made).

    ``cap``: the most tokens it can propose in a round, whatever is asked (None: as many as
    asked). ``needs``: the fewest tokens the sequence must hold before it can propose.
    ``follow(cache, target_cache)``: for a draft that reads the target's own states, called when
    a reply starts (before either cache is trimmed) and when its costs are measured. The fork's
    MTP head has all three: it reads the target's hidden state at the token before the last, so
    it proposes one token a round, and only after the sequence's second token.

    ``twin``: its forward being compiled on a thread of its own (:mod:`.compiled_draft`);
    :meth:`settle` adopts it at a reply's start once ready and faster, and ``compiled`` says so.

    ``decisions``: where its measured costs and whether its compiled form is faster are kept for
    this target and draft on this machine (:mod:`.pass_timing`); ``renewed``: one of them was
    made anew over an earlier one, and no reply has said so yet."""

    model: DecodingModel
    name: str
    limit: int
    new_cache: Callable[[int], Any]
    cost: float = 1.0
    verify_cost: float = 1.0
    cache: Any = None
    cap: int | None = None
    needs: int = 1
    follow: Callable[[Any, Any], None] | None = None
    twin: CompiledTwin | None = None
    decisions: Decisions = field(default_factory=lambda: Decisions(None, ""))
    renewed: bool = False

    def pays(self, draft_k: int = 0, verifier: Verifier | None = None) -> bool:
        """Whether a speculative reply can beat plain decoding: some ``k`` must pay even when every
        proposal is kept, or ``verifier``'s compiled one-row passes must (else the backend decodes
        plainly); a fixed ``draft_k`` always drafts."""
        return draft_k > 0 or not self.length(0, verifier).hopeless

    def length(self, draft_k: int, verifier: Verifier | None) -> DraftLength:
        """How a reply chooses its draft lengths: with this draft's costs, and ``verifier``'s
        where the target's passes run its compiled twin."""
        base, verify_cost = (1.0, self.verify_cost) if verifier is None else verifier.costs(self.verify_cost)
        return DraftLength(self.cost, verify_cost, draft_k, self.cap, base)

    def rate(self) -> float:
        """Tokens per unit of cost (one target step is 1) at the acceptance rate a reply starts
        with, drafting the best length its cap allows: how :func:`cheapest` ranks drafts."""
        length = DraftLength(self.cost, self.verify_cost, cap=self.cap)
        return length.gain(PRIOR_ACCEPTANCE, length.best(PRIOR_ACCEPTANCE))

    def why_not_paying(self) -> str:
        """Why a reply with this draft decodes plainly from its start: its measured costs say no
        draft length can beat a plain step, as the footer says it."""
        copy = re.fullmatch(r"self \((.+)\)", self.name)
        what = f"{copy[1]} copy" if copy else self.name
        device = self.model.device.type
        where = {"cpu": "this CPU", "cuda": "this GPU", "mps": "this GPU"}.get(device, f"this {device}")
        compiling = " (still compiling)" if self.twin is not None and not self.twin.done.is_set() else ""
        return f"{what} not faster on {where}{compiling}: drafted nothing"

    @property
    def compiled(self) -> bool:
        """Whether it drafts with its compiled forward (:meth:`settle` adopted it)."""
        return isinstance(self.model, Switched)

    @torch.inference_mode()
    def settle(self, threads: int | None = None) -> None:
        """Once the compile of :attr:`twin` has ended: time a step of the compiled form and of the
        eager one here (the worker's thread, with the compile thread gone and ``threads`` as the
        reply will use), and draft with the compiled form from now on if it is faster; its cost
        then shrinks in proportion. Called at a reply's start; nothing happens while it compiles."""
        twin = self.twin
        switched = take_compiled(self, self.model)
        if switched is None:
            if twin is not None and twin.error is not None:  # ended without code: not again
                self.decisions.give_up(DRAFT_COMPILED, twin.error)
            return

        def measure() -> dict[str, float]:
            with torch_threads(threads):
                eager_ms = timed_ms(self.model, self.new_cache, 1)
                compiled_ms = timed_ms(switched, self.new_cache, 1)
            logger.info(
                "draft %s: a step takes %.2f ms eager, %.2f ms compiled", self.name, eager_ms, compiled_ms
            )
            if compiled_ms >= eager_ms:
                return {"compiled": 0.0}
            return {"compiled": 1.0, "cost": rounded_cost(self.cost * compiled_ms / eager_ms)}

        with torch_threads(threads):  # kept per thread count, as the reply will run
            kept, renewed = self.decisions.remember(DRAFT_COMPILED, measure)
        self.renewed |= renewed
        if kept.get("compiled") == 1.0:
            self.model = switched
            self.cost = kept.get("cost", self.cost)

    def let_go(self) -> None:
        """Nobody drafts with it any more: a compile of its forward under way ends (a later
        session may try it again: only a failed or slower compile is kept as not worth it)."""
        if self.twin is not None:
            self.twin.stop()
            self.twin = None

    def should_compile(self) -> bool:
        """Whether compiling its forward may pay: not when it was found slower here before. One
        found faster takes its kept cost now, so the rounds before its compile ends draft as
        many tokens as those after (the same ids for a seed, within float rounding)."""
        kept = self.decisions.recall(DRAFT_COMPILED)
        if kept.get("compiled") == 1.0:
            self.cost = kept.get("cost", self.cost)
        return kept.get("compiled") != 0.0


@torch.inference_mode()
def measure_costs(target: DecodingModel, target_cache: Callable[[int], Any], draft: Draft) -> None:
    """Time one draft step, one target step and a target pass over :data:`TIMED_ROWS` rows, and
    set ``draft.cost`` and ``draft.verify_cost`` (:mod:`.pass_timing` says why measured), as
    kept by ``draft.decisions`` where this machine measured them before."""

    def measure() -> dict[str, float]:
        step = timed_ms(target, target_cache, 1)
        draft_cache = draft.new_cache if draft.follow is None else _following(target, target_cache, draft)
        cost = rounded_cost(timed_ms(draft.model, draft_cache, 1) / step)
        wide = timed_ms(target, target_cache, TIMED_ROWS)
        return {"cost": cost, "verify_cost": rounded_cost((wide / step - 1) / (TIMED_ROWS - 1))}

    kept, renewed = draft.decisions.remember(COSTS, measure)
    draft.renewed |= renewed
    # A damaged file may lack one: a cost of 1 (a target step) is the safe side, rarely drafting.
    draft.cost, draft.verify_cost = kept.get("cost", 1.0), kept.get("verify_cost", 1.0)


def _following(
    target: DecodingModel, target_cache: Callable[[int], Any], draft: Draft
) -> Callable[[int], Any]:
    """Caches for timing a draft that reads the target's states: each follows a target cache
    that holds them for every position it is timed at (the target's pass is not timed)."""
    follow = draft.follow
    assert follow is not None

    def make(capacity: int) -> Any:
        cache, held = draft.new_cache(capacity), target_cache(capacity)
        follow(cache, held)
        target(torch.zeros(1, capacity, dtype=torch.long, device=target.device), held, last_only=True)
        return cache

    return make


def ready_draft(
    model: DecodingModel,
    name: str,
    limit: int,
    new_cache: Callable[[int], Any],
    target: DecodingModel,
    target_cache: Callable[[int], Any],
    decisions: Decisions | None = None,
) -> Draft:
    """A :class:`Draft` of ``model`` for ``target``, its costs measured (or as ``decisions`` kept
    them: the draft's own, :meth:`Decisions.under` the target's)."""
    draft = Draft(model, name, limit, new_cache)
    if decisions is not None:
        draft.decisions = decisions
    measure_costs(target, target_cache, draft)
    return draft


def cheapest(makers: Sequence[Callable[[], Draft]]) -> Draft:
    """The draft that yields the most tokens per unit of measured cost (:meth:`Draft.rate`; of
    equal rates, the cheaper step) among those ``makers`` build, one after the other (the others
    are dropped as soon as one does better). Of drafts that may propose as many tokens, that is
    the one of least cost. Which reduced precision is fastest depends on the CPU: on a 2-core AMD
    EPYC (AVX2) a depth-20 model's int8 step takes 0.86 of its exact fp32 step and its fp16 step
    0.66; on CPUs with int8 dot-product instructions int8 may win. The fork's MTP head costs one
    block and the head, but proposes one token a round. The costs are kept (:func:`measure_costs`),
    so the next session picks the same draft (another draft: other ids for a seed)."""
    best: Draft | None = None
    for make in makers:
        draft = make()
        if best is None or (draft.rate(), -draft.cost) > (best.rate(), -best.cost):
            best = draft
        del draft
        release_freed_memory()
    assert best is not None
    return best


class DraftSlot:
    """The draft a backend was last asked for, kept loaded (with its cache) until another is named
    or a reply is asked for without one."""

    def __init__(self) -> None:
        self._held: tuple[str, Draft] | None = None

    def get(self, text: str, make: Callable[[DraftSpec], Draft]) -> Draft:
        """The draft ``text`` names, made by ``make`` unless it is the one held; a problem is one
        line naming the draft."""
        if self._held is None or self._held[0] != text:
            self.clear()  # the old one's memory goes before the new one loads
            spec = parse_draft(text)
            try:
                draft = make(spec)
            except NanoscopeError as exc:
                raise type(exc)(f"draft {spec.text}: {exc}") from None
            self._held = (text, draft)
        return self._held[1]

    def forget_cache(self) -> None:
        if self._held is not None:
            self._held[1].cache = None

    def for_reply(self, text: str, named: Callable[[str], Draft]) -> Draft | None:
        """The draft a reply streams with: ``named(text)`` (a backend's ``draft``), or None when
        ``text`` names none, which lets a held draft go (speculative decoding turned off gives
        its memory back at once: a checkpoint draft is a whole model)."""
        if not text:
            self.clear()
            return None
        return named(text)

    def clear(self) -> None:
        if self._held is not None:
            self._held[1].let_go()  # a compile under way need not warm up what nobody holds
        self._held = None


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one round yields when each of ``k`` proposals is kept with probability ``acceptance``."""
    return float(sum(acceptance**i for i in range(k + 1)))


class DraftLength:
    """How many tokens to draft next: the ``k`` that yields the most tokens per unit of cost at the
    acceptance rate seen so far (raised while proposals are kept, lowered when they are not);
    0, plain decoding, when no ``k`` pays, with a few later probes in case the draft recovers.
    It depends on the acceptance only (and the draft's measured costs, kept per model and machine
    by :class:`~.pass_timing.Decisions`), so a seed repeats its reply, in the next session too.
    ``fixed`` > 0 drafts that many every round, whatever is kept. ``cap``: the draft's own most
    (:attr:`Draft.cap`), which bounds both."""

    def __init__(
        self, cost: float, verify_cost: float, fixed: int = 0, cap: int | None = None, base: float = 1.0
    ) -> None:
        self.cost = cost
        self.verify_cost = verify_cost
        self.base = base
        self.fixed = fixed if cap is None else min(fixed, cap)
        self.longest = K_MAX if cap is None else min(K_MAX, cap)
        self.acceptance = PRIOR_ACCEPTANCE
        self.wait = 0  # plain tokens left before the next probe
        self.probes = 0
        self.probing = False
        self.drafted = self.accepted = 0  # in this reply
        # Where even a draft that is nearly always right cannot beat plain decoding (a step is 1),
        # never draft. A compiled verifier's one-row rounds (base < 1) beat it without drafting.
        self.hopeless = self.gain(MAX_ACCEPTANCE, self.best(MAX_ACCEPTANCE)) <= 1.0

    def gain(self, acceptance: float, k: int) -> float:
        """Tokens per unit of cost (one plain step is 1) of a round drafting ``k``; its verifying
        pass costs ``base`` for its first row (less than 1 when compiled code computes it)."""
        spent = self.base + (ROUND_COST if k else 0.0) + k * (self.cost + self.verify_cost)
        return expected_tokens(acceptance, k) / spent

    def best(self, acceptance: float) -> int:
        """The length of most gain at ``acceptance`` (at most :data:`MAX_ACCEPTANCE`); of equal
        gains, the shorter."""
        acceptance = min(acceptance, MAX_ACCEPTANCE)
        return max(range(self.longest + 1), key=lambda k: self.gain(acceptance, k))

    def next(self) -> int:
        if self.fixed:
            return self.fixed
        if self.hopeless:
            return 0
        if self.wait:
            self.wait -= 1
            return 0
        if self.probing:
            return min(PROBE_K, self.longest)
        k = self.best(self.acceptance)
        unrelated = self.drafted >= GIVE_UP_AFTER and self.accepted < GIVE_UP_RATE * self.drafted
        if k == 0 and self.probes < MAX_PROBES and not unrelated:
            self.wait = PROBE_FIRST << self.probes
            self.probes += 1
            self.probing = True
        elif k == 0:
            self.hopeless = True
        return k

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        rate = accepted / drafted
        if self.probing:
            self.acceptance, self.probing = rate, False
            # Nothing kept in this reply, this probe included: the draft is unrelated to the
            # target, and every further probe costs its catching up on the tokens decoded since.
            self.hopeless = not self.accepted
        else:
            self.acceptance = (1 - SMOOTHING) * self.acceptance + SMOOTHING * rate


def _at_proposals(
    ps: torch.Tensor, qs: list[torch.Tensor], proposal: list[int]
) -> tuple[list[float], list[float]]:
    """``p(x)`` and ``q(x)`` of every proposal ``x``, one gather each: ``ps`` is the target's
    ``(R, V)``, ``qs`` the draft's distribution at each proposal."""
    if not proposal:
        return [], []
    picked = torch.arange(len(proposal))
    chosen = torch.tensor(proposal, dtype=torch.long)
    return ps[picked, chosen].tolist(), torch.stack(qs)[picked, chosen].tolist()


def held_ids(cache: Any) -> list[int]:
    """The token ids a cache holds (a KVCache keeps them in a (B, N) tensor, others in a list)."""
    tokens = cache.tokens
    if isinstance(tokens, torch.Tensor):
        return tokens[0, : cache.pos].tolist()
    return list(tokens[: cache.pos])


def keep_common_prefix(cache: Any, seq: Sequence[int]) -> None:
    """Keep only what ``cache`` holds of ``seq``, leaving at least one token of ``seq`` to feed
    (its logits are the next token's)."""
    common = 0
    for a, b in zip(held_ids(cache), seq, strict=False):
        if a != b:
            break
        common += 1
    cache.truncate(min(common, len(seq) - 1))


@dataclass
class _Decided:
    """A token a round decided, with the target's logits at its position (for logprobs)."""

    token: int
    mark: str  # TokenEvent.draft
    logits: torch.Tensor
    forced: bool = False
    given: bool = False


def stream_decoded(
    model: DecodingModel,
    tok: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    options: StreamOptions,
    draft: Draft | None,
    *,
    cache: Any,
    limit: int,
    cancel: threading.Event | None,
    stats: GenerationStats | None,
    said: int,
    given: Sequence[int],
    probs: ProbsFn = next_token_probs,
    plain: Callable[[], Iterator[TokenEvent]] | None = None,
    verifier: Verifier | None = None,
    step: CompiledStep | None = None,
) -> Iterator[TokenEvent]:
    """A family's reply, decoded as ``options`` ask: speculatively when a ``draft`` was named
    and drafting can pay, else the plain loop (generation.py, or the family's own ``plain``
    one). ``probs``: the family's sampling distribution; ``verifier``: what computes the
    target's passes when drafting (default: ``model`` itself); ``step``: what computes a plain
    reply's one-row steps (default: ``model``; compiled in fast and int8 mode: compiled_step.py).
    The one place the two meet, so the one that holds background compiles while a reply streams
    (desktop.engine.foreground)."""
    with hold_background("a reply"):
        if draft is not None and draft.follow is not None:
            # A draft that reads the target's hidden states needs passes that write them; a compiled
            # twin was warmed up on caches without them, so each of its passes would run eagerly.
            verifier = None
        if draft is not None:
            draft.settle(options.threads)
            if verifier is not None:
                verifier.settle(options.threads)
        if draft is not None and stats is not None:
            # Said once, on the first reply that used a decision made anew (then not again): whether
            # it drafts at all is one of them.
            stats.choices_renewed |= draft.renewed or (verifier is not None and verifier.renewed)
            draft.renewed = False
            if verifier is not None:
                verifier.renewed = False
        drafting = draft is not None and draft.pays(options.draft_k, verifier)
        if draft is not None and not drafting and stats is not None:
            stats.draft_skipped = draft.why_not_paying()
        if drafting and draft is not None and stats is not None:
            stats.draft_compiled = draft.compiled
            stats.verifier_compiled = verifier is not None and verifier.compiled
        if isinstance(cache, KVCache) and not (drafting and draft is not None and draft.follow is not None):
            cache.keep_hidden(False)  # kept for a draft that read them; a plain pass need not write them
        if drafting and draft is not None:
            if not options.reuse_cache:
                draft.cache = None  # the target starts from nothing: so does its draft
            yield from stream_speculative(
                model,
                tok,
                prompt,
                params,
                draft,
                cache=cache,
                limit=limit,
                cancel=cancel,
                stats=stats,
                logprobs=options.logprobs,
                threads=options.threads,
                said=said,
                given=given,
                draft_k=options.draft_k,
                probs=probs,
                verifier=verifier,
            )
            return
        if plain is not None:
            yield from plain()
            return
        if step is not None:
            step.settle(options.threads)
            model = step.model
            if stats is not None:
                stats.step_compiled, stats.step_eager = step.compiled, step.why
        yield from stream_reply(
            model,
            tok,
            prompt,
            params,
            cache=cache,
            cancel=cancel,
            stats=stats,
            logprobs=options.logprobs,
            threads=options.threads,
            said=said,
            given=given,
        )


def stream_speculative(
    model: DecodingModel,
    tok: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    draft: Draft,
    *,
    cache: Any,
    limit: int,
    cancel: threading.Event | None = None,
    stats: GenerationStats | None = None,
    logprobs: int = 0,
    threads: int | None = None,
    said: int = 0,
    given: Sequence[int] = (),
    draft_k: int = 0,
    calculator: Callable[[str], object] = calculate,
    probs: ProbsFn = next_token_probs,
    verifier: Verifier | None = None,
) -> Iterator[TokenEvent]:
    """Stream one reply like :func:`~.generation.stream_reply`, the draft proposing. ``cache``
    (the target's) and ``draft.cache`` may hold a prefix of ``prompt``; ``limit``: the positions
    the target attends to; ``draft_k``: tokens per round (0: adaptive); ``stats.drafted`` and
    ``stats.accepted`` count the proposals and those kept. The last ``said`` prompt ids are the
    reply's own start and ``given`` ids come first (see generation.py). ``probs``: the family's
    sampling distribution (:func:`~.sampling.next_token_probs`'s signature); ``verifier``: what
    computes the target's passes, and at what costs (default: ``model`` itself)."""
    if not prompt:
        raise ContextError("the prompt is empty")
    if len(prompt) >= limit:
        raise ContextError(f"the prompt has {len(prompt)} tokens; this model attends to {limit}")
    run = _Speculation(
        verifier.model if verifier is not None else model,
        tok,
        prompt,
        params,
        draft,
        cache,
        limit,
        stats,
        logprobs,
        draft.length(draft_k, verifier),
        calculator,
        probs,
    )
    run.start(said, given)
    try:
        with torch_threads(threads):
            yield from run.events(cancel)
        if not run.stats.drafted:
            run.stats.draft_skipped = _why_drafted_nothing(run.length)
    finally:
        release_freed_memory()


def _why_drafted_nothing(length: DraftLength) -> str:
    """Why a speculative reply proposed no token: its lengths waited for a probe that never came
    (the draft was not expected to pay), or the reply ended, or every token was known, first."""
    if not length.fixed and (length.probes or length.hopeless):
        return "decoded plainly: the draft was not expected to pay"
    return "drafted nothing: the reply ended first"


class _Speculation:
    """One reply's state: the sequence so far, both caches, the row's state machine."""

    def __init__(
        self,
        model: DecodingModel,
        tok: Tokenizer,
        prompt: Sequence[int],
        params: SamplingParams,
        draft: Draft,
        cache: Any,
        limit: int,
        stats: GenerationStats | None,
        logprobs: int,
        length: DraftLength,
        calculator: Callable[[str], object],
        probs: ProbsFn,
    ) -> None:
        self.model, self.tok, self.params, self.draft = model, tok, params, draft
        self.cache, self.limit = cache, limit
        self.stats = stats if stats is not None else GenerationStats()
        self.logprobs = logprobs
        self.calculator = calculator
        self.probs = probs
        self.seq = list(prompt)
        self.device = model.device
        self.rng = torch.Generator(device=self.device)
        self.rng.manual_seed(params.seed)
        self.sp = Specials.of(tok)
        self.greedy = params.temperature == 0.0
        self.row = Row()
        self.length = length
        self.generated = 0
        self.budget: int | None = params.max_tokens
        # The target's logits for the next position when its cache holds all of ``seq``.
        self.next_logits: torch.Tensor | None = None
        self.tracker: PartTracker | None = None
        self.cancel: threading.Event | None = None  # Stop, set by events()

    def start(self, said: int, given: Sequence[int]) -> None:
        prompt = self.seq
        replay_row(self.row, prompt[len(prompt) - said :] if said else (), self.sp, self.tok, self.calculator)
        self.row.given.extend(given)
        # max_tokens counts the model's own tokens: the user's given ones come on top.
        if self.params.max_tokens is not None:
            self.budget = self.params.max_tokens + len(given)
        self.tracker = PartTracker(self.tok, prompt, said)
        self.stats.prompt_tokens = len(prompt)
        if self.draft.cache is None:
            self.draft.cache = self.draft.new_cache(min(self.draft.limit, len(prompt) + 64))
        if self.draft.follow is not None:
            self.draft.follow(self.draft.cache, self.cache)
        keep_common_prefix(self.cache, prompt)
        keep_common_prefix(self.draft.cache, prompt)
        self.stats.prefilled_tokens = len(prompt) - self.cache.pos

    def _ids(self, tokens: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(tokens)], dtype=torch.long, device=self.device)

    def _history(self, tokens: list[int]) -> torch.Tensor | None:
        return self._ids(tokens) if self.params.repetition_penalty != 1.0 else None

    def _target_probs(
        self, rows: list[torch.Tensor], proposal: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's distributions at every row of a round, from one call: ``(R, V)``, row ``i``
        after the sequence and ``proposal[:i]``; and which rows fell back to their most likely
        token (the round counts those it uses). Each row is computed on its own (the filters
        are per row), so one call gives what a call per row gives, in a few ops instead of
        a dozen per row."""
        history = None
        if self.params.repetition_penalty != 1.0:
            # Row i's history is seq + proposal[:i], padded with a token every row already has:
            # the penalty is per distinct token, so the padding changes nothing.
            full = self.seq + proposal
            n = len(self.seq)
            history = self._ids(full).expand(len(rows), -1).clone()
            for i in range(len(proposal)):
                history[i, n + i :] = full[0]
        fell = torch.zeros(len(rows), dtype=torch.bool)

        def fell_back(rows_fell: torch.Tensor) -> None:
            fell.copy_(rows_fell)

        return self.probs(torch.stack(rows), self.params, history, fell_back), fell

    @torch.inference_mode()
    def _prefill(self) -> None:
        """The target's pass over the prompt; Stop may end it early (protocols.DecodingModel), and
        :meth:`events` then ends the reply before these logits are used."""
        pending = self.seq[self.cache.pos :]
        self.next_logits = self.model(self._ids(pending), self.cache, last_only=True, cancel=self.cancel)[
            0, -1
        ]

    @torch.inference_mode()
    def _verify(self, proposal: list[int]) -> list[torch.Tensor]:
        """The target's logits at each proposal and after the last: ``len(proposal) + 1`` rows,
        from one pass over the tokens its cache lacks and the proposals."""
        pending = self.seq[self.cache.pos :]
        feed = pending + proposal
        head = [] if pending else [self.next_logits]
        if not feed:
            return head  # type: ignore[return-value]
        with few_rows():  # a few rows stream the weights once, as one row does
            out = self.model(self._ids(feed), self.cache, last_only=len(feed) == 1)[0]
        return [*head, *out[max(len(pending) - 1, 0) :]]  # type: ignore[list-item]

    @torch.inference_mode()
    def _propose(self, k: int) -> tuple[list[int], list[torch.Tensor]]:
        """Up to ``k`` draft tokens and the draft's distribution at each; it stops after a token
        that would end the reply or make the calculator force tokens."""
        model, cache = self.draft.model, self.draft.cache
        # The draft's first pass takes the whole prompt (as long as the target's); Stop ends it
        # between chunks as it does the target's, and nothing is proposed then.
        logits = model(self._ids(self.seq[cache.pos :]), cache, last_only=True, cancel=self.cancel)[0, -1]
        if self.cancel is not None and self.cancel.is_set():
            return [], []
        row = Row(deque(self.row.forced), deque(), self.row.in_python, list(self.row.expr), False)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            q = self.probs(logits.unsqueeze(0), self.params, self._history(self.seq + tokens), None)[0]
            token = self._draw(q)
            tokens.append(token)
            probs.append(q)
            _step_row(row, token, self.sp, self.tok, _any_result)
            if row.completed or row.forced or i == k - 1:
                break
            logits = model(self._ids([token]), cache, last_only=True)[0, -1]
        return tokens, probs

    def _draw(self, probs: torch.Tensor) -> int:
        """A token from ``probs``; greedy rows are one-hot, and a one-hot row's draw is its hot
        token, so greedy decoding takes it without a draw."""
        if self.greedy:
            return int(probs.argmax())
        return draw_token(probs, self.rng)

    def _uniforms(self, k: int) -> list[float]:
        """One uniform per proposal, drawn at once. Greedy needs none: with one-hot ``p`` and
        ``q`` the test ``u * q(x) < p(x)`` keeps ``x`` exactly when it is the target's token."""
        if self.greedy or not k:
            return [0.0] * k
        return torch.rand(k, generator=self.rng, device=self.device).tolist()

    def _known_round(self, room: int) -> list[_Decided]:
        """The user's and the calculator's tokens, as one block through the target."""
        row = self.row
        block: list[int] = []
        kinds: list[bool] = []
        while (row.given or row.forced) and len(block) < room:
            is_given = bool(row.given)
            token = (row.given if is_given else row.forced).popleft()
            _step_row(row, token, self.sp, self.tok, self.calculator)
            block.append(token)
            kinds.append(is_given)
            if row.completed:
                break
        rows = self._verify(block)
        self.next_logits = rows[-1]
        return [
            _Decided(t, "", rows[i], forced=not is_given, given=is_given)
            for i, (t, is_given) in enumerate(zip(block, kinds, strict=True))
        ]

    def _draft_round(self, k: int) -> list[_Decided]:
        n = len(self.seq)
        proposal, qs = self._propose(k) if k else ([], [])
        rows = self._verify(proposal)
        ps, fell = self._target_probs(rows, proposal)
        pxs, qxs = _at_proposals(ps, qs, proposal)
        uniforms = self._uniforms(len(proposal))
        decided: list[_Decided] = []
        for i, (x, q) in enumerate(zip(proposal, qs, strict=True)):
            p, px, qx = ps[i], pxs[i], qxs[i]
            if uniforms[i] * qx < px:
                decided.append(_Decided(x, "accepted", rows[i]))
                _step_row(self.row, x, self.sp, self.tok, self.calculator)
                # The reply ended or a calculator call closed: nothing is sampled after it here
                # (the draft stops proposing there; a result is then owed as a known block).
                if self.row.completed or self.row.forced:
                    break
                continue
            residual = (p - q).clamp_min(0)
            # p == q to rounding: the rejection was rounding's; p itself is then the residual.
            final = self._draw(residual if float(residual.sum()) > 0 else p)
            decided.append(_Decided(final, "corrected", rows[i]))
            break
        else:  # every proposal kept (or none made): one more token from the target
            j = len(proposal)
            decided.append(_Decided(self._draw(ps[j]), "", rows[j]))
        self.stats.greedy_fallbacks += int(fell[: len(decided)].sum())
        kept = sum(d.mark == "accepted" for d in decided)
        if proposal:
            self.stats.drafted += len(proposal)
            self.stats.accepted += kept
            self.length.record(len(proposal), kept)
        if decided[-1].mark == "accepted":  # the reply ended on a kept draft: nothing sampled after
            self.next_logits = rows[kept]
        else:
            self.next_logits = None
            _step_row(self.row, decided[-1].token, self.sp, self.tok, self.calculator)
        # Both caches keep the sequence and the kept proposals, nothing rejected.
        self.cache.truncate(min(self.cache.pos, n + kept))
        self.draft.cache.truncate(min(self.draft.cache.pos, n + kept))
        return decided

    def _round(self, room: int) -> list[_Decided]:
        if self.row.given or self.row.forced:
            decided = self._known_round(room)
        else:
            n = len(self.seq)
            k = min(self.length.next(), room - 1, self.limit - n - 1, self.draft.limit - n)
            decided = self._draft_round(max(k, 0) if n >= self.draft.needs else 0)
        self.seq.extend(d.token for d in decided)
        return decided

    def _event(self, d: _Decided) -> TokenEvent:
        assert self.tracker is not None
        ev = replace(self.tracker.event(d.token, d.forced), given=d.given, draft=d.mark)
        if self.logprobs:
            lp = torch.log_softmax(d.logits.float(), dim=-1)
            values, ids = lp.topk(min(self.logprobs, lp.numel()))
            top = tuple(
                (i, token_label(self.tok, i), v) for i, v in zip(ids.tolist(), values.tolist(), strict=True)
            )
            ev = replace(ev, logprob=float(lp[d.token]), top=top)
        return ev

    def events(self, cancel: threading.Event | None) -> Iterator[TokenEvent]:
        stats, budget = self.stats, self.budget
        t0 = time.perf_counter()
        t_first = 0.0
        stats.stopped = "max_tokens"
        self.cancel = cancel
        self._prefill()
        while not self.row.completed:
            if cancel is not None and cancel.is_set():
                stats.stopped = "cancelled"
                break
            room = self.limit - len(self.seq)
            if room <= 0:
                stats.stopped = "context"
                break
            if budget is not None:
                room = min(room, budget - self.generated)
            if room <= 0:
                break
            for d in self._round(room):
                if cancel is not None and cancel.is_set():
                    stats.stopped = "cancelled"
                    break
                now = time.perf_counter()
                self.generated += 1
                stats.new_tokens = self.generated
                if self.generated == 1:
                    t_first = now
                    stats.ttft_ms = (now - t0) * 1000
                else:
                    stats.decode_tok_s = (self.generated - 1) / max(now - t_first, 1e-9)
                if d.token in self.sp.stop:
                    stats.stopped = "stop_token"
                yield self._event(d)
                if self.generated == 1:
                    # The prefill's freed heap goes back after the first token, not at the reply's
                    # end, as in the plain loop (generation.py): the caches still fill meanwhile.
                    release_freed_memory()
            if stats.stopped == "cancelled":
                break
        assert self.tracker is not None
        tail = self.tracker.decoder.flush()
        if tail:
            yield TokenEvent(-1, tail, False, self.tracker.kind, continues=True)
