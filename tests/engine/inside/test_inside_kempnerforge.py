"""The inside of KempnerForge runs (docs/INSIDE.md): the golden runs KempnerForge's own code
trained and saved (tests/golden/kempnerforge/: bf16 weights, run in float32), opened at a step,
and a LayerNorm run written by DCP from its model restated (support.kf_reference)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support.golden import GOLDEN, manifest
from support.kf_reference import RefConfig, write_run, write_tokenizer

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.inside import Inside, InsideCache, inspect, inspect_all
from desktop.engine.kempnerforge.backend import KempnerForgeBackend
from desktop.engine.registry import open_backend

CASES = sorted(p.parent for p in (GOLDEN / "kempnerforge").glob("*/golden.json"))
LENGTH = 100
# (case, step directory): each golden run at its first step and at latest
TARGETS = [(case, f"step_{manifest(case)['steps'][0]}") for case in CASES] + [(CASES[0], "latest")]


def open_cpu(target: Path) -> KempnerForgeBackend:
    backend = open_backend(target, LoadOptions(device="cpu", dtype="float32"))
    assert isinstance(backend, KempnerForgeBackend)
    return backend


def sequence(backend: KempnerForgeBackend) -> list[int]:
    vocab = backend.model.config.vocab_size
    return [(7 * i + 3) % vocab for i in range(LENGTH)]


@pytest.fixture(scope="module", params=TARGETS, ids=[f"{c.name}-{s}" for c, s in TARGETS])
def opened(request):
    case, step = request.param
    backend = open_cpu(case / "run" / step)
    yield case, backend
    backend.close()


def own_logits(backend: KempnerForgeBackend, ids: list[int]) -> torch.Tensor:
    """The model's next-token logits as its generation takes them (generate.py)."""
    with torch.inference_mode():
        return backend.model(torch.tensor([ids]), None, last_only=True)[0, -1]


@pytest.mark.parametrize("position", [0, 37, LENGTH - 2])
def test_the_last_layers_lens_is_the_models_own_distribution_bit_for_bit(opened, position):
    _case, backend = opened
    ids = sequence(backend)
    inside = inspect(backend, ids, position)
    own = own_logits(backend, ids[: position + 1])
    raw, capped = inspect_all(backend, ids[: position + 1]).lens_logits(position)
    assert raw.shape == (backend.model.config.n_layers, backend.model.config.vocab_size)
    assert torch.equal(raw, capped)  # no softcap
    assert torch.equal(capped[-1], own)
    probs = torch.softmax(own, -1)
    top_p, top_i = probs.topk(5)
    last = inside.lens[-1]
    assert [g.token for g in last.top] == top_i.tolist()
    assert [g.prob for g in last.top] == top_p.tolist()
    assert last.produced_prob == float(probs[ids[position + 1]])
    assert last.produced_rank == int((own > own[ids[position + 1]]).sum()) + 1
    assert inside.exact and inside.note == ""
    assert inside.family == "kempnerforge" and inside.era == backend.info().era
    assert inside.readout.startswith(
        "the residual stream each block returns, read out through the final RMSNorm"
    )


def check_attribution(backend: KempnerForgeBackend, ids: list[int], positions: tuple[int, ...]) -> None:
    cfg = backend.model.config
    for position in positions:
        att = inspect(backend, ids, position).attribution
        total = math.fsum(t.value for t in att.terms)
        assert abs(total + att.residual - att.pre_softcap) < 1e-4
        # Float rounding (measured: below 6e-7; 1e-6 with a LayerNorm).
        assert abs(att.residual) < 1e-5, att.residual
        assert att.softcap == 0 and att.logit == att.pre_softcap
        names = [t.name for t in att.terms]
        want = ["embedding"] + [f"L{i} {k}" for i in range(cfg.n_layers) for k in ("attn", "mlp")]
        if cfg.norm_type == "layernorm":
            want.append("final_norm_bias")
        assert names == want
        assert len(att.heads) == cfg.n_layers and all(len(h) == cfg.n_heads for h in att.heads)
        for layer, heads in enumerate(att.heads):
            attention = next(t.value for t in att.terms if t.layer == layer and t.kind == "attn")
            assert sum(heads) == pytest.approx(attention, abs=1e-5)


def test_attribution_terms_and_residual_sum_to_the_produced_logit(opened):
    _case, backend = opened
    check_attribution(backend, sequence(backend), (1, 50, LENGTH - 2))


def test_a_layernorm_run_attributes_through_its_centring_and_bias(tmp_path):
    tok = write_tokenizer(tmp_path / "tok")
    cfg = RefConfig(norm_type="layernorm", activation="gelu", tie_embeddings=True, ffn_hidden_dim=48)
    run, _ref = write_run(tmp_path, cfg, tokenizer=tok)
    backend = open_cpu(run)
    try:
        ids = sequence(backend)[:40]
        check_attribution(backend, ids, (5, 38))
        inside = inspect(backend, ids, 20)
        assert "final LayerNorm" in inside.readout
        assert torch.equal(
            inspect_all(backend, ids[:21]).lens_logits(20)[1][-1], own_logits(backend, ids[:21])
        )
    finally:
        backend.close()


