"""Self-checks of the checkpoint fixtures (checkpoint_factory) and the reference model (reference_model).

Expected keys, shapes and meta fields below are written again from the spec
(/work/shared/specs/checkpoint-formats.md §1.1, §1.3-1.5, §2.1-2.2), not taken from the factory, so a slip in
either one shows up here.
"""

from __future__ import annotations

import math
import pickle
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from support.checkpoint_factory import (
    ERAS,
    FORK_ERAS,
    REMOVE,
    UNSUPPORTED_VARIANTS,
    add_key,
    default_config,
    drop_key,
    make_meta,
    make_state_dict,
    model_file,
    read_checkpoint,
    set_nan,
    truncate_file,
    write_checkpoint,
    write_huge_meta,
    write_pickled_code_model,
    write_with_wrong_vocab,
)
from support.reference_model import (
    apply_rope,
    bigram_hash,
    causal_ngram_average,
    layer_windows,
    mhc_weights,
    reference_greedy,
    reference_logits,
    rope_tables,
)

MHC_ERAS = ("fork_mhc", "fork_engram_mhc")
CAUSAL_ERAS = tuple(era for era in ERAS if era not in MHC_ERAS)
SIX_KEYS = {"sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd"}
VE_GATE_WIDTH = {"E3": 32, "E4": 32, "E5": 32, "E6": 12, "E7": 12}


def _fixture(era: str, **cfg_overrides):
    cfg = default_config(era, **cfg_overrides)
    return make_state_dict(era, cfg), make_meta(era, cfg)["model_config"]


