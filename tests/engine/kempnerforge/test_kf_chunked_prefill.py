"""A long prompt to a KempnerForge run prefills in chunks where this machine gives one pass's bits
that way, as nanochat's does (tests/engine/nanochat/test_chunked_prefill.py). The run is the
golden ``long-context`` case, trained and saved by KempnerForge's own code with a context of
2,048 positions; its golden.json holds what KempnerForge's ``generate`` gave for a prompt of
more than three chunks (test_golden_kempnerforge.py reproduces those ids through the default
prefill)."""

from __future__ import annotations

import threading

import pytest
import torch
from support.chunk_checks import chunk_checks
from support.golden import GOLDEN, manifest

from desktop.engine.backend import GenerationStats, LoadOptions, StreamOptions
from desktop.engine.decode.chunked import PREFILL_CHUNK
from desktop.engine.kempnerforge.backend import KempnerForgeBackend
from desktop.engine.kempnerforge.model import KFCache, KFTransformer
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

CASE = GOLDEN / "kempnerforge" / "long-context"


def _open(kernels, step: int | None = None) -> KempnerForgeBackend:
    backend = open_backend(
        CASE / "run", LoadOptions(step=step, device="cpu", dtype="float32", kernel_cache=kernels)
    )
    assert isinstance(backend, KempnerForgeBackend)
    return backend


def _long_prompt(step: int) -> list[int]:
    ids = max((c["prompt_ids"] for c in manifest(CASE)["expected"][str(step)]), key=len)
    assert len(ids) > 2 * PREFILL_CHUNK
    return ids


def _prefill(model: KFTransformer, ids: list[int], chunk: int | None) -> tuple[torch.Tensor, KFCache]:
    cache = KFCache(model.config, len(ids), model.device, model.compute_dtype)
    return model(torch.tensor([ids]), cache, last_only=True, chunk=chunk), cache


@pytest.mark.parametrize("step", manifest(CASE)["steps"])
def test_a_long_prompt_leaves_one_passs_logits_and_cache(step, tmp_path):
    kernels = tmp_path / "kernels.json"
    backend = _open(kernels, step)
    ids = _long_prompt(step)
    default, default_cache = _prefill(backend.model, ids, chunk=None)
    one_pass, one_pass_cache = _prefill(backend.model, ids, chunk=0)
    assert torch.equal(default, one_pass)
    assert default_cache.same_as(one_pass_cache)
    assert list(chunk_checks(kernels).values()) in ([0.0], [1.0])
    backend.close()


@pytest.mark.parametrize("draft", ["", "int8"], ids=["plain", "speculative"])
def test_stop_during_a_long_prompt_ends_its_prefill_and_the_next_send_goes_on_from_what_was_done(
    tmp_path, draft
):
    """A long paste to a KempnerForge run, Stop before the first token, send again: the first reply
    says nothing, and the second prefills only what the first did not. In KempnerForge's own
    loop (plain) and in the shared speculative one."""
    kernels = tmp_path / "kernels.json"
    backend = _open(kernels)
    prompt = backend.render(backend.tok.decode(_long_prompt(manifest(CASE)["latest"])), 8)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    options = StreamOptions(draft=draft, draft_k=2 if draft else 0)

    stop = threading.Event()
    stop.set()  # pressed while the prompt is prefilled
    first = GenerationStats()
    said = [e for e in backend.stream(prompt, params, stop, options, first) if e.id >= 0]
    checked = list(chunk_checks(kernels).values())
    assert checked in ([0.0], [1.0])
    chunked = checked == [1.0]

    again = GenerationStats()
    reply = [e.id for e in backend.stream(prompt, params, threading.Event(), options, again) if e.id >= 0]
    assert (said, first.new_tokens, first.stopped) == ([], 0, "cancelled")
    assert again.prefilled_tokens == (prompt.tokens - PREFILL_CHUNK if chunked else 1)
    assert len(reply) == again.new_tokens > 0
    backend.close()


def test_an_int8_draft_copy_prefills_in_chunks_without_a_check(tmp_path):
    kernels = tmp_path / "kernels.json"
    backend = _open(kernels)
    draft = backend.model.with_kernels("int8")
    ids = _long_prompt(manifest(CASE)["latest"])
    stop = threading.Event()
    stop.set()
    cache = KFCache(draft.config, len(ids), draft.device, draft.compute_dtype)
    draft(torch.tensor([ids]), cache, last_only=True, cancel=stop)
    assert (cache.pos, cache.tokens) == (PREFILL_CHUNK, ids[:PREFILL_CHUNK])
    assert not chunk_checks(kernels)
    backend.close()
