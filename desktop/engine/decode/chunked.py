"""A long prompt prefilled a chunk of rows at a time (docs/PERFORMANCE.md, Loading and memory).

The embedding runs over the whole prompt; the layers then run :data:`PREFILL_CHUNK` rows at a
time on the KV cache, so the activations take a chunk's memory, not the prompt's, and Stop can
end the pass between two chunks. In exact mode that is done only where this machine gives one
pass's bits that way: chunk boundaries must fall where one whole pass's kernels split their work
anyway. torch's CPU flash attention takes the keys in blocks of 512 (chunks of 256 change the
rows past 128 of every chunk), and a vectorised elementwise kernel (the value-embedding gate's
sigmoid) starts its vector blocks and ends its scalar tail on the same elements for any multiple
of 64. None of that is promised, so :func:`chunk_step` checks it once per machine, thread count
and model shape. Kernels that promise an error bound and not bits (fast and int8 modes) chunk
unchecked.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any, Protocol, overload

import torch

from desktop.engine.kernels.gemv import APPROXIMATE_KINDS
from desktop.engine.kernels.tuning import KernelTuner, tuner_for

PREFILL_CHUNK = 512
CHECK_ROWS = PREFILL_CHUNK + PREFILL_CHUNK // 2 + 7  # two chunks, the second ragged


class Cache(Protocol):
    """What a prefill in chunks needs of a model's cache (the engine's ``KVCache``,
    KempnerForge's ``KFCache``)."""

    pos: int  # positions held
    device: torch.device

    def record(self, ids: torch.Tensor) -> None:
        """``ids`` (1, n), whose keys and values were just written from ``pos`` on: hold them."""
        ...

    def same_as(self, other: Cache) -> bool:
        """The same positions with the same bits (keys, values, tokens and any history)."""
        ...


# rows a:b of the prompt, through the layers on the cache (at position pos + a) -> their states
Rows = Callable[[int, int], torch.Tensor]
# (ids, cache, chunk) -> last-row logits: a model's prefill, one pass (chunk 0) or in chunks
Prefill = Callable[[torch.Tensor, Cache, int], torch.Tensor]


class Chunkable(Protocol):
    """What :func:`chunk_step` reads of a model (nanochat's ``GPT``, the HF and KempnerForge
    models)."""

    @property
    def config(self) -> Any: ...  # its shape: the check's entry is named by its repr
    @property
    def device(self) -> torch.device: ...
    @property
    def compute_dtype(self) -> torch.dtype: ...
    @property
    def kernel_kind(self) -> str: ...  # "exact", or "fp16" / "int8" (APPROXIMATE_KINDS)
    @property
    def tuner(self) -> KernelTuner | None: ...


def chunk_step(
    model: Chunkable, T: int, cache: Cache | None, last_only: bool, keeps_bits: Callable[[], bool]
) -> int:
    """:data:`PREFILL_CHUNK` for a prompt of ``T`` rows prefilled into a cache on the CPU, longer
    than a chunk, where this machine was found to give one pass's bits in chunks (``keeps_bits``,
    run once and kept by the model's tuner for this thread count, kernels, dtype and model
    shape), or where the model's kernels promise no bits; else 0 (one pass). Called on every
    pass, decode steps included, so it settles those before naming anything."""
    if cache is None or not last_only or T <= PREFILL_CHUNK or model.device.type != "cpu":
        return 0
    if model.kernel_kind in APPROXIMATE_KINDS:
        # Their products round otherwise than the reference's in any case (int8 quantises the
        # rows it is given with one scale over their range: a chunk's range lies within the
        # prompt's, so its steps are finer, never coarser). A chunk breaks no promise of
        # theirs, and a long prompt gets the chunks' memory and Stop without a check.
        return PREFILL_CHUNK
    digest = hashlib.sha256(repr(model.config).encode()).hexdigest()[:12]
    entry = f"prefill in chunks of {PREFILL_CHUNK} {model.kernel_kind} {model.compute_dtype} model {digest}"
    tuner = model.tuner or tuner_for(None)
    return PREFILL_CHUNK if tuner.verdict(entry, torch.get_num_threads(), keeps_bits) else 0


