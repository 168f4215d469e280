"""The real loader on native checkpoints of every era: classification, phases, dtypes, and logits.

Expected values come from the spec (/work/shared/specs/checkpoint-formats.md §1.1-1.6, §2.1-2.2, §5.2-5.4)
and from the independent reference forward in ``reference_model``; nothing is read back from the engine.
"""

from __future__ import annotations

import gc
import pathlib

import pytest
import torch
from support.checkpoint_factory import (
    ERAS,
    FORK_ERAS,
    REMOVE,
    default_config,
    engram_layer_set,
    engram_orders,
    read_checkpoint,
    write_checkpoint,
)
from support.checkpoint_factory import (
    model_file as checkpoint_model_file,
)
from support.reference_model import layer_windows, reference_logits

from desktop.engine.kernels import gemv
from desktop.engine.nanochat.loader import load_model

# E6/E7 get a longer context so that their short window (128 for both, spec §1.4) is shorter than "L".
CFG_OVERRIDES = {"E6": {"sequence_len": 256}, "E7": {"sequence_len": 256}}
EXPECTED_ERA = {era: era for era in ERAS} | {"E0pad": "E0", "E5": "E3"} | dict.fromkeys(FORK_ERAS, "fork")
ATOL = 1e-4


def era_config(era: str):
    return default_config(era, **CFG_OVERRIDES.get(era, {}))


@pytest.fixture(scope="module")
def era_dirs(tmp_path_factory) -> dict[str, object]:
    """One base checkpoint per era, each under its own base dir (tokenizers differ between eras)."""
    root = tmp_path_factory.mktemp("eras")
    return {era: write_checkpoint(root / era, era, cfg=era_config(era), seed=3) for era in ERAS}


def fixed_ids(n: int, vocab: int, seed: int = 11) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def model_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids]))[0]


# ---------------------------------------------------------------------------------------------------
# (a) classification


@pytest.mark.parametrize("era", ERAS)
def test_classifies_every_era(era_dirs, era):
    loaded = load_model(era_dirs[era], device="cpu")
    cfg, tiny = loaded.config, era_config(era)
    assert cfg.era == EXPECTED_ERA[era]
    assert loaded.step == 10
    assert loaded.precision.compute == torch.float32 and str(loaded.device) == "cpu"
    # spec §1.3: wte/lm_head rows are V before vocab padding (E0), the padded vocab after
    assert cfg.embed_rows == (tiny.vocab_size if era == "E0" else tiny.padded_vocab)
    # spec §5.2 era parameters
    assert cfg.softcap == 15.0
    expected_base = {"E6": 1e5, "E7": 1e5}.get(era, tiny.rope_theta if era in FORK_ERAS else 1e4)
    assert cfg.rope_base == expected_base
    assert cfg.qk_scale == {"E6": 1.15, "E7": 1.2}.get(era, 1.0)
    assert cfg.ve_gate_channels == {"E3": 32, "E4": 32, "E5": 32, "E6": 12, "E7": 12}.get(era, 0)
    assert cfg.has_bigram == (era == "E4")
    assert cfg.has_smear == (era == "E7")
    assert cfg.has_lambdas == (era not in ("E0", "E0pad"))


@pytest.mark.parametrize("era", [e for e in ERAS if e not in ("E0", "E0pad", "E1")])
def test_windows_follow_the_spec(era_dirs, era):
    _, meta = read_checkpoint(era_dirs[era])
    cfg = load_model(era_dirs[era], device="cpu").config
    assert cfg.window_sizes() == layer_windows(era, meta["model_config"])


@pytest.mark.parametrize("era", ["E0", "E0pad", "E1"])
def test_pre_window_eras_attend_over_the_whole_rotary_table(era_dirs, era):
    # E0/E1 were trained before sliding windows existed: plain causal attention (spec §1.4, §1.6).
    cfg = load_model(era_dirs[era], device="cpu").config
    assert all(w >= cfg.rope_len - 1 for w in cfg.window_sizes())