def _spec_shapes(era: str, mc: dict) -> dict[str, tuple[int, ...]]:
    """Keys and shapes that spec §1.3/§1.4/§2.1 require for ``era`` with meta model_config ``mc``."""
    C, L, V, H, Hkv = mc["n_embd"], mc["n_layer"], mc["vocab_size"], mc["n_head"], mc["n_kv_head"]
    hd = C // H
    rows = V if era == "E0" else math.ceil(V / 64) * 64
    swiglu = era == "fork_swiglu"
    hidden = 8 * math.ceil(int(8 * C / 3) / 8) if swiglu else 4 * C

    def block(prefix: str) -> dict[str, tuple[int, ...]]:
        shapes = {
            prefix + "attn.c_q.weight": (H * hd, C),
            prefix + "attn.c_k.weight": (Hkv * hd, C),
            prefix + "attn.c_v.weight": (Hkv * hd, C),
            prefix + "attn.c_proj.weight": (C, C),
            prefix + "mlp.c_fc.weight": (hidden, C),
            prefix + "mlp.c_proj.weight": (C, hidden),
        }
        if swiglu:
            shapes[prefix + "mlp.c_gate.weight"] = (hidden, C)
        return shapes

    shapes = {"transformer.wte.weight": (rows, C), "lm_head.weight": (rows, C)}
    for i in range(L):
        shapes.update(block(f"transformer.h.{i}."))
    if era not in ("E0", "E0pad"):
        shapes.update(resid_lambdas=(L,), x0_lambdas=(L,))
    if era in VE_GATE_WIDTH:
        for i in range(L):
            if i % 2 == (L - 1) % 2:
                shapes[f"value_embeds.{i}.weight"] = (rows, Hkv * hd)
                shapes[f"transformer.h.{i}.attn.ve_gate.weight"] = (Hkv, VE_GATE_WIDTH[era])
    if era == "E4":
        shapes.update({"bigram_embed.embed.weight": (5 * V, C), "bigram_lambdas": (L,)})
    if era == "E7":
        shapes.update({"smear_gate.weight": (1, 24), "smear_lambda": (1,), "backout_lambda": (1,)})
    if mc.get("engram_enabled"):
        cb = mc["engram_bottleneck_dim"] or C // 4
        orders = list(dict.fromkeys(int(o) for o in mc["engram_ngram_orders"].split(",") if int(o) > 0))
        for raw in mc["engram_layers"].split(","):
            p = f"transformer.h.{int(raw) % L}.engram."
            shapes.update({p + "in_proj.weight": (cb, C), p + "out_proj.weight": (C, cb)})
            shapes.update({f"{p}order_mix.{j}.weight": (cb, cb) for j in range(len(orders))})
    if mc.get("mhc_enabled"):
        hid = max(8, min(256, C // 4))
        for i in range(L):
            shapes[f"transformer.h.{i}.mhc.score_proj.weight"] = (hid, C)
            shapes[f"transformer.h.{i}.mhc.score_out.weight"] = (1, hid)
    if mc.get("mtp_enabled"):
        shapes["mtp.proj.weight"] = (C, 2 * C)
        shapes.update(block("mtp.block."))
    if mc.get("dsa_enabled"):
        heads, dim = mc["dsa_indexer_heads"], mc["dsa_indexer_dim"]
        for i in range(mc["dsa_start_layer"], L):
            p = f"transformer.h.{i}.attn.indexer."
            shapes.update({p + "q_proj.weight": (heads * dim, C), p + "k_proj.weight": (dim, C)})
            shapes[p + "w_proj.weight"] = (heads, C)
    return shapes


# --- factory: files, keys, shapes, meta ------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
def test_every_era_writes_native_files_with_spec_keys(tmp_path, era):
    ckpt = write_checkpoint(tmp_path, era, step=7, tokenizer=None)
    L = default_config(era).n_layer
    assert ckpt == tmp_path / "base_checkpoints" / f"d{L}"
    assert sorted(p.name for p in ckpt.iterdir()) == ["meta_000007.json", "model_000007.pt"]
    sd = torch.load(ckpt / "model_000007.pt", map_location="cpu", weights_only=True)
    _, meta = read_checkpoint(ckpt)
    # what model.state_dict() returns: an OrderedDict carrying each module's version
    assert type(sd) is OrderedDict and all(isinstance(v, torch.Tensor) for v in sd.values())
    holders = {".".join(k.split(".")[:i]) for k in sd for i in range(k.count(".") + 1)}
    assert holders <= set(sd._metadata)
    assert all(m in holders or m.endswith(".engram.dropout") for m in sd._metadata)
    assert {k: tuple(v.shape) for k, v in sd.items()} == _spec_shapes(era, meta["model_config"])
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in sd.values())


def test_vocab_padding_only_from_e0pad_on():
    V = default_config("E0").vocab_size
    assert V % 64 != 0
    assert make_state_dict("E0")["transformer.wte.weight"].shape[0] == V
    assert make_state_dict("E0pad")["lm_head.weight"].shape[0] == math.ceil(V / 64) * 64


def test_same_seed_same_tensors_other_seed_other_tensors():
    a, b, c = make_state_dict("E7", seed=3), make_state_dict("E7", seed=3), make_state_dict("E7", seed=4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])


@pytest.mark.parametrize("era", ERAS)
def test_base_meta_fields(era):
    meta = make_meta(era, step=12)
    mc = meta["model_config"]
    fields = {"step", "val_bpb", "model_config", "user_config", "device_batch_size", "max_seq_len"}
    if era != "E0":  # the initial base_train had only the six fields above
        fields |= {"dataloader_state_dict", "loop_state"}
        assert set(meta["loop_state"]) == {"min_val_bpb", "smooth_train_loss", "total_training_time"}
    assert set(meta) == fields and meta["step"] == 12
    assert set(mc) >= SIX_KEYS
    assert ("window_pattern" in mc) == (era not in ("E0", "E0pad", "E1"))
    if era in FORK_ERAS:
        extras = {"rope_theta", "window_long", "window_short", "engram_enabled", "mhc_enabled"}
        assert extras | {"mtp_enabled", "dsa_enabled", "engram_layers", "mhc_num_branches"} <= set(mc)
        assert "activation" not in mc  # fork base_train never writes it (spec §2.2)
        assert meta["user_config"]["xla_flash_attn"] is False
    else:
        assert set(mc) <= SIX_KEYS | {"window_pattern"}


