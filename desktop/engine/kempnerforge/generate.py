"""KempnerForge's sampling and decode loop (``kempnerforge/model/generate.py``), streamed as events.

``sample`` is KempnerForge's own: temperature 0 is argmax; otherwise the logits are divided by
the temperature, then top-k masks all but the k largest with -inf, then top-p keeps the smallest
prefix (of the sorted, temperature-scaled distribution) whose mass before each token is below
top_p, then softmax over the whole vocabulary and ``torch.multinomial``. KempnerForge draws from
torch's default generator (its script seeds it with ``torch.manual_seed``); a generator seeded
with the same number on the same device gives the same stream, so a seed gives its ids.

``stream_kf`` follows ``generate()``: one prefill whose last logits give the first token, then
one token at a time; it stops after the EOS token (emitted, as generate() keeps it), after
``max_tokens``, or when the sequence fills ``max_seq_len`` (where generate() would refuse).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import replace

import torch

from desktop.engine.backend import GenerationStats
from desktop.engine.decode.generation import PartTracker
from desktop.engine.decode.sampling import GreedyFallback
from desktop.engine.decode.scoring import token_label
from desktop.engine.errors import ContextError
from desktop.engine.kempnerforge.model import KFCache, KFTransformer
from desktop.engine.kempnerforge.tokenizer import KFTokenizer
from desktop.engine.messages import TokenEvent
from desktop.engine.params import SamplingParams


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
    on_greedy: GreedyFallback | None = None,
) -> torch.Tensor:
    """KempnerForge's ``sample``: (batch, vocab) logits -> (batch,) token ids.

    Where KempnerForge would crash in ``multinomial`` (a row that is no distribution: a tiny
    temperature overflows to inf, or the model gave NaN) the row's most likely token is drawn
    instead, by the same call, so the generator advances as it would have (as engine.sampling).
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = filtered_probs(logits, temperature, top_k, top_p, on_greedy)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def filtered_probs(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    on_greedy: GreedyFallback | None = None,
) -> torch.Tensor:
    """The distribution :func:`sample` draws from (temperature > 0), over the whole vocabulary;
    ``on_greedy`` is told which rows were no distribution (their most likely token is taken)."""
    raw = logits
    logits = logits / temperature
    if top_k > 0:
        top_k = min(top_k, logits.shape[-1])
        threshold = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.where(logits >= threshold, torch.full_like(logits, float("-inf")))
    if top_p < 1.0:
        sorted_logits, sorted_indices = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        cumulative = probs.cumsum(dim=-1)
        sorted_logits[(cumulative - probs) >= top_p] = float("-inf")
        logits = torch.zeros_like(logits).scatter_(1, sorted_indices, sorted_logits)
    probs = logits.softmax(dim=-1)
    usable = torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)
    if not bool(usable.all()):
        best = torch.nan_to_num(raw, nan=-torch.inf).argmax(dim=-1, keepdim=True)
        probs = torch.where(usable.unsqueeze(-1), probs, torch.zeros_like(probs).scatter(1, best, 1.0))
        if on_greedy is not None:
            on_greedy(~usable)
    return probs


def next_token_probs(
    logits: torch.Tensor,
    params: SamplingParams,
    _history: torch.Tensor | None = None,
    on_greedy: GreedyFallback | None = None,
) -> torch.Tensor:
    """:func:`sample`'s distribution as speculative decoding takes it (float32 rows; one-hot at
    the most likely token when greedy). KempnerForge's sampler has no repetition penalty, so the
    history is not used."""
    if params.temperature == 0:
        best = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(logits, dtype=torch.float32).scatter(1, best, 1.0)
    return filtered_probs(logits, params.temperature, params.top_k, params.top_p, on_greedy).float()


