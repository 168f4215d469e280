"""Exact mode changes no bits, at any thread count, and the fast modes stay close.

Exact mode's speed-ups (row-split matrix-vector products, q|k|v as one product, q and k handled
as one tensor, scalars kept as tensors, no module call machinery) must give the logits the plain
path gives, bit for bit: the same checkpoint prepared with torch's own ``F.linear`` and q, k and v
as three products, and for E7 the nanochat-style forward (``benchmarks/nanochat_baseline.py``,
written op for op after nanochat's ``gpt.py``). A BLAS may sum a product in another order for
another row count, thread count or alignment, so every count runs in turn on the same models,
including more threads than cores. The fp16 and int8 modes are measured against exact mode.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from support import REPO
from support.checkpoint_factory import default_config, write_checkpoint

from desktop.engine.decode.kvcache import KVCache
from desktop.engine.kernels import gemv
from desktop.engine.kernels.device import pick_precision
from desktop.engine.kernels.tuning import KernelTuner
from desktop.engine.nanochat.config import e7_config
from desktop.engine.nanochat.loader import load_model
from desktop.engine.nanochat.model import Attention

sys.path.insert(0, str(REPO / "benchmarks"))
from check_exact import first_divergence, load_plain, run_model, run_nanochat
from nanochat_baseline import NanochatE7

VOCAB = 1000
CORES = os.cpu_count() or 1
# In this order on the same models: a route checked at one count must not be trusted at another.
THREAD_COUNTS = sorted({1, 2, 3, 4, 2 * CORES + 1})


@pytest.fixture
def threads():
    """Set the intra-op thread count for a test; the previous count comes back afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch):
    """Each test checks routes afresh (a fault injected in one test must not decide another's)."""
    monkeypatch.setattr(gemv, "_verdicts", {})


@pytest.fixture
def small_splits(monkeypatch):
    """Split even the tiny test matrices, so every product takes the exact-mode path."""
    monkeypatch.setattr(gemv, "MIN_SPLIT_BYTES", 1)