@pytest.mark.parametrize("era", ["E0", "E1", "E2", "E3", "E4", "fork_engram"])
def test_mid_meta_never_has_window_pattern(era):
    meta = make_meta(era, phase="mid")
    assert set(meta) == {"step", "val_bpb", "model_config", "user_config"}
    assert set(meta["model_config"]) == SIX_KEYS


@pytest.mark.parametrize("era", ["E5", "E6", "E7"])
def test_mid_phase_does_not_exist_after_its_deletion(era):
    with pytest.raises(ValueError, match="mid_train"):
        make_meta(era, phase="mid")


@pytest.mark.parametrize("era", ["E0", "E7", "fork_swiglu"])
def test_chat_rl_meta_is_only_model_config(era, tmp_path):
    ckpt = write_checkpoint(tmp_path, era, phase="chatrl", step=3, tokenizer=None)
    assert ckpt.parent.name == "chatrl_checkpoints"
    _, meta = read_checkpoint(ckpt)
    assert set(meta) == {"model_config"}


def test_chat_sft_meta_old_and_new_scripts():
    old, new = make_meta("E2", phase="chatsft"), make_meta("E7", phase="chatsft")
    assert "val_loss" in old and "user_config" not in old and "window_pattern" in old["model_config"]
    assert {"step", "val_bpb", "user_config"} <= set(new) and "window_pattern" in new["model_config"]
    assert "window_pattern" not in make_meta("E1", phase="chatsft")["model_config"]


def test_fork_sft_train_meta_has_every_field_including_activation():
    mc = make_meta("fork_swiglu", phase="sft")["model_config"]
    assert mc["activation"] == "swiglu" and mc["rope_theta"] == default_config("fork_swiglu").rope_theta
    assert make_meta("fork", phase="sft")["model_config"]["activation"] == "relu2"
    assert make_meta("fork_mhc", phase="chatsft")["model_config"]["mhc_enabled"] is True
    with pytest.raises(ValueError, match="phase"):
        make_meta("E7", phase="sft")


def test_meta_overrides_merge_and_remove(tmp_path):
    # The 2026-01-31 chat_sft rewrite lost window_pattern (spec §1.6 "known mislabels").
    ckpt = write_checkpoint(
        tmp_path,
        "E3",
        phase="chatsft",
        tokenizer=None,
        meta_overrides={"model_config": {"window_pattern": REMOVE}, "val_loss": REMOVE, "note": "x"},
    )
    _, meta = read_checkpoint(ckpt)
    assert set(meta["model_config"]) == SIX_KEYS
    assert "val_loss" not in meta and meta["note"] == "x" and meta["step"] == 10


def test_dtype_mixes_and_compiled_prefix(tmp_path):
    mixed, _ = read_checkpoint(write_checkpoint(tmp_path / "a", "E7", dtype_mix="cuda_mixed", tokenizer=None))
    embeddings = {k for k in mixed if k == "transformer.wte.weight" or k.startswith("value_embeds.")}
    assert len(embeddings) == 1 + 2  # wte + VE on layers 1 and 3 of 4
    assert all((v.dtype == torch.bfloat16) == (k in embeddings) for k, v in mixed.items())

    fork, _ = read_checkpoint(
        write_checkpoint(tmp_path / "b", "fork_engram", dtype_mix="bf16_all", tokenizer=None)
    )
    assert {v.dtype for v in fork.values()} == {torch.bfloat16}

    prefixed, _ = read_checkpoint(
        write_checkpoint(tmp_path / "c", "E2", compiled_prefix=True, tokenizer=None)
    )
    plain = make_state_dict("E2")
    assert set(prefixed) == {"_orig_mod." + k for k in plain}


