"""KV-cache decoding equals full-forward decoding for every era (spec §1.7, §5.3, §5.5 (c)).

Three computations are compared: incremental decoding through ``KVCache``, the same model recomputing the
whole sequence every step, and the independent reference forward. Prompts are longer than every attention
window and than ``sequence_len``, so sliding-window masks over a cache are exercised. Chunk appends to a
non-empty cache (what a chat app does on every turn) must equal a fresh prefill: that is where E7 smear,
E4 bigram hashing and Engram histories go wrong when done naively.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from support.checkpoint_factory import ERAS, read_checkpoint, write_checkpoint
from support.reference_model import layer_windows, reference_greedy, reference_logits

from desktop.engine.decode.kvcache import KVCache
from desktop.engine.nanochat.loader import load_model
from desktop.engine.nanochat.model import rotary_tables

ATOL = 1e-4
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def eras(tmp_path_factory):
    """era -> (loaded model, state dict, meta model_config), each era written and loaded once."""
    root = tmp_path_factory.mktemp("kv")
    out = {}
    for era in ERAS:
        ckpt = write_checkpoint(root / era, era, seed=5, tokenizer=None)
        sd, meta = read_checkpoint(ckpt)
        softcap = 20.0 if era == "E5" else None  # the reference's E5 has softcap 20
        out[era] = (load_model(ckpt, device="cpu", softcap=softcap).model, sd, meta["model_config"])
    return out


def random_ids(n: int, seed: int, vocab: int = 300) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def long_prompt_len(era: str, mc: dict) -> int:
    """Longer than sequence_len and than every window of ``era``."""
    windows = [w for w in layer_windows(era, mc) if w is not None]
    return max([mc["sequence_len"], *windows]) + 8


def new_cache(model, capacity: int = 8) -> KVCache:
    # A small capacity on purpose: the cache must grow and keep its content.
    return KVCache(model.config, 1, capacity, model.device, torch.float32)


@torch.inference_mode()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids]))[0]


@torch.inference_mode()
def kv_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    cache = new_cache(model)
    logits = model(torch.tensor([prompt]), cache)[0, -1]
    out, steps = [], []
    for _ in range(n):
        steps.append(logits)
        out.append(int(logits.argmax()))
        logits = model(torch.tensor([[out[-1]]]), cache)[0, -1]
    assert cache.pos == len(prompt) + n
    return out, steps


@pytest.mark.parametrize("era", ERAS)
def test_greedy_kv_decoding_equals_full_forward_decoding(eras, era):
    model, sd, mc = eras[era]
    prompt = random_ids(long_prompt_len(era, mc), seed=1)
    kv_ids, kv_steps = kv_greedy(model, prompt, NEW_TOKENS)

    seq = list(prompt)
    for step_logits in kv_steps:  # the same model, recomputing the whole sequence each step
        full = full_logits(model, seq)[-1]
        torch.testing.assert_close(step_logits, full, atol=ATOL, rtol=0)
        seq.append(int(full.argmax()))
    assert kv_ids == seq[len(prompt) :]
    assert kv_ids == reference_greedy(sd, mc, era, prompt, NEW_TOKENS)


@pytest.mark.parametrize("era", ["E4", "E7", "fork_engram"])
def test_single_token_prompt(eras, era):
    # nanochat's E7 forward asserts T > 1 without a cache; an app must still start from one token.
    model, sd, mc = eras[era]
    kv_ids, _ = kv_greedy(model, [7], NEW_TOKENS)
    assert kv_ids == reference_greedy(sd, mc, era, [7], NEW_TOKENS)


@pytest.mark.parametrize("era", ERAS)
def test_chunk_appended_to_a_non_empty_cache_equals_a_fresh_prefill(eras, era):
    model, sd, mc = eras[era]
    ids = random_ids(long_prompt_len(era, mc) + 20, seed=2)
    cuts = [0, 37, 38, len(ids) - 25, len(ids)]  # multi-token, single-token, and long chunks
    cache = new_cache(model)
    chunks = []
    with torch.inference_mode():
        for a, b in itertools.pairwise(cuts):
            chunks.append(model(torch.tensor([ids[a:b]]), cache)[0])
    assert cache.pos == len(ids)
    incremental = torch.cat(chunks)
    torch.testing.assert_close(incremental, full_logits(model, ids), atol=ATOL, rtol=0)
    torch.testing.assert_close(incremental, reference_logits(sd, mc, era, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "era", ["E0", "E2", "E4", "E6", "E7", "fork_engram", "fork_engram_mhc", "fork_swiglu"]
)
def test_truncate_then_append_equals_fresh(eras, era):
    model, sd, mc = eras[era]
    first = random_ids(long_prompt_len(era, mc), seed=3)
    keep = len(first) - 30
    other = random_ids(40, seed=4)
    cache = new_cache(model)
    with torch.inference_mode():
        model(torch.tensor([first]), cache)
        cache.truncate(keep)
        assert cache.pos == keep
        appended = model(torch.tensor([other]), cache)[0]
    assert cache.pos == keep + len(other)
    joined = first[:keep] + other
    torch.testing.assert_close(appended, full_logits(model, joined)[keep:], atol=ATOL, rtol=0)
    torch.testing.assert_close(appended, reference_logits(sd, mc, era, joined)[keep:], atol=ATOL, rtol=0)


def test_truncate_refuses_positions_past_the_end(eras):
    model = eras["E2"][0]
    cache = new_cache(model)
    with torch.inference_mode():
        model(torch.tensor([random_ids(5, seed=0)]), cache)
    for bad in (-1, 6):
        with pytest.raises(ValueError):
            cache.truncate(bad)
    cache.truncate(5)
    assert cache.pos == 5


@pytest.mark.parametrize("era", ["E2", "E4", "E7", "fork_engram", "fork_mhc"])
def test_replicated_rows_continue_like_row_zero(eras, era):
    model, _, mc = eras[era]
    prompt = random_ids(long_prompt_len(era, mc), seed=6)
    cache = new_cache(model)
    with torch.inference_mode():
        model(torch.tensor([prompt]), cache)
        rows = cache.replicate(3)
        assert (rows.batch, rows.pos) == (3, len(prompt))
        same = model(torch.tensor([[9], [9], [9]]), rows)[:, -1]
        original = model(torch.tensor([[9]]), cache)[0, -1]
        # then a different token per row: each row goes on with its own sequence
        nexts = [5, 17, 250]
        apart = model(torch.tensor(nexts).unsqueeze(1), rows)[:, -1]
    for i in range(3):
        # batch 3 vs batch 1 may pick different kernels: equal up to float noise, not bit for bit
        torch.testing.assert_close(same[i], original, atol=ATOL, rtol=0)
        expected = full_logits(model, [*prompt, 9, nexts[i]])[-1]
        torch.testing.assert_close(apart[i], expected, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_rotary_rows_grow_on_demand_with_the_same_values(eras):
    """The rotary table starts short and grows as decoding goes past it; the rows it grows are
    the ones the full table (nanochat's 10x sequence_len) holds."""
    model = eras["E7"][0]
    cfg = model.config
    full = rotary_tables(cfg, model.device, model.compute_dtype, cfg.rope_len)
    ids = torch.tensor([random_ids(30, seed=11)])
    model.set_rotary(model.device, model.compute_dtype, length=8)
    try:
        cache = new_cache(model)
        grown = [model(ids[:, :4], cache)] + [model(ids[:, t : t + 1], cache) for t in range(4, 30)]
        assert model.rotation.size(1) >= 30
        assert torch.equal(model.rotation, full[:, : model.rotation.size(1)])
    finally:
        model.set_rotary(model.device, model.compute_dtype)
    cache = new_cache(model)
    whole = [model(ids[:, :4], cache)] + [model(ids[:, t : t + 1], cache) for t in range(4, 30)]
    for a, b in zip(grown, whole, strict=True):
        assert torch.equal(a, b)