def reuse_prefix(cache: KFCache, prompt: Sequence[int]) -> int:
    """Keep what ``cache`` holds of ``prompt`` (at least one prompt token is left to compute, its
    logits start the reply); returns how many prompt tokens are still to prefill."""
    held = cache.tokens[: cache.pos]
    common = next(
        (i for i, (a, b) in enumerate(zip(held, prompt, strict=False)) if a != b), min(len(held), len(prompt))
    )
    cache.truncate(min(common, len(prompt) - 1))
    return len(prompt) - cache.pos


def _logprobs(logits: torch.Tensor, token: int, n: int, tok: KFTokenizer) -> tuple[float, tuple]:
    lp = torch.log_softmax(logits.float(), dim=-1)[0]
    values, indices = lp.topk(min(n, lp.numel()))
    top = tuple((i, token_label(tok, i), v) for i, v in zip(indices.tolist(), values.tolist(), strict=True))
    return float(lp[token]), top


@torch.inference_mode()
def stream_kf(
    model: KFTransformer,
    tok: KFTokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    cache: KFCache,
    cancel: threading.Event | None = None,
    stats: GenerationStats | None = None,
    logprobs: int = 0,
    said: int = 0,
    given: Sequence[int] = (),
) -> Iterator[TokenEvent]:
    """Stream a reply to ``prompt``; ``cache`` may hold a prefix of it (it is reused). The last
    ``said`` prompt ids are the reply's own start and ``given`` ids stream first, as the user's
    (see engine/decode/generation.py)."""
    limit = model.config.max_seq_len
    if not prompt:
        raise ContextError("the prompt is empty")
    if len(prompt) >= limit:
        raise ContextError(f"the prompt has {len(prompt)} tokens; this model's max_seq_len is {limit}")
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_tokens = len(prompt)
    stats.prefilled_tokens = reuse_prefix(cache, prompt)
    room = limit - len(prompt)
    # max_tokens counts the model's own tokens: the user's given ones come on top.
    budget = room if params.max_tokens is None else min(params.max_tokens + len(given), room)
    generator = torch.Generator(device=model.device)
    generator.manual_seed(params.seed)
    tracker = PartTracker(tok, prompt, said)
    owed = deque(given)

    def on_greedy(_rows: torch.Tensor) -> None:
        stats.greedy_fallbacks += 1

    t0 = time.perf_counter()
    ids = torch.tensor([list(prompt[cache.pos :])], dtype=torch.long, device=model.device)
    # Stop during a long prompt's prefill ends it between two chunks; nothing is then sampled
    # from the logits of the rows done (as in engine/decode/generation.py).
    logits = model(ids, cache, last_only=True, cancel=cancel)[:, -1, :]
    if cancel is not None and cancel.is_set():
        stats.stopped = "cancelled"
        return
    stats.stopped = "max_tokens"
    t_first = 0.0
    for n in range(1, budget + 1):
        if owed:
            token = torch.tensor([owed.popleft()], device=model.device)
        else:
            token = sample(logits, params.temperature, params.top_k, params.top_p, generator, on_greedy)
        token_id = int(token[0])
        now = time.perf_counter()
        if n == 1:
            t_first = now
            stats.ttft_ms = (now - t0) * 1000
        else:
            stats.decode_tok_s = (n - 1) / max(now - t_first, 1e-9)
        stats.new_tokens = n
        ev = tracker.event(token_id, False)
        if n <= len(given):
            ev = replace(ev, given=True)
        if logprobs:
            chosen, top = _logprobs(logits, token_id, logprobs, tok)
            ev = replace(ev, logprob=chosen, top=top)
        yield ev
        if token_id in tok.stop_ids:
            stats.stopped = "stop_token"
            break
        if n == budget:
            if budget == room and (params.max_tokens is None or params.max_tokens + len(given) > room):
                stats.stopped = "context"
            break
        if cancel is not None and cancel.is_set():
            stats.stopped = "cancelled"
            break
        logits = model(token.unsqueeze(1), cache)[:, -1, :]
    tail = tracker.decoder.flush()
    if tail:
        yield TokenEvent(-1, tail, False, tracker.kind, continues=True)
