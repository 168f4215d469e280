"""A closed model's memory goes when the last reference does, not at the next cyclic collection.

The cyclic collector runs after so many container objects are made, and a model is a few large
tensors, so a model held only by a reference cycle (a kernel keeping a bound method of itself)
stayed resident long after it was closed: 800 MB of a depth-12 model and its drafts in the
speculative bench, and in the app after switching models or drafts. Each case opens a backend
the way the app does, streams a reply (with a draft where it has one), closes it and drops it
with the collector off: then nothing may be left for the collector, and no tensor at all.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from desktop.engine.backend import LoadOptions, StreamOptions
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo" / "chatsft_checkpoints" / "demo"
GOLDEN = ROOT / "tests" / "golden"


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.enable()
        gc.collect()


def _left_for_the_collector() -> list[object]:
    """What only the cyclic collector would free (kept aside by DEBUG_SAVEALL, then let go)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = list(gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    return found


@pytest.mark.parametrize(
    ("path", "dtype", "draft"),
    [
        (DEMO, "float32", ""),
        (DEMO, "float32", "int8"),
        (DEMO, "float32", "auto"),  # the losing copy is dropped when the winner is known
        (DEMO, "int8", f"{DEMO.parent / 'demo-d2'}"),
        (GOLDEN / "transformers" / "nanochat", "auto", "int8"),
        (GOLDEN / "kempnerforge" / "dense-gqa-qknorm" / "run", "auto", "int8"),
    ],
    ids=["exact", "int8-draft", "auto-draft", "checkpoint-draft", "hf", "kempnerforge"],
)
def test_a_closed_model_leaves_no_tensor_for_the_cyclic_collector(collector_off, path, dtype, draft):
    backend = open_backend(path, LoadOptions(dtype=dtype))
    prompt = backend.render([Message.of_text("user", "What is 12 times 7?")], 8)
    options = StreamOptions(draft=draft) if draft else StreamOptions()
    params = SamplingParams(temperature=0.0, max_tokens=8)
    replied = [e.id for e in backend.stream(prompt, params, threading.Event(), options) if e.id >= 0]
    assert replied
    model = weakref.ref(backend.model)  # type: ignore[attr-defined]
    backend.close()
    del backend
    assert model() is None
    tensors = [o for o in _left_for_the_collector() if isinstance(o, torch.Tensor)]
    assert tensors == [], f"{len(tensors)} tensors held only by reference cycles"


@pytest.mark.parametrize(
    ("path", "draft"),
    [
        (DEMO, f"{DEMO.parent / 'demo-d2'}"),
        (DEMO, "int8"),
        (GOLDEN / "transformers" / "nanochat", "int8"),
        (GOLDEN / "kempnerforge" / "dense-gqa-qknorm" / "run", "int8"),
    ],
    ids=["checkpoint-draft", "int8-draft", "hf", "kempnerforge"],
)
def test_a_reply_without_a_draft_lets_the_held_draft_go(collector_off, path, draft):
    """Speculative decoding turned off gives the draft's memory back at the next reply: a draft
    checkpoint is a whole model, and it used to stay until another draft was named."""
    backend = open_backend(path, LoadOptions(dtype="float32"))
    prompt = backend.render([Message.of_text("user", "What is 12 times 7?")], 8)
    params = SamplingParams(temperature=0.0, max_tokens=8)

    def reply(options: StreamOptions) -> list[int]:
        return [e.id for e in backend.stream(prompt, params, threading.Event(), options) if e.id >= 0]

    drafted = reply(StreamOptions(draft=draft, draft_k=2))
    held = weakref.ref(backend.draft(draft).model)  # the draft the reply used, still held
    assert held() is not None
    assert reply(StreamOptions()) == drafted  # greedy: the same reply, decoded plainly
    assert held() is None
    backend.close()
