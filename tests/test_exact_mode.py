"""Exact mode's speed-ups change no bits: fused q/k/v and row-parallel GEMV give identical logits."""

from __future__ import annotations

import pytest
import torch
from checkpoint_factory import default_config, write_checkpoint

from desktop.engine import parallel_linear
from desktop.engine.kvcache import KVCache
from desktop.engine.loader import load_model


@pytest.mark.parametrize("era", ["E0pad", "E3", "E7", "fork_engram"])
def test_decode_paths_are_bit_identical(tmp_path, monkeypatch, era):
    # A low threshold so the tiny test matrices take the row-parallel path too.
    monkeypatch.setattr(parallel_linear, "MIN_BYTES", 1)
    cfg = default_config(era, n_embd=128, vocab_size=1000)
    ckpt = write_checkpoint(tmp_path, era, cfg=cfg, tokenizer=None)
    fast = load_model(ckpt).model
    assert any(b.attn._qkv is not None for b in fast.transformer.h)
    assert isinstance(fast.lm_head.forward, parallel_linear.RowLinear) and fast.lm_head.forward.halves
    plain = load_model(ckpt).model
    plain.prepare(plain.device, torch.float32, decode_paths=False)
    for block in plain.transformer.h:
        block.attn._qkv = None
    for m in plain.modules():
        m.__dict__.pop("forward", None)
    ids = torch.randint(0, 1000, (1, 40), generator=torch.Generator().manual_seed(0))
    caches = [KVCache(m.config, 1, 64, m.device, torch.float32) for m in (fast, plain)]
    for model, cache in zip((fast, plain), caches, strict=True):
        model(ids[:, :30], cache)
    with torch.inference_mode():
        for t in range(30, 40):  # single-row decode steps: the parallel paths are taken here
            a = fast(ids[:, t : t + 1], caches[0])
            b = plain(ids[:, t : t + 1], caches[1])
            assert torch.equal(a, b)