def chunk_step_of_uniform(
    model: Any, layers: str, T: int, cache: Cache | None, last_only: bool, new_cache: Callable[[int], Cache]
) -> int:
    """:func:`chunk_step` for a model whose layers are all of one kind (a Hugging Face or a
    KempnerForge model: one attention, one MLP). Its check runs through the first and the last
    of them (``model.<layers>``, cut for the check): every layer runs the same kernels, so it
    costs two layers' prefill, not the model's."""

    def check() -> bool:
        kept = getattr(model, layers)
        setattr(model, layers, [kept[0], kept[-1]] if len(kept) > 1 else kept)
        try:
            return keeps_bits(
                lambda ids, c, chunk: model(ids, c, last_only=True, chunk=chunk),
                model.config.vocab_size,
                min(CHECK_ROWS, model.config.rope_len),
                new_cache,
            )
        finally:
            setattr(model, layers, kept)

    return chunk_step(model, T, cache, last_only, check)


def keeps_bits(prefill: Prefill, vocab: int, rows: int, new_cache: Callable[[int], Cache]) -> bool:
    """Prefill ``rows`` random ids in one pass and in chunks: the same logits, and the same cache
    (keys, values and the eras' histories)? Random values make a sum taken in another order show
    in some row; the products, attention and norms of a chunk are the machine's BLAS and torch's
    kernels, which no one promises row-independent."""
    ids = torch.randint(vocab, (1, rows), generator=torch.Generator().manual_seed(0))
    runs = []
    for chunk in (0, PREFILL_CHUNK):
        cache = new_cache(rows)
        runs.append((prefill(ids.to(cache.device), cache, chunk), cache))
    (whole, whole_cache), (chunked, chunked_cache) = runs
    return torch.equal(whole, chunked) and whole_cache.same_as(chunked_cache)


def prefill_rows(
    idx: torch.Tensor,
    step: int,
    cache: Cache | None,
    last_only: bool,
    cancel: threading.Event | None,
    rows: Rows,
) -> torch.Tensor:
    """The final states of ``idx``'s rows (the last one's only with ``last_only``), computed by
    ``rows`` over spans of ``step`` rows (0: one span); the cache then holds them.

    ``cancel`` set between two chunks ends the pass there (Stop during a long prompt): the cache
    keeps the rows done, a prefix of the prompt that the next request need not compute again,
    and the states returned are those rows' (the caller, which set it, samples nothing from
    them). A chunk that fails (an OOM, say) leaves the cache where it was."""
    T = idx.shape[1]
    pos = 0 if cache is None else cache.pos
    # Without a cache a chunk could not attend to the rows before it: one span.
    chunked = cache is not None and 0 < step < T
    spans = [(a, min(a + step, T)) for a in range(0, T, step)] if chunked else [(0, T)]
    kept: list[torch.Tensor] = []
    done = T  # rows of the prompt this pass computes: all of them unless stopped
    try:
        for a, b in spans:
            if cache is not None:
                cache.pos = pos + a
            h = rows(a, b)
            stop = b < T and cancel is not None and cancel.is_set()
            if b == T or not last_only or stop:
                kept.append(h)
            if stop:
                done = b
                break
    except BaseException:
        if cache is not None:
            cache.pos = pos  # nothing of this pass is held
        raise
    if cache is not None:
        cache.pos = pos
        cache.record(idx[:, :done])
    x = kept[0] if len(kept) == 1 else torch.cat(kept, dim=1)
    return x[:, -1:] if last_only else x


@overload
def cut(t: torch.Tensor, a: int, b: int, total: int) -> torch.Tensor: ...
@overload
def cut(t: None, a: int, b: int, total: int) -> None: ...
def cut(t: torch.Tensor | None, a: int, b: int, total: int) -> torch.Tensor | None:
    """Rows ``a:b`` of a (B, T, ...) tensor; the tensor itself when they are all of its rows (a
    decode step: a view per input would cost ~1 µs each)."""
    if t is None or (a, b) == (0, total):
        return t
    return t[:, a:b]