@pytest.mark.parametrize("era", FORK_ERAS)
def test_fork_features(era_dirs, era):
    cfg, tiny = load_model(era_dirs[era], device="cpu").config, era_config(era)
    engram = era in ("fork_engram", "fork_engram_mhc")
    assert cfg.engram_layers == (tuple(sorted(engram_layer_set(tiny))) if engram else ())
    assert cfg.engram_orders == (engram_orders(tiny) if engram else ())
    assert cfg.mhc == (era in ("fork_mhc", "fork_engram_mhc"))
    assert cfg.swiglu == (era == "fork_swiglu")
    assert cfg.has_mtp == (era == "fork_mtp_dsa")
    expected_dsa = tuple(range(tiny.dsa_start_layer, tiny.n_layer)) if era == "fork_mtp_dsa" else ()
    assert cfg.dsa_layers == expected_dsa


@pytest.mark.parametrize(
    ("era", "topic"),
    [("E3", "softcap"), ("E5", "softcap"), ("E4", "bigram"), ("fork_mtp_dsa", "DSA"), ("fork_mhc", "mHC")],
)
def test_spec_warnings(era_dirs, era, topic):
    # spec §5.4 "Warnings only": E3/E5 ambiguity, E4 bigram at decode, DSA dense, mHC pooling scope.
    warnings = load_model(era_dirs[era], device="cpu").warnings
    assert any(topic in w for w in warnings), warnings


@pytest.mark.parametrize("era", ["E2", "E6", "E7", "fork"])
def test_eras_without_caveats_load_without_warnings(era_dirs, era):
    assert load_model(era_dirs[era], device="cpu").warnings == []


def test_softcap_20_makes_an_e3_shaped_checkpoint_e5(era_dirs):
    loaded = load_model(era_dirs["E5"], device="cpu", softcap=20)
    assert loaded.config.era == "E5"
    assert loaded.config.softcap == 20.0
    # The ambiguity warning tells users to pass --softcap 20; once they have, it must not claim 15.
    assert not any("using softcap 15" in w for w in loaded.warnings), loaded.warnings


# ---------------------------------------------------------------------------------------------------
# phases, steps, file variants


@pytest.mark.parametrize("phase", ["base", "mid", "chatsft", "chatrl"])
def test_upstream_phases_load(tmp_path, phase):
    ckpt = write_checkpoint(tmp_path, "E2", phase=phase, step=37, tokenizer=None)
    loaded = load_model(ckpt, device="cpu")
    assert loaded.step == 37  # chatrl's meta has no step: it comes from the file name (spec §1.1)
    assert loaded.config.era in ("E1", "E2")  # mid never wrote window_pattern, so it reads as E1
    assert loaded.directory == ckpt


@pytest.mark.parametrize("phase", ["sft", "gspo", "rl"])
def test_fork_only_phases_load(tmp_path, phase):
    ckpt = write_checkpoint(tmp_path, "fork_engram", phase=phase, step=4, tokenizer=None)
    loaded = load_model(ckpt, device="cpu")
    assert (loaded.step, loaded.config.era) == (4, "fork")


def test_latest_step_by_default_and_an_explicit_step(tmp_path):
    old = write_checkpoint(tmp_path, "E7", step=5, seed=1, tokenizer=None)
    new = write_checkpoint(tmp_path, "E7", step=120, seed=2, tokenizer=None)
    assert old == new
    (old / "model_final.pt").write_bytes(b"stray file")  # not model_<digits>.pt: ignored
    ids = fixed_ids(20, 300)
    for step, loaded in ((120, load_model(old, device="cpu")), (5, load_model(old, step=5, device="cpu"))):
        assert loaded.step == step
        sd, meta = read_checkpoint(old, step)
        expected = reference_logits(sd, meta["model_config"], "E7", ids)
        torch.testing.assert_close(model_logits(loaded.model, ids), expected, atol=ATOL, rtol=0)


