"""A long prompt to a Hugging Face model prefills in chunks where this machine gives one pass's bits
that way, as nanochat's does (tests/engine/nanochat/test_chunked_prefill.py): on folders
transformers' own ``save_pretrained`` wrote, the default prefill leaves one pass's cache and
transformers' own greedy ids, and Stop during it ends the pass after a chunk."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from support.chunk_checks import chunk_checks, greedy_after_prefill
from support.hf_factory import load_reference, write_hf_model

from desktop.engine.backend import GenerationStats, LoadOptions
from desktop.engine.decode.chunked import PREFILL_CHUNK
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.hf.backend import HFBackend
from desktop.engine.hf.model import HFCausalLM
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

ROWS = 2 * PREFILL_CHUNK + 37  # three chunks, the last one ragged
CONTEXT = 2048


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-long")
    return {
        kind: write_hf_model(root / kind, kind, seed=i, max_position_embeddings=CONTEXT)
        for i, kind in enumerate(("nanochat", "llama"))
    }


def _open(folder: Path, kernels: Path, dtype: str = "float32") -> HFBackend:
    backend = open_backend(folder, LoadOptions(device="cpu", dtype=dtype, kernel_cache=kernels))
    assert isinstance(backend, HFBackend)
    return backend


def _greedy(
    model: HFCausalLM, ids: torch.Tensor, chunk: int | None, new: int = 8
) -> tuple[list[int], KVCache]:
    cache = KVCache(model.config, 1, ids.size(1) + new, model.device, model.compute_dtype)  # type: ignore[arg-type]
    return greedy_after_prefill(model, ids, cache, chunk, new), cache


@pytest.mark.parametrize("kind", ["nanochat", "llama"])
def test_a_long_prompt_leaves_one_passs_cache_and_transformers_greedy_ids(folders, kind, tmp_path):
    kernels = tmp_path / "kernels.json"
    backend = _open(folders[kind], kernels)
    model = backend.model
    ids = torch.randint(model.config.vocab_size, (1, ROWS), generator=torch.Generator().manual_seed(5))

    default_ids, default_cache = _greedy(model, ids, chunk=None)
    one_pass_ids, one_pass_cache = _greedy(model, ids, chunk=0)
    reference, _ = load_reference(folders[kind])
    with torch.inference_mode():
        generated = reference.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8
        )

    assert default_ids == one_pass_ids == generated[0, ROWS:].tolist()
    assert default_cache.same_as(one_pass_cache)
    # Whichever way the check went on this CPU, it was made once and kept.
    assert list(chunk_checks(kernels).values()) in ([0.0], [1.0])
    backend.close()


def test_stop_during_a_long_prompt_ends_its_prefill_and_the_next_send_goes_on_from_what_was_done(
    folders, tmp_path
):
    """A long paste to a Hugging Face model, Stop before the first token, send again: the first
    reply says nothing, and the second prefills only what the first did not."""
    kernels = tmp_path / "kernels.json"
    backend = _open(folders["nanochat"], kernels)
    text = " ".join(f"line {i}: the cat sat on the mat" for i in range(150))
    prompt = backend.render(text, 8)
    assert CONTEXT > prompt.tokens > PREFILL_CHUNK
    params = SamplingParams(temperature=0.0, max_tokens=8)

    stop = threading.Event()
    stop.set()  # pressed while the prompt is prefilled
    first = GenerationStats()
    said = [e for e in backend.stream(prompt, params, stop, stats=first) if e.id >= 0]
    checked = list(chunk_checks(kernels).values())
    assert checked in ([0.0], [1.0])  # the prompt was long enough to ask this machine
    chunked = checked == [1.0]

    again = GenerationStats()
    reply = [e.id for e in backend.stream(prompt, params, threading.Event(), stats=again) if e.id >= 0]
    assert (said, first.new_tokens, first.stopped) == ([], 0, "cancelled")
    assert again.prefilled_tokens == (prompt.tokens - PREFILL_CHUNK if chunked else 1)
    assert len(reply) == again.new_tokens > 0
    backend.close()


def test_an_int8_draft_copy_prefills_in_chunks_without_a_check(folders, tmp_path):
    """A draft's int8 kernels promise an error bound, not transformers' bits: it chunks unchecked."""
    kernels = tmp_path / "kernels.json"
    backend = _open(folders["llama"], kernels)
    draft = backend.model.with_kernels("int8")
    ids = torch.randint(draft.config.vocab_size, (1, ROWS), generator=torch.Generator().manual_seed(9))
    stop = threading.Event()
    stop.set()
    cache = KVCache(draft.config, 1, ROWS, draft.device, draft.compute_dtype)  # type: ignore[arg-type]
    draft(ids, cache, last_only=True, cancel=stop)
    assert cache.pos == PREFILL_CHUNK
    assert not chunk_checks(kernels)
    backend.close()
