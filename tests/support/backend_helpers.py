"""Drive a backend the way the worker does, for engine-level tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from desktop.engine.backend import Backend, GenerationStats, Prompt, StreamOptions
from desktop.engine.messages import TokenEvent
from desktop.engine.params import SamplingParams


def stream(
    backend: Backend,
    prompt: Prompt | Sequence[int],
    params: SamplingParams,
    *,
    stats: GenerationStats | None = None,
    reuse_cache: bool = True,
    cancel: threading.Event | None = None,
) -> Iterator[TokenEvent]:
    """``backend.stream`` for a Prompt or plain token ids."""
    if not isinstance(prompt, Prompt):
        prompt = Prompt((), tuple(prompt), len(prompt), backend.info().context_length)
    options = StreamOptions(reuse_cache=reuse_cache)
    return backend.stream(prompt, params, cancel or threading.Event(), options, stats)


def reply_ids(
    backend: Backend, prompt: Prompt | Sequence[int], params: SamplingParams, **kwargs
) -> list[int]:
    """The generated token ids (a decoder's held-back tail adds no token)."""
    return [ev.id for ev in stream(backend, prompt, params, **kwargs) if not ev.continues]
