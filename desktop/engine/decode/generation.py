"""Token generation: one prefill, a KV-cached decode loop and nanochat's calculator state machine.

``generate_columns`` follows nanochat's ``Engine.generate`` step for step (same sampling calls,
same Generator, forced tokens still consume a sample), so seeded runs give nanochat's tokens.
``stream_reply`` wraps it for one row and turns tokens into :class:`TokenEvent` with clean text
deltas and the part each token belongs to.

A reply may begin already decided (a fork, a continuation, a prefill): the last ``said`` prompt
ids are the reply's own start, replayed through the calculator's state machine and the part
tracker without being streamed again, and ``given`` ids stream first, marked ``given``, each as one
decode step, so they get the model's probabilities like any sampled token.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch

from desktop.engine.backend import GenerationStats, ReplyStart
from desktop.engine.calculator import calculate
from desktop.engine.decode.detokenize import StreamDecoder
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.protocols import DecodingModel as GPT
from desktop.engine.decode.protocols import Tokenizer
from desktop.engine.decode.sampling import sample_next
from desktop.engine.decode.scoring import token_label
from desktop.engine.errors import ContextError
from desktop.engine.kernels.memory import release_freed_memory
from desktop.engine.kernels.threads import torch_threads
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, THOUGHT, TOOL_QUERY, TOOL_RESULT, TokenEvent
from desktop.engine.params import SamplingParams


@dataclass
class Specials:
    """Ids of the tokens the state machine reacts to (None where the tokenizer lacks them)."""

    python_start: int | None
    python_end: int | None
    output_start: int | None
    output_end: int | None
    query_tool: int | None
    tool_result: int | None
    code_end: int | None
    thought_start: int | None
    thought_end: int | None
    stop: frozenset[int]

    @classmethod
    def of(cls, tok: Tokenizer) -> Specials:
        s = tok.special_id
        return cls(
            s("<|python_start|>"),
            s("<|python_end|>"),
            s("<|output_start|>"),
            s("<|output_end|>"),
            s("<QUERY_TOOL>"),
            s("<TOOL_RESULT>"),
            s("<CODE_END>"),
            s("<THOUGHT_START>"),
            s("<THOUGHT_END>"),
            frozenset(tok.stop_ids),
        )


@dataclass
class Row:
    forced: deque[int] = field(default_factory=deque)
    given: deque[int] = field(default_factory=deque)  # the user's tokens, before any sampling
    in_python: bool = False
    expr: list[int] = field(default_factory=list)
    completed: bool = False


@dataclass
class Column:
    tokens: list[int]
    forced: list[bool]
    # Per row: (logprob of the chosen token, [(token id, logprob) x top-n]) when requested.
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    given: list[bool] = field(default_factory=list)


Calculator = Callable[[str], object]


def _step_row(row: Row, token: int, sp: Specials, tok: Tokenizer, calculator: Calculator) -> None:
    if token in sp.stop:
        row.completed = True
    if token == sp.python_start:
        row.in_python, row.expr = True, []
    elif token == sp.python_end and row.in_python:
        row.in_python = False
        if row.expr and sp.output_start is not None and sp.output_end is not None:
            result = calculator(tok.decode(row.expr))
            if result is not None:
                row.forced.append(sp.output_start)
                row.forced.extend(tok.encode(str(result)))
                row.forced.append(sp.output_end)
        row.expr = []
    elif row.in_python:
        row.expr.append(token)


def replay_row(row: Row, said: Sequence[int], sp: Specials, tok: Tokenizer, calculator: Calculator) -> None:
    """Bring ``row`` to where a reply that began with ``said`` stands: inside a calculator call or
    not, and owing the calculator's result when ``said`` ends on a closed call (a continuation
    after ``<|python_end|>`` then streams the forced result first). Results the reply already
    holds are matched, not owed again."""
    for token in said:
        if row.forced and row.forced[0] == token:
            row.forced.popleft()
        else:
            row.forced.clear()  # the reply moved on without the result (a fork, an edit)
        _step_row(row, token, sp, tok, calculator)
    row.completed = False


def reuse_prefix(cache: KVCache, prompt: Sequence[int]) -> int:
    """Keep only what ``cache`` really holds of ``prompt``, leaving at least one prompt token to
    compute (its logits start the reply). Returns the number of prompt tokens still to prefill."""
    if cache.pos:
        held = cache.tokens[0, : cache.pos].tolist()
        common = next(
            (i for i, (a, b) in enumerate(zip(held, prompt, strict=False)) if a != b),
            min(len(held), len(prompt)),
        )
        cache.truncate(min(common, len(prompt) - 1))
    return len(prompt) - cache.pos


def begin_reply(
    prompt: Sequence[int], start: ReplyStart | None, tok: Tokenizer
) -> tuple[list[int], int, tuple[int, ...]]:
    """The ids to prefill, how many of them the reply already said, and the ids the user gives,
    for a reply that begins with ``start`` (texts are encoded where no ids came: a fork raced
    on a checkpoint whose tokenizer differs). Ids outside the vocabulary are one line."""
    if start is None:
        return list(prompt), 0, ()
    said = list(start.said_ids) or (tok.encode(start.said_text) if start.said_text else [])
    given = list(start.given_ids) or (tok.encode(start.given_text) if start.given_text else [])
    bad = [i for i in (*said, *given) if not 0 <= i < tok.vocab_size]
    if bad:
        raise ContextError(f"the reply's start has token ids outside this vocabulary: {bad[:5]}")
    return [*prompt, *said], len(said), tuple(given)


def check_context(model: GPT, n_prompt: int, max_tokens: int | None) -> None:
    limit = model.config.rope_len
    if n_prompt < 1:
        raise ContextError("the prompt is empty")
    if n_prompt >= limit:
        raise ContextError(f"the prompt has {n_prompt} tokens; this model's rotary table holds {limit}")


@torch.inference_mode()
def generate_columns(
    model: GPT,
    tok: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    num_samples: int = 1,
    cache: KVCache | None = None,
    cancel: threading.Event | None = None,
    logprobs: int = 0,
    calculator: Calculator = calculate,
    stats: GenerationStats | None = None,
    said: int = 0,
    given: Sequence[int] = (),
) -> Iterator[Column]:
    """Yield one :class:`Column` per step. ``cache`` may already hold a prefix of ``prompt``.
    ``stats.greedy_fallbacks`` counts steps whose distribution could not be sampled. The last
    ``said`` ids of ``prompt`` are the reply's own start; ``given`` ids come before any sampled
    one (module docstring)."""
    check_context(model, len(prompt), params.max_tokens)
    device = model.device
    rng = torch.Generator(device=device)
    rng.manual_seed(params.seed)
    sp = Specials.of(tok)
    cfg = model.config
    # max_tokens counts the model's own tokens: the user's given ones come on top.
    most = params.max_tokens + len(given) if params.max_tokens is not None else None
    budget = most if most is not None else cfg.sequence_len
    if cache is None:
        cache = KVCache(cfg, 1, min(cfg.rope_len, len(prompt) + budget), device, model.compute_dtype)
    else:
        reuse_prefix(cache, prompt)
    start = cache.pos
    ids = torch.tensor([list(prompt[start:])], dtype=torch.long, device=device)
    # Stop during a long prompt's prefill ends it between two chunks; the loop below then ends
    # the reply before sampling anything from the logits of the rows done.
    logits = model(ids, cache, last_only=True, cancel=cancel)[:, -1, :]
    if num_samples > 1:
        cache = cache.replicate(num_samples)
        logits = logits.expand(num_samples, -1)
    rows = [Row() for _ in range(num_samples)]
    for row in rows:
        replay_row(row, prompt[len(prompt) - said :] if said else (), sp, tok, calculator)
        row.given.extend(given)
    generated = 0

    def on_greedy(_rows: torch.Tensor) -> None:
        if stats is not None:
            stats.greedy_fallbacks += 1

    while True:
        if most is not None and generated >= most:
            break
        if cancel is not None and cancel.is_set():
            break
        if cache.pos >= cfg.rope_len:
            break
        history = cache.tokens[:, : cache.pos] if params.repetition_penalty != 1.0 else None
        sampled = sample_next(logits, rng, params, history, on_greedy)[:, 0].tolist()
        column, forced, gave = [], [], []
        for i, row in enumerate(rows):
            # The user's tokens first, then the calculator's, then the model's own.
            is_given = bool(row.given)
            is_forced = not is_given and bool(row.forced)
            queue = row.given if is_given else row.forced if is_forced else None
            token = queue.popleft() if queue is not None else sampled[i]
            column.append(token)
            forced.append(is_forced)
            gave.append(is_given)
            _step_row(row, token, sp, tok, calculator)
        lp = _logprobs(logits, column, logprobs) if logprobs else None
        yield Column(column, forced, lp, gave)
        generated += 1
        if generated == 1:
            # The prompt's activations are freed, but the C heap keeps their pages for reuse and
            # the decode steps need a sliver of them: give them back now, not when the reply ends
            # (with the KV cache still filling, they were the peak's last 35 MB at depth 20).
            # After the first token, so that its latency does not pay the ~17 ms of a 1,024-token
            # prompt's pages.
            release_freed_memory()
        if all(r.completed for r in rows) or (most is not None and generated >= most):
            break
        ids = torch.tensor(column, dtype=torch.long, device=device).unsqueeze(1)
        logits = model(ids, cache)[:, -1, :]


def _logprobs(logits: torch.Tensor, column: list[int], n: int) -> list[tuple[float, list[tuple[int, float]]]]:
    lp = torch.log_softmax(logits.float(), dim=-1)
    top_v, top_i = lp.topk(min(n, lp.size(-1)), dim=-1)
    chosen = lp.gather(1, torch.tensor(column, device=lp.device).unsqueeze(1))[:, 0].tolist()
    return [
        (chosen[r], list(zip(top_i[r].tolist(), top_v[r].tolist(), strict=True))) for r in range(len(column))
    ]


class PartTracker:
    """Which message part each token belongs to, and the clean text it adds (one row)."""

    # The C++ tokenizer's spacing depends on neighbours, so each decoder sees the ids before it.
    CONTEXT = 16

    def __init__(self, tok: Tokenizer, prompt: Sequence[int] = (), said: int = 0) -> None:
        self.tok = tok
        self.sp = Specials.of(tok)
        self.kind = TEXT
        # A reply that began before this request: its part kinds come from replaying the said
        # tokens (whose text the reply already holds); the decoder's context is the ids before.
        start = len(prompt) - said
        self.recent: list[int] = list(prompt[max(0, start - self.CONTEXT) : start])
        self.decoder = StreamDecoder(tok, prefix_ids=self.recent)
        for token in prompt[start:]:
            self.event(token, False)

    def _switch(self, kind: str) -> str:
        tail = self.decoder.flush()
        self.kind = kind
        self.decoder = StreamDecoder(self.tok, prefix_ids=self.recent[-self.CONTEXT :])
        return tail

    def event(self, token: int, forced: bool) -> TokenEvent:
        sp, name = self.sp, self.tok.special_name(token)
        self.recent.append(token)
        if len(self.recent) > 4 * self.CONTEXT:
            del self.recent[: -self.CONTEXT]
        if name is None:
            return TokenEvent(token, self.decoder.push(token), forced, self.kind)
        opening = {
            sp.python_start: PYTHON,
            sp.output_start: PYTHON_OUTPUT,
            sp.query_tool: TOOL_QUERY,
            sp.tool_result: TOOL_RESULT,
            sp.thought_start: THOUGHT,
        }
        closing = {sp.python_end, sp.output_end, sp.code_end, sp.thought_end}
        opening.pop(None, None)
        if token in opening:
            tail = self._switch(opening[token])
            return TokenEvent(token, tail, forced, self.kind, name)
        kind = self.kind
        tail = self._switch(TEXT) if token in closing or token in sp.stop else ""
        return TokenEvent(token, tail, forced, kind, name)


def stream_reply(
    model: GPT,
    tok: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    cache: KVCache | None = None,
    cancel: threading.Event | None = None,
    stats: GenerationStats | None = None,
    logprobs: int = 0,
    threads: int | None = None,
    said: int = 0,
    given: Sequence[int] = (),
) -> Iterator[TokenEvent]:
    """Stream one reply as :class:`TokenEvent`; ``stats`` is filled in as it goes. With
    ``logprobs`` > 0 each event carries its token's log-probability and that many alternatives.
    ``threads``: intra-op threads for this reply (None: as set). ``said`` and ``given``: a reply
    that began already (module docstring). When it ends, the heap its prefill freed goes back to
    the OS."""
    try:
        with torch_threads(threads):
            yield from _reply_events(
                model, tok, prompt, params, cache, cancel, stats, logprobs, said, tuple(given)
            )
    finally:
        release_freed_memory()


def _reply_events(
    model: GPT,
    tok: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    cache: KVCache | None,
    cancel: threading.Event | None,
    stats: GenerationStats | None,
    logprobs: int,
    said: int,
    given: tuple[int, ...],
) -> Iterator[TokenEvent]:
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_tokens = len(prompt)
    stats.prefilled_tokens = len(prompt) if cache is None else reuse_prefix(cache, prompt)
    tracker = PartTracker(tok, prompt, said)
    t0 = time.perf_counter()
    t_first = None
    stats.stopped = "max_tokens"
    for col in generate_columns(
        model,
        tok,
        prompt,
        params,
        cache=cache,
        cancel=cancel,
        logprobs=logprobs,
        stats=stats,
        said=said,
        given=given,
    ):
        now = time.perf_counter()
        if t_first is None:
            t_first = now
            stats.ttft_ms = (now - t0) * 1000
        stats.new_tokens += 1
        if stats.new_tokens > 1:
            stats.decode_tok_s = (stats.new_tokens - 1) / max(now - t_first, 1e-9)
        ev = tracker.event(col.tokens[0], col.forced[0])
        if col.given[0]:
            ev = replace(ev, given=True)
        if col.logprobs:
            chosen, alternatives = col.logprobs[0]
            top = tuple((i, token_label(tok, i), lp) for i, lp in alternatives)
            ev = replace(ev, logprob=chosen, top=top)
        if col.tokens[0] in tracker.sp.stop:
            stats.stopped = "stop_token"
        yield ev
    if cancel is not None and cancel.is_set() and stats.stopped != "stop_token":
        stats.stopped = "cancelled"
    tail = tracker.decoder.flush()
    if tail:
        yield TokenEvent(-1, tail, False, tracker.kind, continues=True)