def test_optimizer_files_follow_each_era(tmp_path):
    old = write_checkpoint(tmp_path / "a", "E0", step=5, with_optim=True, tokenizer=None)
    new = write_checkpoint(tmp_path / "b", "fork", step=5, with_optim=True, tokenizer=None)
    assert (old / "optim_000005.pt").is_file()
    assert isinstance(torch.load(new / "optim_000005_rank0.pt", weights_only=True), list)
    assert model_file(old).name == "model_000005.pt"


# --- hostile variants ------------------------------------------------------------------------------


def test_truncated_model_file_does_not_load(tmp_path):
    path = truncate_file(model_file(write_checkpoint(tmp_path, "E2", tokenizer=None)), 0.5)
    with pytest.raises(RuntimeError):
        torch.load(path, weights_only=True)


def test_key_edits_and_non_finite_values(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer=None)
    drop_key(ckpt, "smear_lambda")
    add_key(ckpt, "transformer.h.0.attn.surprise.weight")
    set_nan(ckpt, "backout_lambda")
    set_nan(ckpt, "x0_lambdas", float("inf"))
    sd, _ = read_checkpoint(ckpt)
    assert "smear_lambda" not in sd and "transformer.h.0.attn.surprise.weight" in sd
    assert torch.isnan(sd["backout_lambda"]).any() and torch.isinf(sd["x0_lambdas"]).any()
    with pytest.raises(KeyError, match="no_such_key"):
        drop_key(ckpt, "no_such_key")


def test_wrong_vocab_and_huge_meta(tmp_path):
    sd, meta = read_checkpoint(write_with_wrong_vocab(tmp_path / "a", "E7", tokenizer=None))
    claimed = meta["model_config"]["vocab_size"]
    assert sd["transformer.wte.weight"].shape[0] != math.ceil(claimed / 64) * 64
    sd, meta = read_checkpoint(write_huge_meta(tmp_path / "b", "E2", tokenizer=None))
    assert meta["model_config"]["n_embd"] == 10**9
    assert sd["transformer.wte.weight"].shape[1] == default_config("E2").n_embd


def test_pickled_code_runs_only_without_weights_only(tmp_path):
    path = write_pickled_code_model(tmp_path / "ckpt" / "model_000004.pt", tmp_path / "pwned")
    assert (tmp_path / "ckpt" / "meta_000004.json").is_file()
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    assert not (tmp_path / "pwned").exists()
    torch.load(path, weights_only=False)  # proves the fixture is live: the payload really runs
    assert (tmp_path / "pwned").exists()


def test_branch_only_variants_carry_their_markers():
    for variant in ("ve_branch", "ve_branch_single", "ve_branch_factored"):
        assert "v0_lambdas" in make_state_dict(variant)
    moe = make_state_dict("moe")
    assert any(k.startswith("transformer.h.0.moe.") for k in moe)
    assert not any(".mlp." in k for k in moe)
    assert "num_experts" in make_meta("moe")["model_config"]
    for variant in UNSUPPORTED_VARIANTS:
        sd, mc = make_state_dict(variant), make_meta(variant)["model_config"]
        with pytest.raises(ValueError, match="does not implement"):
            reference_logits(sd, mc, variant, [1, 2])


def test_tokenizer_files_land_in_base_tokenizer_dir(tmp_path):
    pytest.importorskip("support.tokenizer_factory")
    from tokenizers import Tokenizer

    write_checkpoint(tmp_path / "up", "E7")
    write_checkpoint(tmp_path / "fk", "fork")
    write_checkpoint(tmp_path / "both", "fork_mhc", tokenizer="both")
    V = default_config("E7").vocab_size
    with (tmp_path / "up" / "tokenizer" / "tokenizer.pkl").open("rb") as f:
        assert pickle.load(f).n_vocab == V  # our own fixture file, so a plain unpickle is fine here
    assert (tmp_path / "up" / "tokenizer" / "token_bytes.pt").is_file()
    assert Tokenizer.from_file(str(tmp_path / "fk" / "tokenizer" / "tokenizer.json")).get_vocab_size() == V
    assert not (tmp_path / "fk" / "tokenizer" / "tokenizer.pkl").exists()
    names = {p.name for p in (tmp_path / "both" / "tokenizer").iterdir()}
    assert names >= {"tokenizer.pkl", "tokenizer.json"}