def _nudged(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its first value moved to the next float: a product that differs in one bit."""
    out = t.clone()
    flat = out.view(-1)
    flat[0] = torch.nextafter(flat[0], flat[0] + 1)
    return out


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB - 10, (1, n), generator=torch.Generator().manual_seed(seed))


def _checkpoint(tmp_path, era: str, n_layer: int = 2):
    cfg = default_config(era, n_embd=128, vocab_size=VOCAB, n_layer=n_layer)
    return write_checkpoint(tmp_path, era, cfg=cfg, tokenizer=None)


def _misaligned(t: torch.Tensor, offset: int = 1) -> torch.Tensor:
    """A copy of ``t`` whose data starts ``offset`` elements past an allocation's start."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype)
    out = buf[offset:].view(t.shape)
    out.copy_(t)
    return out


@torch.inference_mode()
def _decode(model, ids: torch.Tensor, prefill: int) -> list[torch.Tensor]:
    """Logits of a prefill of ``ids[:, :prefill]`` and then of one decode step per remaining id."""
    cache = KVCache(model.config, 1, 8, model.device, model.compute_dtype)
    out = [model(ids[:, :prefill], cache)]
    out += [model(ids[:, t : t + 1], cache) for t in range(prefill, ids.size(1))]
    return out


def test_thread_counts_include_more_threads_than_cores():
    assert THREAD_COUNTS[0] == 1 and THREAD_COUNTS[-1] > CORES


@pytest.mark.parametrize("era", ["E0pad", "E3", "E4", "E7", "fork_engram", "fork_mhc", "fork_swiglu"])
def test_exact_mode_equals_plain_path_bit_for_bit(tmp_path, small_splits, threads, era):
    loaded = load_model(_checkpoint(tmp_path, era))
    plain = load_plain(loaded)
    assert plain.transformer.h[0].attn.qkv is None  # the reference multiplies q, k and v apart
    ids = _ids(40)
    for n in [*THREAD_COUNTS, 2]:  # and back to a count already planned
        threads(n)
        exact_steps, plain_steps = run_model(loaded.model, ids, 30), run_model(plain, ids, 30)
        found = first_divergence(exact_steps, plain_steps)
        assert found is None, f"{era}, {n} threads: {found}"
        for mine, theirs in zip(exact_steps, plain_steps, strict=True):  # each step's last record
            assert mine[-1][0] == theirs[-1][0] == "logits" and torch.equal(mine[-1][1], theirs[-1][1])


def test_exact_mode_equals_nanochat_forward_bit_for_bit(tmp_path, small_splits, threads):
    ckpt = _checkpoint(tmp_path, "E7", n_layer=4)
    model = load_model(ckpt).model
    reference = NanochatE7(ckpt, 10)
    ids = _ids(24, seed=3)
    for n in THREAD_COUNTS:
        threads(n)
        ours = _decode(model, ids, 16)
        with torch.inference_mode():
            cache = reference.new_cache(24)
            theirs = [reference.forward(ids[:, :16], cache)]
            theirs += [reference.forward(ids[:, t : t + 1], cache) for t in range(16, 24)]
        for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert torch.equal(a, b), f"{n} threads, step {step}"


@pytest.mark.parametrize("rows", [96, 97, 1000, 4096])
def test_exact_linear_gives_f_linear_bits(small_splits, threads, rows):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(rows, 192, generator=g)
    product = gemv.ExactLinear(weight)
    with torch.inference_mode():
        for n in THREAD_COUNTS:
            threads(n)
            for shape in [(1, 192), (1, 1, 192), (1, 1, 1, 192), (3, 192), (2, 5, 192)]:
                for _ in range(3):  # the first call checks the routes; later ones use the verdict
                    x = torch.randn(shape, generator=g)
                    assert torch.equal(product(x), F.linear(x, weight))
            x = _misaligned(torch.randn(1, 1, 192, generator=g))  # a row at another alignment
            assert torch.equal(product(x), F.linear(x, weight))


@pytest.mark.parametrize("parts", [(128, 64, 64), (128, 128, 128), (384, 96, 96)])
def test_fused_product_equals_the_separate_products(small_splits, threads, parts):
    """q|k|v as one matrix gives the bits of three F.linear calls on the three original matrices."""
    g = torch.Generator().manual_seed(sum(parts))
    separate = [torch.randn(rows, 192, generator=g) for rows in parts]
    product = gemv.ExactLinear(torch.cat(separate), parts)
    with torch.inference_mode():
        for n in THREAD_COUNTS:
            threads(n)
            for shape in [(1, 1, 192), (1, 192), (1, 7, 192)]:
                x = torch.randn(shape, generator=g)
                expected = torch.cat([F.linear(x, w) for w in separate], -1)
                assert torch.equal(product(x), expected), f"{n} threads, input {shape}"


def test_a_split_that_differs_is_caught_and_not_used(small_splits, threads, monkeypatch):
    real = gemv._split
    monkeypatch.setattr(gemv, "_split", lambda view, x: _nudged(real(view, x)))
    weight = torch.randn(512, 64)
    product = gemv.ExactLinear(weight)
    with torch.inference_mode():
        for n in THREAD_COUNTS:
            threads(n)
            for _ in range(3):
                x = torch.randn(1, 1, 64)
                assert torch.equal(product(x), F.linear(x, weight))


def test_a_verdict_is_checked_again_at_another_thread_count(small_splits, threads, monkeypatch):
    """The split of 128 rows is 4 blocks at 2 threads and at 3; a BLAS may agree at one count only
    (MKL's threaded SGEMV does), so agreement at 2 threads proves nothing at 3."""
    real = gemv._split

    def differs_at_3(view: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out = real(view, x)
        return _nudged(out) if torch.get_num_threads() == 3 else out

    monkeypatch.setattr(gemv, "_split", differs_at_3)
    weight = torch.randn(128, 64)
    product = gemv.ExactLinear(weight)
    with torch.inference_mode():
        for n in (2, 3, 2, 3):
            threads(n)
            x = torch.randn(1, 1, 64)
            assert torch.equal(product(x), F.linear(x, weight)), f"{n} threads"


def test_a_route_is_checked_again_for_another_input_alignment(small_splits, threads, monkeypatch):
    real = gemv._split

    def differs_when_misaligned(view: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out = real(view, x)
        return _nudged(out) if gemv.alignment(x) else out

    monkeypatch.setattr(gemv, "_split", differs_when_misaligned)
    threads(2)
    weight = torch.randn(128, 64)
    product = gemv.ExactLinear(weight)
    with torch.inference_mode():
        for x in (torch.randn(1, 1, 64), _misaligned(torch.randn(1, 1, 64))):
            assert torch.equal(product(x), F.linear(x, weight))


def test_a_fused_product_that_differs_falls_back_to_the_parts(small_splits, threads, monkeypatch):
    """Neither the split nor one F.linear of q|k|v agrees: each part then runs on its own."""
    real_split, real_linear = gemv._split, gemv._linear
    fused_rows = 256
    monkeypatch.setattr(gemv, "_split", lambda view, x: _nudged(real_split(view, x)))
    monkeypatch.setattr(
        gemv,
        "_linear",
        lambda w, x: _nudged(real_linear(w, x)) if w.shape[0] == fused_rows else real_linear(w, x),
    )
    separate = [torch.randn(rows, 64) for rows in (128, 64, 64)]
    product = gemv.ExactLinear(torch.cat(separate), (128, 64, 64))
    with torch.inference_mode():
        for n in THREAD_COUNTS:
            threads(n)
            x = torch.randn(1, 1, 64)
            assert torch.equal(product(x), torch.cat([F.linear(x, w) for w in separate], -1))


def test_the_fastest_route_that_agrees_is_used(small_splits, threads, monkeypatch):
    """The routes are timed here, and the fastest of those giving the plain bits serves one-row
    inputs (every split agrees by construction in this test, on any machine)."""
    calls = []

    def agreeing_split(view: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        calls.append(view.shape[0])
        return F.linear(x, weight)

    monkeypatch.setattr(gemv, "_split", agreeing_split)
    threads(2)
    weight = torch.randn(4096, 64)
    tuner = KernelTuner()
    product = tuner.exact(weight)
    with torch.inference_mode():
        product(torch.randn(1, 1, 64))  # times the routes, checks the fastest, then uses it
        (choice,) = tuner.describe([product])
        assert set(choice.timings_us) == set(product.routes(2))
        assert product.chosen == min(choice.timings_us, key=choice.timings_us.__getitem__)
        before = len(calls)
        product(torch.randn(1, 1, 64))
    chosen_split = product.chosen.startswith("split into ")
    assert len(calls) == before + chosen_split
    if chosen_split:
        assert calls[-1] == int(product.chosen.removeprefix("split into "))


def test_model_with_splits_that_differ_still_equals_plain_path(tmp_path, small_splits, threads, monkeypatch):
    real = gemv._split
    monkeypatch.setattr(gemv, "_split", lambda view, x: _nudged(real(view, x)))
    loaded = load_model(_checkpoint(tmp_path, "E7"))
    plain = load_plain(loaded)
    ids = _ids(36)
    for n in THREAD_COUNTS:
        threads(n)
        found = first_divergence(run_model(loaded.model, ids, 30), run_model(plain, ids, 30))
        assert found is None, f"{n} threads: {found}"


def test_check_exact_names_the_first_product_that_differs(tmp_path):
    """The diagnostic points at the op where exact and plain part ways, not just at the logits."""
    ckpt = _checkpoint(tmp_path, "E7")
    loaded = load_model(ckpt)
    plain = load_plain(loaded)
    mlp = loaded.model.transformer.h[1].mlp
    c_fc, *rest = mlp.products
    mlp.products = (lambda x: _nudged(c_fc(x)), *rest)
    ids = _ids(33)
    found = first_divergence(run_model(loaded.model, ids, 30), run_model(plain, ids, 30))
    assert found is not None
    assert (found.step, found.name, found.differing) == (0, "layer 1 mlp.c_fc", 1)
    assert found.last_equal == "layer 1 attn.c_proj"
    reference = NanochatE7(ckpt, 10)
    # The same op named against nanochat's own forward.
    found = first_divergence(run_model(loaded.model, ids, 30), run_nanochat(reference, ids, 30))
    assert found is not None and found.name == "layer 1 mlp.c_fc"


def test_q_k_v_stay_separate_where_fusing_would_move_them_to_another_alignment():
    cfg = e7_config(256, VOCAB, 1, 2, 128)
    attn = Attention(cfg, 0)
    attn.c_k.weight = nn.Parameter(_misaligned(attn.c_k.weight.detach()), requires_grad=False)
    attn.bind("exact", KernelTuner())
    assert attn.qkv is None
    x = torch.randn(1, 1, 128)
    with torch.inference_mode():
        qk, _v = attn._qkv(x)
        assert torch.equal(qk[:, :, 2:].reshape(1, 1, -1), F.linear(x, attn.c_k.weight))


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
    # The chosen kernels own their weights: the fp32 matrices are gone from the modules. Each
    # matrix is 16-bit (or 8-bit), or fp32 where this machine computes fp32 faster (small ones).
    lm_head = model.lm_head.forward
    assert model.lm_head.weight is None
    assert lm_head.weight_nbytes <= exact.lm_head.weight.numel() * 4
    assert model.decode_bytes() <= exact.decode_bytes()
    assert all(choice.mode in (kind, "exact") for choice in model.kernel_choices())
    # These tiny random models are peaked on purpose (see checkpoint_factory), which makes int8's
    # activation rounding show far more than on trained models (docs/PERFORMANCE.md has both).
    ids = _ids(40, seed=1)
    for a, b in zip(_decode(exact, ids, 30), _decode(model, ids, 30), strict=True):
        kl = F.kl_div(F.log_softmax(b, -1), F.log_softmax(a, -1), log_target=True, reduction="none")
        assert kl.sum(-1).mean().item() < max_kl
