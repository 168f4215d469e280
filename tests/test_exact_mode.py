"""Exact mode changes no bits, and the fast modes stay close.

Exact mode's speed-ups (row-split matrix-vector products, q and k handled as one tensor, scalars
kept as tensors, no module call machinery) must give the logits nanochat's own code path gives,
bit for bit: the benchmark's nanochat-style forward (``benchmarks/nanochat_baseline.py``,
written op for op after nanochat's ``gpt.py``) is the yardstick, and so is this model with
torch's plain ``F.linear``. The fp16 and int8 modes are measured against exact mode instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from checkpoint_factory import default_config, write_checkpoint

from desktop.engine import gemv
from desktop.engine.device import pick_precision
from desktop.engine.kvcache import KVCache
from desktop.engine.loader import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from nanochat_baseline import NanochatE7

VOCAB = 1000


@pytest.fixture
def threads():
    """Run a test at several intra-op thread counts; the row split depends on the count."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture
def small_splits(monkeypatch):
    """Split even the tiny test matrices, so every product takes the exact-mode path."""
    monkeypatch.setattr(gemv, "MIN_SPLIT_BYTES", 1)


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB - 10, (1, n), generator=torch.Generator().manual_seed(seed))


def _checkpoint(tmp_path, era: str, n_layer: int = 2):
    cfg = default_config(era, n_embd=128, vocab_size=VOCAB, n_layer=n_layer)
    return write_checkpoint(tmp_path, era, cfg=cfg, tokenizer=None)


@torch.inference_mode()
def _decode(model, ids: torch.Tensor, prefill: int) -> list[torch.Tensor]:
    """Logits of a prefill of ``ids[:, :prefill]`` and then of one decode step per remaining id."""
    cache = KVCache(model.config, 1, 8, model.device, model.compute_dtype)
    out = [model(ids[:, :prefill], cache)]
    out += [model(ids[:, t : t + 1], cache) for t in range(prefill, ids.size(1))]
    return out


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("era", ["E0pad", "E3", "E4", "E7", "fork_engram", "fork_mhc", "fork_swiglu"])
def test_exact_mode_equals_plain_linear_bit_for_bit(tmp_path, small_splits, threads, era, n_threads):
    threads(n_threads)
    ckpt = _checkpoint(tmp_path, era)
    exact = load_model(ckpt).model
    plain = load_model(ckpt).model
    plain.prepare(plain.device, torch.float32, "plain")
    ids = _ids(40)
    for a, b in zip(_decode(exact, ids, 30), _decode(plain, ids, 30), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_exact_mode_equals_nanochat_forward_bit_for_bit(tmp_path, small_splits, threads, n_threads):
    threads(n_threads)
    ckpt = _checkpoint(tmp_path, "E7", n_layer=4)
    model = load_model(ckpt).model
    reference = NanochatE7(ckpt, 10)
    ids = _ids(24, seed=3)
    ours = _decode(model, ids, 16)
    with torch.inference_mode():
        cache = reference.new_cache(24)
        theirs = [reference.forward(ids[:, :16], cache)]
        theirs += [reference.forward(ids[:, t : t + 1], cache) for t in range(16, 24)]
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("rows", [96, 97, 1000, 4096])
@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_exact_linear_gives_f_linear_bits(small_splits, threads, rows, n_threads):
    threads(n_threads)
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(rows, 192, generator=g)
    product = gemv.ExactLinear(weight)
    with torch.inference_mode():
        for shape in [(1, 192), (1, 1, 192), (1, 1, 1, 192), (3, 192), (2, 5, 192)]:
            for _ in range(3):  # the first call checks the split against F.linear; later ones use it
                x = torch.randn(shape, generator=g)
                assert torch.equal(product(x), F.linear(x, weight))


def test_exact_linear_splits_across_threads(small_splits, threads):
    threads(2)
    product = gemv.ExactLinear(torch.randn(4096, 64))
    with torch.inference_mode():
        product(torch.randn(1, 64))
    blocks, _view = product._plans[2]
    # On this machine's BLAS the split gives F.linear's bits, so it is kept after its check.
    assert blocks == 2 * gemv.BLOCKS_PER_THREAD
    assert gemv._verdicts[(4096, 64, blocks, torch.float32)] is True


def test_a_split_that_changed_bits_is_never_used(small_splits, threads, monkeypatch):
    threads(2)
    weight = torch.randn(512, 64)
    monkeypatch.setitem(gemv._verdicts, (512, 64, 4, torch.float32), False)
    product = gemv.ExactLinear(weight)
    with torch.inference_mode():
        x = torch.randn(1, 64)
        assert torch.equal(product(x), F.linear(x, weight))
    assert product._plans[2] is None


def test_row_counts_that_do_not_divide_use_fewer_blocks():
    assert gemv._blocks_for(4096, 2) == 4
    assert gemv._blocks_for(99, 2) == 3
    assert gemv._blocks_for(97, 8) == 1  # a prime: no split at all
    assert gemv._blocks_for(4096, 1) == 1  # one thread: F.linear itself


@pytest.mark.skipif(not gemv.fbgemm_available(), reason="needs torch's fbgemm (x86)")
@pytest.mark.parametrize(("precision", "kind", "max_kl"), [("fast", "fp16", 1e-4), ("int8", "int8", 0.15)])
def test_packed_modes_stay_close_to_exact(tmp_path, precision, kind, max_kl):
    ckpt = _checkpoint(tmp_path, "E7")
    exact = load_model(ckpt).model
    packed = load_model(ckpt, dtype=precision)
    assert packed.precision == pick_precision(torch.device("cpu"), precision)
    assert packed.precision.gemv == kind
    model = packed.model
    # The packed kernels own their weights: the fp32 matrices are gone, and a step reads
    # 2 (fp16) or 1 (int8) bytes per weight of those matrices.
    lm_head = model.lm_head.forward
    assert model.lm_head.weight is None
    assert lm_head.weight_nbytes == exact.lm_head.weight.numel() * (2 if kind == "fp16" else 1)
    assert model.decode_bytes() < exact.decode_bytes()
    # These tiny random models are peaked on purpose (see checkpoint_factory), which makes int8's
    # activation rounding show far more than on trained models (docs/PERFORMANCE.md has both).
    ids = _ids(40, seed=1)
    for a, b in zip(_decode(exact, ids, 30), _decode(model, ids, 30), strict=True):
        kl = F.kl_div(F.log_softmax(b, -1), F.log_softmax(a, -1), log_target=True, reduction="none")
        assert kl.sum(-1).mean().item() < max_kl