# --- reference model -------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
def test_logits_are_finite_and_clearly_non_uniform(era):
    sd, mc = _fixture(era)
    logits = reference_logits(sd, mc, era, list(range(3, 35)))
    assert logits.shape == (32, mc["vocab_size"]) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    top_prob = torch.softmax(logits, dim=-1).max(dim=-1).values
    assert (top_prob > 10 / mc["vocab_size"]).all()


@pytest.mark.parametrize("era", CAUSAL_ERAS)
def test_reference_is_causal(era):
    sd, mc = _fixture(era)
    prefix = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]
    a = reference_logits(sd, mc, era, [*prefix, 50, 60, 70, 80])
    b = reference_logits(sd, mc, era, [*prefix, 250, 5, 99, 1])
    n = len(prefix)
    torch.testing.assert_close(a[:n], b[:n], rtol=0, atol=1e-5)
    assert not torch.allclose(a[n:], b[n:], atol=1e-3)


@pytest.mark.parametrize("era", ERAS)
def test_greedy_is_decided_by_clear_margins(era):
    """Each greedy step's top-1/top-2 gap dwarfs fp32 noise (~1e-5), so loader-vs-reference is stable."""
    sd, mc = _fixture(era)
    ids = [1, 2, 3]
    for _ in range(10):
        top = reference_logits(sd, mc, era, ids)[-1].topk(2)
        assert float(top.values[0] - top.values[1]) > 1e-4
        ids.append(int(top.indices[0]))


def test_reference_greedy_recomputes_the_full_forward_each_step():
    sd, mc = _fixture("E7")
    prompt = [9]  # nanochat's E7 forward refuses a 1-token prompt; the reference just computes it
    new = reference_greedy(sd, mc, "E7", prompt, 6)
    assert len(new) == 6 and all(0 <= t < mc["vocab_size"] for t in new)
    for step in range(6):
        assert int(reference_logits(sd, mc, "E7", prompt + new[:step])[-1].argmax()) == new[step]


def test_layer_windows_match_spec_examples():
    mc = {"n_layer": 4, "sequence_len": 2048, "window_pattern": "SSSL"}
    assert layer_windows("E2", mc) == [1024, 1024, 1024, 2048]
    assert layer_windows("E6", mc) == [768, 768, 768, 2048]
    assert layer_windows("E7", mc) == [512, 512, 512, 2048]
    assert layer_windows("E3", {**mc, "window_pattern": "S"}) == [1024, 1024, 1024, 2048]  # last is L
    assert layer_windows("E1", mc) == [None] * 4
    assert layer_windows("E5", {"n_layer": 2, "sequence_len": 64}) == [64, 64]  # missing pattern = "L"
    fork = {"n_layer": 3, "sequence_len": 64, "window_pattern": "SL", "window_long": 48, "window_short": 0}
    assert layer_windows("fork", fork) == [24, 48, 48]


def test_short_windows_change_logits_only_beyond_the_window():
    sd, mc = _fixture("E2")  # seq 64, pattern SL over 3 layers: windows [32, 64, 64]
    ids = [(5 * t + 3) % 290 for t in range(50)]
    windowed = reference_logits(sd, mc, "E2", ids)
    full = reference_logits(sd, {**mc, "window_pattern": "L"}, "E2", ids)
    torch.testing.assert_close(windowed[:33], full[:33], rtol=0, atol=1e-5)
    assert not torch.allclose(windowed[33:], full[33:], atol=1e-3)