def test_compiled_prefix_is_stripped(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", compiled_prefix=True, tokenizer=None)
    sd, meta = read_checkpoint(ckpt)
    assert all(k.startswith("_orig_mod.") for k in sd)
    loaded = load_model(ckpt, device="cpu")
    assert loaded.config.era == "E7"
    ids = fixed_ids(30, 300)
    expected = reference_logits(sd, meta["model_config"], "E7", ids)
    torch.testing.assert_close(model_logits(loaded.model, ids), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("era", "mix"), [("E3", "cuda_mixed"), ("E7", "cuda_mixed"), ("fork_engram", "bf16_all")]
)
def test_bf16_tensors_run_in_float32_on_cpu(tmp_path, era, mix):
    ckpt = write_checkpoint(tmp_path, era, dtype_mix=mix, tokenizer=None)
    sd, meta = read_checkpoint(ckpt)
    assert torch.bfloat16 in {t.dtype for t in sd.values()}
    loaded = load_model(ckpt, device="cpu")
    assert loaded.precision.compute == torch.float32
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    ids = fixed_ids(40, 300)
    # The reference upcasts the stored bf16 values, as nanochat's checkpoint_manager does on CPU.
    expected = reference_logits(sd, meta["model_config"], era, ids)
    torch.testing.assert_close(model_logits(loaded.model, ids), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("era", ["E0", "E7", "fork"])
def test_optimizer_files_are_ignored(tmp_path, era):
    ckpt = write_checkpoint(tmp_path, era, with_optim=True, step=12, tokenizer=None)
    assert any(p.name.startswith("optim_") for p in ckpt.iterdir())
    loaded = load_model(ckpt, device="cpu")
    assert loaded.step == 12 and loaded.config.era == EXPECTED_ERA[era]


@pytest.mark.parametrize("phase", ["mid", "chatsft"])
@pytest.mark.parametrize("era", ["E2", "E3"])
def test_missing_window_pattern_is_borrowed_from_the_base_meta(tmp_path, era, phase):
    # spec §1.6: mid metas never had window_pattern; SFT metas of 2026-01-31..02-01 lost it.
    cfg = default_config(era, n_layer=4, window_pattern="SSSL")
    write_checkpoint(tmp_path, era, phase="base", cfg=cfg, tokenizer=None)
    overrides = {"model_config": {"window_pattern": REMOVE}}
    ckpt = write_checkpoint(tmp_path, era, phase=phase, cfg=cfg, meta_overrides=overrides, tokenizer=None)
    sd, meta = read_checkpoint(ckpt)
    assert "window_pattern" not in meta["model_config"]
    loaded = load_model(ckpt, device="cpu")
    assert loaded.config.era == era
    assert loaded.config.window_pattern == "SSSL"
    assert any("window_pattern" in w for w in loaded.warnings), loaded.warnings
    with_pattern = {**meta["model_config"], "window_pattern": "SSSL"}
    assert loaded.config.window_sizes() == layer_windows(era, with_pattern)
    ids = fixed_ids(cfg.sequence_len + 20, cfg.vocab_size)  # past "S" (32) and "L" (64)
    expected = reference_logits(sd, with_pattern, era, ids)
    torch.testing.assert_close(model_logits(loaded.model, ids), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("era", "phase"),  # no E7 mid: mid_train.py was deleted before E7
    [("E2", "mid"), ("E2", "chatsft"), ("E3", "mid"), ("E3", "chatsft"), ("E7", "chatsft")],
)
def test_missing_window_pattern_without_a_base_meta_warns(tmp_path, era, phase):
    # spec §1.6 mitigation: "take window_pattern from base_checkpoints/<same tag> if it exists,
    # otherwise warn"; the checkpoint then runs every layer as "L". Any checkpoint with lambdas
    # (E1 onwards, 2026-01-11) may have lost it: E1 and E2 keys are identical, and E1 was on master
    # for three hours before windows arrived, so an E2 mid checkpoint reads as E1 here.
    overrides = {"model_config": {"window_pattern": REMOVE}}
    ckpt = write_checkpoint(tmp_path, era, phase=phase, meta_overrides=overrides, tokenizer=None)
    loaded = load_model(ckpt, device="cpu")
    assert loaded.config.window_pattern == "L"
    assert any("window_pattern" in w for w in loaded.warnings), loaded.warnings


def test_pre_lambda_checkpoints_lose_no_window_pattern(tmp_path):
    # E0 predates windows entirely: a meta without window_pattern is simply how it was trained.
    ckpt = write_checkpoint(tmp_path, "E0", phase="mid", tokenizer=None)
    assert load_model(ckpt, device="cpu").warnings == []


def test_xla_flash_attention_runs_every_layer_as_long(tmp_path):
    # spec §2.2: TPU runs with --xla_flash_attn ignored the windows; meta.user_config says so.
    ckpt = write_checkpoint(tmp_path, "fork", meta_overrides={"user_config": {"xla_flash_attn": True}})
    _, meta = read_checkpoint(ckpt)
    assert meta["user_config"]["xla_flash_attn"] is True
    loaded = load_model(ckpt, device="cpu")
    assert any("XLA" in w for w in loaded.warnings), loaded.warnings
    long_only = {**meta["model_config"], "window_pattern": "L"}
    assert loaded.config.window_sizes() == layer_windows("fork", long_only)


# ---------------------------------------------------------------------------------------------------
# (b) logits against the reference forward


@pytest.mark.parametrize("era", ERAS)
def test_logits_match_the_reference(era_dirs, era):
    softcap = 20.0 if era == "E5" else None  # the reference's E5 is softcap 20
    loaded = load_model(era_dirs[era], device="cpu", softcap=softcap)
    sd, meta = read_checkpoint(era_dirs[era])
    mc = meta["model_config"]
    windows = [w for w in layer_windows(era, mc) if w is not None]
    # Longer than every window and than sequence_len, so "S", "L" and beyond-"L" masking all matter.
    n = max([mc["sequence_len"], *windows]) + 24
    ids = fixed_ids(n, mc["vocab_size"])
    expected = reference_logits(sd, mc, era, ids)
    got = model_logits(loaded.model, ids)
    assert got.shape == (n, mc["vocab_size"])
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("era", ["E2", "E7", "fork_engram_mhc"])
def test_last_only_gives_the_last_row(era_dirs, era):
    model = load_model(era_dirs[era], device="cpu").model
    ids = torch.tensor([fixed_ids(50, 300)])
    with torch.inference_mode():
        full, last = model(ids), model(ids, last_only=True)
    assert last.shape == (1, 1, 300)
    torch.testing.assert_close(last[0, 0], full[0, -1], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------
# memory


def _resident_bytes(path) -> int:
    """Resident bytes of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = len(fields) == 6 and fields[5] == str(path.resolve())
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


def test_packed_precisions_load_within_the_checkpoint_budget(tmp_path):
    """fp16/int8 packing reads every fp32 matrix; none of the file stays mapped (the weights are
    read into private memory, so the file may change under a loaded model)."""
    cfg = default_config("E7", n_embd=256, vocab_size=4096)
    path = checkpoint_model_file(write_checkpoint(tmp_path, "E7", cfg=cfg, tokenizer=None))
    if not pathlib.Path("/proc/self/smaps").exists() or not gemv.fbgemm_available():
        pytest.skip("needs Linux /proc and fbgemm")
    loaded = load_model(path.parent, dtype="fast")
    packed = [
        n for n, m in loaded.model.named_modules() if isinstance(m, torch.nn.Linear) and m.weight is None
    ]
    exact = dict(load_model(path.parent).model.named_modules())
    matrices = sum(exact[name].weight.numel() * 4 for name in packed)
    del exact
    gc.collect()  # the exact model's own mapping of the file goes with it
    assert matrices > 0
    assert _resident_bytes(path) == 0
