"""A KV cache takes memory as its positions are written, and that changes no bit.

A cache is made for the whole reply (prompt + max_tokens). Written up front with zeros, its
pages were resident from the start, under the prompt's activations at the prefill's peak; in
pages the OS gives on first touch (``memory.zeros_on_demand``), it holds the positions reached.
The golden checkpoints (nanochat's own files, every era, and the fork's) are tiny, so their caches
stay below ``ON_DEMAND_FROM``; here the threshold is lowered to map every tensor.
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import psutil
import pytest
import torch
from support.backend_helpers import reply_ids
from support.golden import CASES, MAX_NEW, check, manifest, reference

from desktop.engine.backend import LoadOptions, StreamOptions
from desktop.engine.decode import generation, speculative
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.kempnerforge.config import KFModelConfig
from desktop.engine.kempnerforge.model import KFCache
from desktop.engine.kernels import memory
from desktop.engine.messages import Message
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.nanochat.config import e7_config
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

MB = 2**20
DEMO = Path(__file__).resolve().parents[3] / "resources" / "demo" / "chatsft_checkpoints" / "demo"
UP_FRONT = 1 << 62  # an ON_DEMAND_FROM no tensor reaches: torch.zeros, as before
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, seed=42)


def _greedy(model, prompt: list[int], new: int) -> tuple[list[torch.Tensor], KVCache]:
    """Every step's logits, greedy, after prefilling ``prompt`` into a small cache that must grow."""
    cache = KVCache(model.config, 1, 4, model.device, model.compute_dtype)
    with torch.inference_mode():
        logits = [model(torch.tensor([prompt]), cache, last_only=True)[0, -1]]
        for _ in range(new - 1):
            logits.append(model(logits[-1].argmax().view(1, 1), cache)[0, -1])
    return logits, cache


def _written(cache: KVCache) -> list[torch.Tensor]:
    """What the cache holds for the positions written so far."""
    p = cache.pos
    held = [cache.k[:, :, :p], cache.v[:, :, :p], cache.tokens[:, :p]]
    held += [cache.embeds[:, :p]] if cache.embeds is not None else []
    return held + [z[:, :p] for z in cache.engram.values()]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_cache_taken_on_demand_gives_the_bits_of_one_written_up_front(case, monkeypatch):
    m = manifest(case)
    options = LoadOptions(step=m["step"], device="cpu", dtype="float32", base_dir=case)
    backend = NanochatBackend.open(case / "chatsft_checkpoints" / m["tag"], options)
    model = backend.model
    for c in m["cases"]:
        monkeypatch.setattr(memory, "ON_DEMAND_FROM", 1)  # every tensor of every cache mapped
        logits, cache = _greedy(model, c["prompt_ids"], MAX_NEW)
        streamed = reply_ids(backend, c["prompt_ids"], GREEDY, reuse_cache=False)
        monkeypatch.setattr(memory, "ON_DEMAND_FROM", UP_FRONT)
        logits_up_front, cache_up_front = _greedy(model, c["prompt_ids"], MAX_NEW)
        assert all(torch.equal(a, b) for a, b in zip(logits, logits_up_front, strict=True)), c["text"]
        assert all(torch.equal(a, b) for a, b in zip(_written(cache), _written(cache_up_front), strict=True))
        # and the app's own streaming still gives nanochat's ids (its Engine's, where it could run)
        check(m, streamed, reference(m, c)[0], backend.tok.special_id("<|python_end|>"), c["text"])
    backend.close()


def test_fresh_on_demand_zeros_are_zeros_of_the_dtype_and_shape_asked():
    for dtype in (torch.float32, torch.bfloat16, torch.long):
        t = memory.zeros_on_demand((3, 1 << 17), dtype, torch.device("cpu"))
        assert t.shape == (3, 1 << 17) and t.dtype == dtype and t.is_contiguous()
        assert not t.any()
        t[2, -1] = 7  # writable, to the last element
        assert int(t.sum()) == 7


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_a_cache_holds_the_memory_of_the_positions_written_not_of_its_capacity():
    # 4 layers of 256 channels, 16,384 positions: 64 MB of keys and as much of values.
    cfg = e7_config(16384, 1024, 4, 2, 256)
    capacity = 16384
    half_of_keys = cfg.n_layer * (capacity // 2) * cfg.n_kv_head * cfg.head_dim * 4
    before = _rss()
    cache = KVCache(cfg, 1, capacity, torch.device("cpu"), torch.float32)
    made = _rss()
    assert made - before < 8 * MB, "a fresh cache is resident"
    cache.k[:, :, : capacity // 2] = 1.0  # the keys of the first half of the positions
    written = _rss()
    assert half_of_keys * 0.9 < written - made < half_of_keys + 8 * MB
    del cache
    assert _rss() - before < 8 * MB, "a dropped cache keeps its pages"


def test_a_kempnerforge_cache_too_holds_only_the_positions_written():
    # 4 layers, 4 KV heads of 64 channels, 16,384 positions: 64 MB of keys and as much of values.
    cfg = KFModelConfig(256, 4, 4, 4, 1024, 1024, "rmsnorm", 1e-5, "silu", 16384, 1e4, False, False, "math")
    capacity = 16384
    before = _rss()
    cache = KFCache(cfg, capacity, torch.device("cpu"), torch.float32)
    made = _rss()
    assert made - before < 8 * MB, "a fresh cache is resident"
    # zeros, as torch.zeros gave (read at both ends: reading every page would map them all)
    assert all(not t[:, :, [0, -1]].any() for t in (*cache.k, *cache.v))
    cache.reserve(capacity * 2)  # growing keeps the written positions and takes no new pages
    assert _rss() - before < 16 * MB
    del cache
    assert _rss() - before < 8 * MB, "a dropped cache keeps its pages"


@pytest.mark.parametrize("draft", ["", "int8"], ids=["plain", "speculative"])
def test_the_prefills_freed_heap_goes_back_after_the_first_token_not_at_the_replys_end(monkeypatch, draft):
    """Both loops give the prompt's freed activations back to the OS once the first token is out:
    the caches still fill while the reply streams, and the peak is the prefill's plus theirs."""
    released: list[int] = []
    streamed: list[int] = []

    def release() -> None:
        released.append(len(streamed))

    for module in (generation, speculative):
        monkeypatch.setattr(module, "release_freed_memory", release)
    backend = open_backend(DEMO, LoadOptions(dtype="float32"))
    prompt = backend.render([Message.of_text("user", "Tell me about yourself.")], 32)
    params = SamplingParams(temperature=0.0, max_tokens=32)
    options = StreamOptions(draft=draft, draft_k=2 if draft else 0)
    events = backend.stream(prompt, params, threading.Event(), options)
    for event in events:
        streamed.append(event.id)
        if len(streamed) == 2:
            assert 1 in released, "nothing was given back once the first token was out"
    assert len(streamed) > 2
    backend.close()