@pytest.mark.parametrize("era", ["E6", "E7"])
def test_rounded_short_window_of_e6_e7(era):
    """With seq 64 the rounded S window is 128, wider than L (64): the layers differ past position 64."""
    sd, mc = _fixture(era)
    ids = [(7 * t + 1) % 290 for t in range(100)]
    short = reference_logits(sd, mc, era, ids)
    long_only = reference_logits(sd, {**mc, "window_pattern": "L"}, era, ids)
    torch.testing.assert_close(short[:65], long_only[:65], rtol=0, atol=1e-5)
    assert not torch.allclose(short[65:], long_only[65:], atol=1e-3)


def test_long_window_is_sequence_len_not_unlimited():
    """E1 (no windows) and E2 with pattern "L" share keys; they part ways after sequence_len tokens."""
    sd, mc = _fixture("E2")
    ids = [(3 * t + 2) % 290 for t in range(80)]
    unlimited = reference_logits(sd, mc, "E1", ids)
    windowed = reference_logits(sd, {**mc, "window_pattern": "L"}, "E2", ids)
    torch.testing.assert_close(unlimited[:65], windowed[:65], rtol=0, atol=1e-5)
    assert not torch.allclose(unlimited[65:], windowed[65:], atol=1e-3)


def test_fork_with_every_extra_off_is_e2():
    sd, fork_mc = _fixture("fork")
    e2_mc = make_meta("E2", default_config("fork"))["model_config"]
    ids = list(range(40, 80))
    torch.testing.assert_close(
        reference_logits(sd, fork_mc, "fork", ids), reference_logits(sd, e2_mc, "E2", ids)
    )
    shifted = reference_logits(sd, {**fork_mc, "rope_theta": 5e5}, "fork", ids)
    assert not torch.allclose(shifted, reference_logits(sd, fork_mc, "fork", ids), atol=1e-3)


def test_e5_is_e3_with_softcap_20():
    sd, mc = _fixture("E3")
    ids = list(range(10, 30))
    # E5 also stopped rounding the rotary tables to bf16 (COMPUTE_DTYPE, fp32 on CPU), so the two
    # differ only by that rounding: well under the softcap change's effect checked below.
    torch.testing.assert_close(
        reference_logits(sd, mc, "E5", ids),
        reference_logits(sd, mc, "E3", ids, softcap=20),
        atol=2e-2,
        rtol=0,
    )
    assert not torch.allclose(
        reference_logits(sd, mc, "E5", ids), reference_logits(sd, mc, "E3", ids), atol=1e-3
    )


def test_prefix_and_bf16_embeddings_are_handled(tmp_path):
    ids = list(range(20))
    mixed, meta = read_checkpoint(
        write_checkpoint(tmp_path, "E7", dtype_mix="cuda_mixed", compiled_prefix=True, tokenizer=None)
    )
    sd = make_state_dict("E7")
    rounded = {
        k: v.bfloat16().float() if k.startswith(("transformer.wte", "value_embeds")) else v
        for k, v in sd.items()
    }
    mc = meta["model_config"]
    torch.testing.assert_close(
        reference_logits(mixed, mc, "E7", ids), reference_logits(rounded, mc, "E7", ids)
    )


def test_e7_smear_leaves_position_zero_alone_and_backout_acts_everywhere():
    sd, mc = _fixture("E7")
    ids = [5, 9, 200, 17, 33]
    base = reference_logits(sd, mc, "E7", ids)
    no_smear = reference_logits({**sd, "smear_lambda": torch.zeros(1)}, mc, "E7", ids)
    no_backout = reference_logits({**sd, "backout_lambda": torch.zeros(1)}, mc, "E7", ids)
    torch.testing.assert_close(base[0], no_smear[0], rtol=0, atol=1e-6)
    assert not torch.allclose(base[1:], no_smear[1:], atol=1e-3)
    assert not torch.allclose(base[0], no_backout[0], atol=1e-3)


