"""The inside of nanochat-family models (docs/INSIDE.md): every golden era and the fork's
variants, opened from the files nanochat's own code wrote (tests/golden/)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support.checkpoint_factory import default_config, write_checkpoint
from support.golden import CASES, manifest

from desktop.engine.backend import LoadOptions
from desktop.engine.decode.attention import sdpa_attention
from desktop.engine.errors import NanoscopeError
from desktop.engine.inside import Inside, InsideCache, inspect, inspect_all
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.remote.backend import RemoteBackend
from desktop.engine.remote.servers import ServerEndpoint

FORK_CASES = sorted(p.parent for p in (Path(__file__).parents[2] / "golden" / "fork").glob("*/golden.json"))
ALL_CASES = sorted(set(CASES) | set(FORK_CASES))
LENGTH = 100  # past E3's sliding window of 64 (sequence_len 128 / 2)


def open_case(case: Path, dtype: str = "float32") -> NanochatBackend:
    m = manifest(case)
    directory = case / "chatsft_checkpoints" / m["tag"]
    return NanochatBackend.open(
        directory, LoadOptions(step=m["step"], device="cpu", dtype=dtype, base_dir=case)
    )


def sequence(case: Path) -> list[int]:
    """A case's first prompt, then ids of every kind up to LENGTH tokens."""
    ids = list(manifest(case)["cases"][0]["prompt_ids"])
    return (ids + [(7 * i + 3) % 290 for i in range(LENGTH)])[:LENGTH]


@pytest.fixture(scope="module", params=ALL_CASES, ids=[f"{c.parent.name}-{c.name}" for c in ALL_CASES])
def opened(request):
    backend = open_case(request.param)
    yield request.param, backend
    backend.close()


