"""The inside of Hugging Face folders (docs/INSIDE.md): the golden folders transformers' own
``save_pretrained`` wrote (tests/golden/transformers/: its NanoChat port, a Llama saved in
bfloat16 and opened in float32, a Llama over six shards)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from support.golden import GOLDEN

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.hf.backend import HFBackend
from desktop.engine.hf.model import FULL_WINDOW
from desktop.engine.inside import Inside, InsideCache, inspect, inspect_all
from desktop.engine.registry import open_backend

CASES = sorted(p.parent for p in (GOLDEN / "transformers").glob("*/golden.json"))
LENGTH = 100


def sequence(backend: HFBackend) -> list[int]:
    vocab = backend.model.config.vocab_size
    return [(7 * i + 3) % vocab for i in range(LENGTH)]


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def opened(request):
    backend = open_backend(request.param, LoadOptions(device="cpu", dtype="float32"))
    assert isinstance(backend, HFBackend)
    yield request.param, backend
    backend.close()


def own_logits(backend: HFBackend, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return backend.model(torch.tensor([ids]), None, last_only=True)[0, -1]


def test_the_golden_folders_are_all_here():
    assert {c.name for c in CASES} >= {"nanochat", "llama-bf16", "llama-sharded"}


@pytest.mark.parametrize("position", [0, 37, LENGTH - 2])
def test_the_last_layers_lens_is_the_models_own_distribution_bit_for_bit(opened, position):
    _case, backend = opened
    ids = sequence(backend)
    inside = inspect(backend, ids, position)
    own = own_logits(backend, ids[: position + 1])
    raw, capped = inspect_all(backend, ids[: position + 1]).lens_logits(position)
    assert raw.shape == capped.shape == (backend.model.config.n_layer, backend.model.config.vocab_size)
    assert torch.equal(capped[-1], own)
    probs = torch.softmax(own, -1)
    top_p, top_i = probs.topk(5)
    last = inside.lens[-1]
    assert [g.token for g in last.top] == top_i.tolist()
    assert [g.prob for g in last.top] == top_p.tolist()
    assert last.produced_prob == float(probs[ids[position + 1]])
    assert last.produced_rank == int((own > own[ids[position + 1]]).sum()) + 1
    assert inside.exact and inside.note == ""
    assert inside.family == inside.era == backend.info().family
    assert inside.readout.startswith("the residual stream each layer returns")
    assert ("softcap" in inside.readout) == (backend.model.config.softcap is not None)


def test_attribution_terms_and_residual_sum_to_the_produced_logit(opened):
    _case, backend = opened
    ids = sequence(backend)
    cfg = backend.model.config
    for position in (1, 50, LENGTH - 2):
        att = inspect(backend, ids, position).attribution
        total = math.fsum(t.value for t in att.terms)
        assert abs(total + att.residual - att.pre_softcap) < 1e-4
        # The stream is the embedding plus every attention and MLP output; the final norm is
        # linear once its scale is fixed: what is left is float rounding (measured: below 6e-7).
        assert abs(att.residual) < 1e-5, att.residual
        if att.softcap:
            assert att.logit == pytest.approx(
                att.softcap * math.tanh(att.pre_softcap / att.softcap), abs=1e-5
            )
        else:
            assert att.logit == att.pre_softcap
        names = [t.name for t in att.terms]
        assert names == ["embedding"] + [f"L{i} {k}" for i in range(cfg.n_layer) for k in ("attn", "mlp")]
        assert len(att.heads) == cfg.n_layer and all(len(h) == cfg.n_head for h in att.heads)
        for layer, heads in enumerate(att.heads):  # the heads split the layer's attention output
            attention = next(t.value for t in att.terms if t.layer == layer and t.kind == "attn")
            assert sum(heads) == pytest.approx(attention, abs=1e-5)


def test_attention_rows_are_the_models_own_weights(opened):
    _case, backend = opened
    ids = sequence(backend)
    cache = inspect_all(backend, ids)
    model = backend.model
    assert model.config.n_kv_head < model.config.n_head  # GQA: query heads share KV heads
    for position in (0, 5, 70, LENGTH - 1):
        rows = cache.attention(position)
        for layer, heads in enumerate(rows):
            rec = cache._run.layers[layer]
            assert rec.window == FULL_WINDOW
            # The model's own attention function, asked for its weights: values = the identity.
            q, k = rec.q[None, :, position : position + 1], rec.k[None, :, : position + 1]
            eye = torch.eye(position + 1).expand(k.size(1), -1, -1)[None]
            with torch.inference_mode():
                want = model._attend(q, k, eye)[0, :, 0]
            got = torch.tensor(heads)
            assert got.shape == (model.config.n_head, position + 1)
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
    assert cache.at(3) is cache.at(3)
    saved = InsideCache.saved(json.loads(json.dumps(cache.to_dict())))
    assert saved[(3, ids[4])] == cache.at(3)
    assert Inside.from_dict(cache.at(60).to_dict()) == cache.at(60)
    end = cache.at(LENGTH - 1)  # the last position: the model's own top token
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
        (lambda: inspect_all(backend, [1] * (backend.model.config.rope_len + 1)), "past the model's context"),
    ]
    for call, words in cases:
        with pytest.raises(NanoscopeError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value)


def test_a_closed_model_says_so():
    backend = open_backend(CASES[0], LoadOptions(device="cpu", dtype="float32"))
    backend.close()
    with pytest.raises(NanoscopeError) as err:
        inspect(backend, [1, 2, 3], 1)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("dtype", ["fast", "int8"])
def test_approximate_modes_compute_and_say_so(dtype):
    try:
        backend = open_backend(GOLDEN / "transformers" / "llama-bf16", LoadOptions(device="cpu", dtype=dtype))
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