def test_e4_first_position_uses_the_reserved_bigram_row():
    sd, mc = _fixture("E4")
    V = mc["vocab_size"]
    table = sd["bigram_embed.embed.weight"].clone()
    table[5 * V - 1] += 1.0
    ids = [4, 8, 15]
    base = reference_logits(sd, mc, "E4", ids)
    bumped = reference_logits({**sd, "bigram_embed.embed.weight": table}, mc, "E4", ids)
    assert not torch.allclose(base[0], bumped[0], atol=1e-3)


def test_bigram_hash_properties():
    V = 300
    ids = [3, 7, 3, 7, 299, 0]
    h = bigram_hash(ids, V)
    assert h[0] == 5 * V - 1 and all(0 <= x < 5 * V - 1 for x in h[1:])
    assert h[1] == h[3]  # same (prev, cur) pair, same bucket
    assert h[1] == (36313 * 7 ^ 27191 * 3) % (5 * V - 1)


def test_rope_rotates_by_minus_theta():
    cos, sin = rope_tables(3, 2, 10000.0)
    x = torch.tensor([1.0, 0.0]).view(1, 1, 2).expand(3, 1, 2)
    y = apply_rope(x, cos, sin)
    theta = torch.arange(3, dtype=torch.float32)
    torch.testing.assert_close(y[:, 0, 0], theta.cos(), atol=1e-2, rtol=0)  # bf16-rounded tables
    torch.testing.assert_close(y[:, 0, 1], -theta.sin(), atol=1e-2, rtol=0)


def test_engram_average_matches_left_padded_avg_pool():
    z = torch.randn(9, 5, generator=torch.Generator().manual_seed(1))
    for order in (1, 2, 3, 4):
        pooled = F.avg_pool1d(F.pad(z.T[None], (order - 1, 0)), kernel_size=order, stride=1)[0].T
        torch.testing.assert_close(causal_ngram_average(z, order), pooled)


def test_mhc_weights_are_uniform_unless_the_clamp_bites():
    gen = torch.Generator().manual_seed(2)
    branches = [torch.randn(6, 8, generator=gen) for _ in range(3)]
    proj, out = torch.randn(8, 8, generator=gen), torch.randn(1, 8, generator=gen)
    w = mhc_weights(branches, proj, out, temperature=1.0, epsilon=1e-6, sinkhorn_iters=5)
    torch.testing.assert_close(w, torch.full((3,), 1 / 3), atol=1e-5, rtol=0)
    signs = [torch.ones(6, 8), -torch.ones(6, 8)]
    steep = mhc_weights(
        signs, 10 * torch.ones(1, 8), torch.tensor([[10.0]]), temperature=1.0, epsilon=1e-6, sinkhorn_iters=5
    )
    assert abs(float(steep.sum()) - 1) < 1e-4 and abs(float(steep[0] - steep[1])) > 0.01


def test_mhc_blend_alpha_zero_keeps_the_baseline_branch():
    sd, mc = _fixture("fork_mhc")
    plain_sd = {k: v for k, v in sd.items() if ".mhc." not in k}
    ids = list(range(30, 50))
    blended = reference_logits(sd, {**mc, "mhc_blend_alpha": 0.0}, "fork_mhc", ids)
    torch.testing.assert_close(blended, reference_logits(plain_sd, {**mc, "mhc_enabled": False}, "fork", ids))


def test_reference_rejects_bad_input():
    sd, mc = _fixture("E2")
    with pytest.raises(ValueError, match="token ids"):
        reference_logits(sd, mc, "E2", [mc["vocab_size"]])
    with pytest.raises(ValueError, match="10\\*sequence_len"):
        reference_logits(sd, mc, "E2", [1] * (10 * mc["sequence_len"] + 1))
    with pytest.raises(ValueError, match="does not implement"):
        reference_logits(sd, mc, "E8", [1])