def own_logits(backend: NanochatBackend, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return backend.model(torch.tensor([ids]), None, last_only=True)[0, -1]


def test_the_fork_cases_are_all_here():
    assert {c.name for c in FORK_CASES} >= {"plain", "engram", "mhc", "engram-mhc-mtp-swiglu"}


@pytest.mark.parametrize("position", [0, 37, LENGTH - 2])
def test_the_last_layers_lens_is_the_models_own_distribution_bit_for_bit(opened, position):
    case, backend = opened
    ids = sequence(case)
    inside = inspect(backend, ids, position)
    own = own_logits(backend, ids[: position + 1])
    raw, capped = inspect_all(backend, ids[: position + 1]).lens_logits(position)
    assert raw.shape == capped.shape
    assert torch.equal(capped[-1], own)
    probs = torch.softmax(own, -1)
    top_p, top_i = probs.topk(5)
    last = inside.lens[-1]
    assert [g.token for g in last.top] == top_i.tolist()
    assert [g.prob for g in last.top] == top_p.tolist()
    assert last.produced_prob == float(probs[ids[position + 1]])
    assert last.produced_rank == int((own > own[ids[position + 1]]).sum()) + 1
    assert inside.exact and inside.note == ""
    assert len(inside.lens) == backend.model.config.n_layer
    assert inside.readout.startswith("the residual stream each block returns")


def test_attribution_terms_and_residual_sum_to_the_produced_logit(opened):
    case, backend = opened
    ids = sequence(case)
    cfg = backend.model.config
    for position in (1, 50, LENGTH - 2):
        att = inspect(backend, ids, position).attribution
        total = math.fsum(t.value for t in att.terms)
        assert abs(total + att.residual - att.pre_softcap) < 1e-4
        # Every era's stream is linear in its paths once the final norm is linearised at the
        # actual stream: what is left is float rounding (measured: below 2e-6 on every case).
        assert abs(att.residual) < 1e-4, (case.name, att.residual)
        assert att.logit == pytest.approx(att.softcap * math.tanh(att.pre_softcap / att.softcap), abs=1e-5)
        kinds = {t.kind for t in att.terms}
        assert {"embedding", "attn", "mlp"} <= kinds
        assert ("smear" in kinds) == ("backout" in kinds) == cfg.has_smear
        assert ("value_embed" in kinds) == bool(cfg.ve_layers)
        assert ("engram" in kinds) == bool(cfg.engram_layers)
        assert ("bigram" in kinds) == cfg.has_bigram
        assert len(att.heads) == cfg.n_layer and all(len(h) == cfg.n_head for h in att.heads)
        for layer, heads in enumerate(att.heads):  # the heads split the layer's attention output
            attention = sum(
                t.value for t in att.terms if t.layer == layer and t.kind in ("attn", "value_embed")
            )
            assert sum(heads) == pytest.approx(attention, abs=1e-4)


def test_attention_rows_are_the_models_own_weights(opened):
    case, backend = opened
    ids = sequence(case)
    cache = inspect_all(backend, ids)
    windows = backend.model.windows
    for position in (0, 5, 70, LENGTH - 1):
        rows = cache.attention(position)
        for layer, heads in enumerate(rows):
            rec = cache._run.layers[layer]
            # The model's own attention function, asked for its weights: values = the identity.
            q, k = rec.q[None, :, position : position + 1], rec.k[None, :, : position + 1]
            eye = torch.eye(position + 1).expand(k.size(1), -1, -1)[None]
            with torch.inference_mode():
                want = sdpa_attention(q, k, eye, windows[layer])[0, :, 0]
            got = torch.tensor(heads)
            assert got.shape == (backend.model.config.n_head, position + 1)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
            assert got.sum(-1).sub(1).abs().max() < 1e-5
            start = max(0, position - windows[layer])
            assert (got[:, :start] == 0).all()


def test_sliding_windows_leave_zeros_before_the_window():
    case = next(c for c in CASES if c.name == "E3")
    backend = open_case(case)
    try:
        inside = inspect(backend, sequence(case), LENGTH - 1)
        window = backend.model.windows[0]
        assert window < LENGTH - 1  # layer 0 slides
        first = LENGTH - 1 - window
        assert all(w == 0 for row in inside.attention[0] for w in row[:first])
        assert all(row[first] > 0 for row in inside.attention[0])
        assert all(w > 0 for row in inside.attention[-1] for w in row)  # the last layer is full
    finally:
        backend.close()


def test_grouped_query_attention_and_windows_as_the_model_computes_them(tmp_path):
    cfg = default_config("E3", n_head=4, n_kv_head=2, sequence_len=64)
    directory = write_checkpoint(tmp_path, "E3", cfg=cfg, seed=5)
    backend = NanochatBackend.open(directory, LoadOptions(device="cpu", dtype="float32"))
    try:
        ids = [(5 * i + 1) % 290 for i in range(60)]
        cache = inspect_all(backend, ids)
        model = backend.model
        assert model.config.n_kv_head == 2 and model.windows[0] < 50
        for position in (10, 59):
            for layer, heads in enumerate(cache.attention(position)):
                rec = cache._run.layers[layer]
                eye = torch.eye(position + 1).expand(2, -1, -1)[None]
                with torch.inference_mode():
                    want = sdpa_attention(
                        rec.q[None, :, position : position + 1],
                        rec.k[None, :, : position + 1],
                        eye,
                        model.windows[layer],
                    )[0, :, 0]
                torch.testing.assert_close(torch.tensor(heads), want, atol=1e-6, rtol=0)
        inside = inspect(backend, ids, 59)
        assert inside.exact
        assert torch.equal(inspect_all(backend, ids).lens_logits(59)[1][-1], own_logits(backend, ids))
        att = inside.attribution
        assert abs(att.residual) < 1e-4
    finally:
        backend.close()


def test_one_pass_for_a_reply_gives_every_position(opened):
    case, backend = opened
    ids = sequence(case)
    cache = inspect_all(backend, ids)
    for position in (3, 60):
        whole, alone = cache.at(position), inspect(backend, ids, position)
        assert [g.token for g in whole.lens[-1].top[:2]] == [g.token for g in alone.lens[-1].top[:2]]
        for a, b in zip(whole.lens, alone.lens, strict=True):
            assert a.produced_prob == pytest.approx(b.produced_prob, abs=1e-5)
        assert whole.attribution.pre_softcap == pytest.approx(alone.attribution.pre_softcap, abs=1e-4)
    assert cache.at(3) is cache.at(3)  # kept
    saved = InsideCache.saved(json.loads(json.dumps(cache.to_dict())))
    assert saved[(3, ids[4])] == cache.at(3)
    assert Inside.from_dict(cache.at(60).to_dict()) == cache.at(60)


def test_the_last_position_attributes_the_models_own_top_token(opened):
    case, backend = opened
    ids = sequence(case)[:20]
    inside = inspect(backend, ids, 19)
    assert inside.produced == inside.lens[-1].top[0].token
    assert inside.lens[-1].produced_rank == 1
    assert inside.first_top1 is not None
    given = inspect(backend, ids, 19, produced=5)
    assert given.produced == 5 and given.attribution.token == 5


def test_the_pass_leaves_the_model_as_it_was(opened):
    case, backend = opened
    ids = sequence(case)[:30]
    before = own_logits(backend, ids)
    modules = [backend.model, *backend.model.modules()]
    attrs = [sorted(vars(m)) for m in modules]
    inspect(backend, ids, 10)
    assert [sorted(vars(m)) for m in modules] == attrs
    assert torch.equal(own_logits(backend, ids), before)


def test_bad_input_is_one_readable_line(opened):
    case, backend = opened
    ids = sequence(case)[:10]
    cases = [
        (lambda: inspect(backend, ids, 10), "position 10 is past the end: the tokens are at 0..9"),
        (lambda: inspect(backend, ids, -1), "position -1 is past the end"),
        (lambda: inspect(backend, [], 0), "nothing to inspect: the prompt is empty"),
        (lambda: inspect_all(backend, []), "nothing to inspect: the prompt is empty"),
        (lambda: inspect(backend, [1, 99999], 0), "token ids out of range"),
        (lambda: inspect(backend, ids, 2, produced=10**6), "out of range"),
        (lambda: inspect_all(backend, [1] * (backend.model.config.rope_len + 1)), "past the model's context"),
    ]
    for call, words in cases:
        with pytest.raises(NanoscopeError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value)


def test_a_served_model_has_no_inside():
    endpoint = ServerEndpoint(server_id="local", name="test server", url="http://127.0.0.1:9/v1")
    served = RemoteBackend(endpoint, "d20", "remote:local/d20", None, 5.0)
    try:
        with pytest.raises(NanoscopeError) as err:
            inspect(served, [1, 2, 3], 1)
        assert "a served model has no inside to show" in str(err.value) and "\n" not in str(err.value)
    finally:
        served.close()


@pytest.mark.parametrize("dtype", ["fast", "int8"])
def test_approximate_modes_compute_and_say_so(dtype):
    case = next(c for c in CASES if c.name == "E7")
    try:
        backend = open_case(case, dtype)
    except NanoscopeError as exc:  # int8 needs an x86 CPU
        pytest.skip(str(exc))
    try:
        if backend.model.kernel_kind not in ("fp16", "int8") and backend.model.compute_dtype == torch.float32:
            pytest.skip(f"{dtype} runs float32 kernels on this machine")
        inside = inspect(backend, sequence(case), 40)
        assert not inside.exact and inside.note and "\n" not in inside.note
        att = inside.attribution
        assert abs(math.fsum(t.value for t in att.terms) + att.residual - att.pre_softcap) < 1e-4
        assert abs(sum(inside.attention[0][0]) - 1) < 1e-3
    finally:
        backend.close()