def test_attention_rows_are_the_models_own_weights(opened):
    _case, backend = opened
    ids = sequence(backend)
    cache = inspect_all(backend, ids)
    model = backend.model
    assert model.config.n_kv_heads < model.config.n_heads  # GQA by repeat_interleave
    for position in (0, 5, 70, LENGTH - 1):
        rows = cache.attention(position)
        for layer, heads in enumerate(rows):
            rec = cache._run.layers[layer]
            # The model's own attention (GQA and SDPA) at this position, values = the identity.
            q, k = rec.q[None, :, position : position + 1], rec.k[None, :, : position + 1]
            eye = torch.eye(position + 1).expand(k.size(1), -1, -1)[None]
            with torch.inference_mode():
                want = model._attend(q, k, eye, position, False)[0, :, 0]
            got = torch.tensor(heads)
            assert got.shape == (model.config.n_heads, position + 1)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
            assert got.sum(-1).sub(1).abs().max() < 1e-5


def test_one_pass_for_a_reply_gives_every_position(opened):
    _case, backend = opened
    ids = sequence(backend)
    cache = inspect_all(backend, ids)
    for position in (3, 60):
        whole, alone = cache.at(position), inspect(backend, ids, position)
        for a, b in zip(whole.lens, alone.lens, strict=True):
            assert a.produced_prob == pytest.approx(b.produced_prob, abs=1e-5)
        assert whole.attribution.pre_softcap == pytest.approx(alone.attribution.pre_softcap, abs=1e-4)
    saved = InsideCache.saved(json.loads(json.dumps(cache.to_dict())))
    assert saved[(3, ids[4])] == cache.at(3)
    assert Inside.from_dict(cache.at(60).to_dict()) == cache.at(60)
    end = cache.at(LENGTH - 1)
    assert end.produced == end.lens[-1].top[0].token and end.lens[-1].produced_rank == 1


def test_the_pass_leaves_the_model_as_it_was(opened):
    _case, backend = opened
    ids = sequence(backend)[:30]
    before = own_logits(backend, ids)
    attrs = sorted(vars(backend.model))
    inspect(backend, ids, 10)
    assert sorted(vars(backend.model)) == attrs
    assert torch.equal(own_logits(backend, ids), before)


def test_bad_input_is_one_readable_line(opened):
    _case, backend = opened
    ids = sequence(backend)[:10]
    cases = [
        (lambda: inspect(backend, ids, 10), "position 10 is past the end: the tokens are at 0..9"),
        (lambda: inspect(backend, [], 0), "nothing to inspect: the prompt is empty"),
        (lambda: inspect(backend, [1, 99999], 0), "token ids out of range"),
        (
            lambda: inspect_all(backend, [1] * (backend.model.config.max_seq_len + 1)),
            "past the model's context",
        ),
    ]
    for call, words in cases:
        with pytest.raises(NanoscopeError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("dtype", ["fast", "int8"])
def test_approximate_modes_compute_and_say_so(dtype):
    try:
        backend = open_backend(CASES[0] / "run", LoadOptions(device="cpu", dtype=dtype))
    except NanoscopeError as exc:  # int8 needs an x86 CPU
        pytest.skip(str(exc))
    try:
        if backend.model.kernel_kind not in ("fp16", "int8") and backend.model.compute_dtype == torch.float32:
            pytest.skip(f"{dtype} runs float32 kernels on this machine")
        inside = inspect(backend, sequence(backend)[:50], 40)
        assert not inside.exact and inside.note and "\n" not in inside.note
        att = inside.attribution
        assert abs(math.fsum(t.value for t in att.terms) + att.residual - att.pre_softcap) < 1e-4
        assert abs(sum(inside.attention[0][0]) - 1) < 1e-3
    finally:
        backend.close()


def test_a_head_held_in_a_kernels_own_form_is_attributed_through_its_product():
    """Fast and int8 modes free a packed head's fp32 matrix: the attribution then takes the
    head's row through the model's own product (as nanochat's does), to the same numbers."""
    backend = open_cpu(CASES[0] / "run")
    try:
        ids = sequence(backend)[:50]
        want = inspect(backend, ids, 40).attribution
        model = backend.model
        head = model.output
        kept = head.clone()
        model._products[id(head)] = lambda x: torch.nn.functional.linear(x, kept)
        head.set_(torch.empty(0, dtype=head.dtype).untyped_storage())  # as own_products frees it
        got = inspect(backend, ids, 40).attribution
        assert [t.name for t in got.terms] == [t.name for t in want.terms]
        for a, b in zip(got.terms, want.terms, strict=True):
            assert a.value == pytest.approx(b.value, abs=1e-5)
        assert abs(got.residual) < 1e-4
    finally:
        backend.close()
