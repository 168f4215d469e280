"""Every mismatch of spec §5.4 (and the formats of §5.1) ends in one clear line naming the file.

Nothing is silently patched, nothing hostile runs: pickled code in a model file or a tokenizer never
executes (its marker file must never appear), and an absurd meta is refused before anything is allocated.
"""

from __future__ import annotations

import json
import pickle
import resource
import time
from pathlib import Path

import pytest
import torch
from support import hostile_corpus as hostile
from support.checkpoint_factory import (
    REMOVE,
    UNSUPPORTED_VARIANTS,
    add_key,
    default_config,
    drop_key,
    model_file,
    set_nan,
    truncate_file,
    write_checkpoint,
    write_huge_meta,
    write_pickled_code_model,
    write_with_wrong_vocab,
)
from support.tokenizer_factory import (
    write_cpp_tokenizer_json,
    write_evil_pickle,
    write_tiktoken_pkl,
    write_wrong_class_pickle,
)

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import (
    CheckpointError,
    NanoscopeError,
    OutOfMemoryError,
    TokenizerError,
    UnsupportedFormatError,
)
from desktop.engine.files.finite import check_finite
from desktop.engine.messages import Message
from desktop.engine.nanochat import checkpoint as ckpt_module
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.nanochat.chat_format import render_for_completion
from desktop.engine.nanochat.loader import load_model


def failure(exc_type: type[NanoscopeError], call, *args, **kwargs) -> str:
    """Run ``call``, expect ``exc_type``, and return its message after checking it is one line."""
    with pytest.raises(exc_type) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, message
    assert "Traceback" not in message
    return message


def load(directory: Path, **kwargs):
    return load_model(directory, device="cpu", **kwargs)


def open_session(directory: Path, **kwargs) -> NanochatBackend:
    return NanochatBackend.open(directory, LoadOptions(device="cpu", **kwargs))


# ---------------------------------------------------------------------------------------------------
# model file


def test_truncated_model_file(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer=None)
    path = truncate_file(model_file(ckpt))
    message = failure(CheckpointError, load, ckpt)
    assert str(path) in message and "truncated" in message


def test_empty_model_file(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E2", tokenizer=None)
    model_file(ckpt).write_bytes(b"")
    assert str(model_file(ckpt)) in failure(CheckpointError, load, ckpt)


def test_wrong_vocab_in_meta(tmp_path):
    ckpt = write_with_wrong_vocab(tmp_path, "E7", tokenizer=None)
    message = failure(CheckpointError, load, ckpt)
    assert str(model_file(ckpt)) in message
    assert "vocab_size=364" in message and "transformer.wte.weight" in message


@pytest.mark.parametrize(
    ("era", "key"),
    [
        ("E7", "transformer.h.1.attn.c_k.weight"),
        ("E7", "smear_lambda"),
        ("E2", "x0_lambdas"),
        ("E4", "bigram_lambdas"),
        ("fork_engram", "transformer.h.0.engram.order_mix.1.weight"),
        ("fork_mhc", "transformer.h.1.mhc.score_out.weight"),
    ],
)
def test_missing_key(tmp_path, era, key):
    ckpt = write_checkpoint(tmp_path, era, tokenizer=None)
    path = drop_key(ckpt, key)
    message = failure(CheckpointError, load, ckpt)
    assert str(path) in message and "missing" in message and key in message


@pytest.mark.parametrize(
    ("era", "key"),
    [
        ("E7", "transformer.h.0.attn.extra.weight"),
        ("E2", "value_embeds.7.weight"),
        ("E3", "transformer.h.0.attn.c_q.bias"),
        ("fork", "bigram_lambdas"),
    ],
)
def test_unexpected_key(tmp_path, era, key):
    ckpt = write_checkpoint(tmp_path, era, tokenizer=None)
    path = add_key(ckpt, key)
    message = failure(CheckpointError, load, ckpt)
    assert str(path) in message and key in message


def test_value_embedding_on_the_wrong_layer(tmp_path):
    # E3: VE only on layers with the parity of the last one (n_layer=4: layers 1 and 3), spec §1.4.
    ckpt = write_checkpoint(tmp_path, "E3", tokenizer=None)
    path = add_key(ckpt, "value_embeds.0.weight", torch.zeros(320, 32))
    message = failure(CheckpointError, load, ckpt)
    assert str(path) in message and "value_embeds" in message


@pytest.mark.parametrize(
    ("era", "key", "shape"),
    [
        ("E7", "transformer.h.1.mlp.c_fc.weight", (7, 64)),
        ("E2", "transformer.h.0.attn.c_k.weight", (64, 64)),  # GQA: c_k rows must be Hkv*hd = 32
        (
            "E4",
            "bigram_embed.embed.weight",
            (5 * 320, 64),
        ),  # rows are 5 * unpadded V (spec §1.4)
        ("E7", "smear_gate.weight", (1, 32)),
        ("fork_engram_mhc", "transformer.h.2.mhc.score_proj.weight", (9, 64)),
    ],
)
def test_wrong_shape(tmp_path, era, key, shape):
    ckpt = write_checkpoint(tmp_path, era, tokenizer=None)
    path = add_key(ckpt, key, torch.zeros(shape))
    message = failure(CheckpointError, load, ckpt)
    assert str(path) in message and key in message and "[" + ", ".join(map(str, shape)) + "]" in message


def test_ve_gate_width_other_than_12_or_32(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E3", tokenizer=None)
    for layer in (1, 3):
        add_key(ckpt, f"transformer.h.{layer}.attn.ve_gate.weight", torch.zeros(1, 20))
    message = failure(CheckpointError, load, ckpt)
    assert str(model_file(ckpt)) in message and "20" in message and "ve_gate" in message


def test_lm_head_and_embedding_rows_differ(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E2", tokenizer=None)
    add_key(ckpt, "lm_head.weight", torch.zeros(300, 64))  # wte keeps its padded 320 rows
    message = failure(CheckpointError, load, ckpt)
    assert "lm_head.weight" in message and str(model_file(ckpt)) in message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("key", ["transformer.h.0.mlp.c_proj.weight", "resid_lambdas"])
def test_non_finite_values(tmp_path, key, value):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer=None)
    path = set_nan(ckpt, key, value)
    message = failure(CheckpointError, load, ckpt)
    assert str(path) in message and key in message and "NaN/Inf" in message


def test_huge_finite_values_whose_sum_overflows_still_load(tmp_path):
    """The finite check sums each tensor first; an overflowing sum is not taken for a NaN/Inf."""
    cfg = default_config("E7")
    ckpt = write_checkpoint(tmp_path, "E7", cfg=cfg, tokenizer=None)
    shape = (cfg.n_embd, 4 * cfg.n_embd)  # mlp.c_proj
    add_key(ckpt, "transformer.h.0.mlp.c_proj.weight", torch.full(shape, 3e38))  # its sum overflows
    assert load(ckpt).model.transformer.h[0].mlp.c_proj.weight.isfinite().all()


@pytest.mark.parametrize(
    ("precision", "key"), [("fast", "lm_head.weight"), ("int8", "transformer.h.1.attn.c_q.weight")]
)
def test_non_finite_values_are_refused_before_packing(tmp_path, precision, key):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer=None)
    path = set_nan(ckpt, key)
    message = failure(CheckpointError, load, ckpt, dtype=precision)
    assert str(path) in message and key in message


@pytest.mark.parametrize("variant", UNSUPPORTED_VARIANTS)
def test_branch_only_variants_are_unsupported(tmp_path, variant):
    ckpt = write_checkpoint(tmp_path, variant, tokenizer=None)
    message = failure(UnsupportedFormatError, load, ckpt)
    assert "not supported" in message and str(model_file(ckpt)) in message
    assert ("MoE" if variant == "moe" else "'ve' branch") in message


def test_moe_meta_alone_is_unsupported(tmp_path):
    # spec §5.2: num_experts in the meta identifies the MoE branch even before the keys are looked at
    ckpt = write_checkpoint(
        tmp_path, "E5", meta_overrides={"model_config": {"num_experts": 4}}, tokenizer=None
    )
    assert "MoE" in failure(UnsupportedFormatError, load, ckpt)


def test_fork_mamba_is_unsupported(tmp_path):
    ckpt = write_checkpoint(
        tmp_path, "fork", meta_overrides={"model_config": {"mamba_enabled": True}}, tokenizer=None
    )
    message = failure(UnsupportedFormatError, load, ckpt)
    assert "Mamba" in message and "not supported" in message


def test_pickled_code_in_the_model_file_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "base_checkpoints" / "d4"
    path = write_pickled_code_model(ckpt / "model_000010.pt", marker)
    message = failure(CheckpointError, load, ckpt)
    assert str(path) in message and "refused" in message
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# meta json


@pytest.mark.parametrize("field", ["n_embd", "sequence_len", "vocab_size", "n_layer", "n_head"])
def test_huge_meta_is_refused_before_allocating(tmp_path, field):
    ckpt = write_huge_meta(tmp_path, "E7", field_name=field, value=10**9, tokenizer=None)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    started = time.perf_counter()
    message = failure(CheckpointError, load, ckpt)
    assert time.perf_counter() - started < 5.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 256 * 1024
    assert field in message and str(model_file(ckpt)) in message


def _meta_path(ckpt: Path) -> Path:
    return ckpt / "meta_000010.json"


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2, 3]", "\x00\x01binary"])
def test_malformed_meta(tmp_path, text):
    ckpt = write_checkpoint(tmp_path, "E2", tokenizer=None)
    _meta_path(ckpt).write_text(text, encoding="utf-8")
    assert str(_meta_path(ckpt)) in failure(CheckpointError, load, ckpt)


def test_meta_that_is_not_utf8(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E2", tokenizer=None)
    _meta_path(ckpt).write_bytes(b"\xff\xfe{\x00")
    assert str(_meta_path(ckpt)) in failure(CheckpointError, load, ckpt)


def test_missing_meta_file(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E2", tokenizer=None)
    _meta_path(ckpt).unlink()
    message = failure(CheckpointError, load, ckpt)
    assert str(ckpt) in message and "meta_000010.json" in message


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"model_config": REMOVE}, ["model_config"]),
        ({"model_config": "E7"}, ["model_config"]),
        ({"model_config": {"n_head": REMOVE}}, ["missing", "n_head"]),
        ({"model_config": {"sequence_len": REMOVE, "vocab_size": REMOVE}}, ["sequence_len", "vocab_size"]),
        ({"model_config": {"n_layer": -2}}, ["n_layer", "-2"]),
        ({"model_config": {"n_embd": 0}}, ["n_embd", "0"]),
        ({"model_config": {"n_embd": "64"}}, ["n_embd", "'64'"]),
        ({"model_config": {"n_head": 2.0}}, ["n_head"]),
        ({"model_config": {"n_kv_head": True}}, ["n_kv_head"]),
        ({"model_config": {"n_head": 3}}, ["n_embd=64", "n_head=3"]),  # C % H != 0
        ({"model_config": {"n_kv_head": 3}}, ["n_head=2", "n_kv_head=3"]),  # H % Hkv != 0
        ({"model_config": {"window_pattern": "SXL"}}, ["window_pattern", "SXL"]),
        ({"model_config": {"window_pattern": ""}}, ["window_pattern"]),
    ],
)
def test_bad_meta_fields(tmp_path, overrides, words):
    ckpt = write_checkpoint(tmp_path, "E7", meta_overrides=overrides, tokenizer=None)
    message = failure(CheckpointError, load, ckpt)
    assert str(model_file(ckpt)) in message
    for word in words:
        assert word in message


def test_engram_bottleneck_in_the_meta_must_match_the_weights(tmp_path):
    # spec §5.4: "engram or mHC dims inconsistent with the meta". fork_engram_mhc's meta says
    # engram_bottleneck_dim=8; here every engram tensor is consistently sized for 16 instead.
    ckpt = write_checkpoint(tmp_path, "fork_engram_mhc", tokenizer=None)
    add_key(ckpt, "transformer.h.1.engram.in_proj.weight", torch.zeros(16, 64))
    for j in range(2):  # orders "3,2,3,0" -> (3, 2)
        add_key(ckpt, f"transformer.h.1.engram.order_mix.{j}.weight", torch.zeros(16, 16))
    add_key(ckpt, "transformer.h.1.engram.out_proj.weight", torch.zeros(64, 16))
    message = failure(CheckpointError, load, ckpt)
    assert "engram" in message and str(model_file(ckpt)) in message


def test_engram_layers_in_the_meta_must_match_the_weights(tmp_path):
    overrides = {"model_config": {"engram_layers": "1"}}  # the weights are on layers 0 and 2
    ckpt = write_checkpoint(tmp_path, "fork_engram", meta_overrides=overrides, tokenizer=None)
    message = failure(CheckpointError, load, ckpt)
    assert "engram" in message and str(model_file(ckpt)) in message


# ---------------------------------------------------------------------------------------------------
# tokenizer


@pytest.mark.parametrize("disguised", [False, True])
def test_evil_tokenizer_pickle_never_runs(tmp_path, disguised):
    marker = tmp_path / "pwned"
    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer=None)
    evil = write_evil_pickle(tmp_path / "tokenizer" / "tokenizer.pkl", marker, disguised=disguised)
    message = failure(TokenizerError, open_session, ckpt)
    assert str(evil) in message
    assert not marker.exists()


def test_wrong_class_tokenizer_pickle(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer=None)
    path = write_wrong_class_pickle(tmp_path / "tokenizer" / "tokenizer.pkl")
    message = failure(TokenizerError, open_session, ckpt)
    assert str(path) in message and "datetime" in message


@pytest.mark.parametrize("kind", ["pkl", "json"])
def test_tokenizer_vocab_mismatch(tmp_path, kind):
    era = "E7" if kind == "pkl" else "fork"
    ckpt = write_checkpoint(tmp_path, era, tokenizer=None)
    if kind == "pkl":
        path = write_tiktoken_pkl(tmp_path / "tokenizer", vocab_size=400)
    else:
        path = write_cpp_tokenizer_json(tmp_path / "tokenizer", vocab_size=400)
    message = failure(TokenizerError, open_session, ckpt)
    assert str(path) in message and "400" in message and "300" in message


def test_explicit_tokenizer_with_the_wrong_vocab(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer="pkl")  # the right one is in <base>/tokenizer
    other = write_tiktoken_pkl(tmp_path / "elsewhere", vocab_size=512)
    message = failure(TokenizerError, open_session, ckpt, tokenizer=other)
    assert str(other) in message and "512" in message


def test_missing_tokenizer(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer=None)
    message = failure(TokenizerError, open_session, ckpt)
    assert "no tokenizer" in message and str(tmp_path / "tokenizer") in message


def test_explicit_tokenizer_file_that_does_not_exist(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer="pkl")
    missing = tmp_path / "nope" / "tokenizer.pkl"
    assert str(missing) in failure(TokenizerError, open_session, ckpt, tokenizer=missing)


def test_chat_needs_the_chat_tokens(tmp_path):
    # spec §5.4: a chat request with a tokenizer lacking <|user_start|> etc. (the fork's C++ one)
    ckpt = write_checkpoint(tmp_path, "fork", phase="sft", tokenizer="json")
    session = open_session(ckpt)
    assert not session.chat_mode
    message = failure(
        TokenizerError, render_for_completion, session.tok, [Message.of_text("user", "hi")], None
    )
    assert str(session.tok.path) in message and "<|user_start|>" in message


# ---------------------------------------------------------------------------------------------------
# other formats (spec §5.1): recognised, refused with a clear "not supported"


def test_hugging_face_directory(tmp_path):
    hf = tmp_path / "llama"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    (hf / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    message = failure(UnsupportedFormatError, load, hf)
    assert str(hf) in message and "Hugging Face" in message and "not supported" in message


@pytest.mark.parametrize("as_dir", [False, True])
def test_gguf_file(tmp_path, as_dir):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    target = tmp_path if as_dir else gguf
    message = failure(UnsupportedFormatError, load, target)
    assert str(target) in message and "GGUF" in message and "not supported" in message


@pytest.mark.parametrize("layout", [".metadata", "step_100/.metadata", "pp0/.metadata"])
def test_kempnerforge_dcp_directory(tmp_path, layout):
    ckpt = tmp_path / "kf"
    (ckpt / layout).parent.mkdir(parents=True, exist_ok=True)
    (ckpt / layout).write_bytes(b"dcp metadata")
    message = failure(UnsupportedFormatError, load, ckpt)
    assert str(ckpt) in message and "KempnerForge" in message and "not supported" in message


def test_tpu_dist_ckpt_directory(tmp_path):
    ckpt = tmp_path / "sft_checkpoints" / "d3"
    (ckpt / "dist_ckpt_000100").mkdir(parents=True)
    (ckpt / "dist_ckpt_000100" / ".metadata").write_bytes(b"")
    (ckpt / "meta_000100.json").write_text(json.dumps({"step": 100}), encoding="utf-8")
    message = failure(UnsupportedFormatError, load, ckpt)
    assert str(ckpt) in message and "dist_ckpt" in message and "torch.distributed.checkpoint" in message


def test_directory_without_checkpoints(tmp_path):
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    assert str(tmp_path) in failure(CheckpointError, load, tmp_path)


def test_path_that_does_not_exist(tmp_path):
    missing = tmp_path / "gone"
    assert str(missing) in failure(CheckpointError, load, missing)


def test_step_that_does_not_exist(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E2", step=10, tokenizer=None)
    message = failure(CheckpointError, load, ckpt, step=11)
    assert str(ckpt) in message and "11" in message and "10" in message


def test_odd_sizes_still_load(tmp_path):
    # The checks above must not reject legitimate variety: GQA, unpadded E0 vocab, fork windows.
    for era, cfg in (("E0", default_config("E0", vocab_size=512)), ("E2", default_config("E2", n_kv_head=2))):
        assert load(write_checkpoint(tmp_path / era, era, cfg=cfg, tokenizer=None)).config.era == era


# ---------------------------------------------------------------------------------------------------
# the pickle pre-scan: a model file is judged from its opcodes before torch builds anything


def _ckpt(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path, "E7", tokenizer=None)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (hostile.deep_tuples(), "refused to load: the pickle nests containers deeper than 32 levels"),
        (hostile.deep_frozensets(), "refused to load: the pickle opens more than 32 nested MARKs"),
        (hostile.deep_lists(), "refused to load: the pickle nests containers deeper than 32 levels"),
        (hostile.open_marks(), "refused to load: the pickle opens more than 32 nested MARKs"),
        (
            hostile.bytearray_bomb(),
            "refused to load: the file contains pickled code or objects that are not tensors "
            "(builtins.bytearray)",
        ),
        (
            hostile.wrapper_subclass_parameter(),
            "refused to load: it holds a tensor subclass, and weights must be dense float32, bfloat16 "
            "or float16 tensors (torch._utils._rebuild_wrapper_subclass)",
        ),
        (
            hostile.declared_bytearray(),
            "file is truncated or corrupt (the pickle is cut off (expected 6500000000 bytes in a "
            "bytearray8, but only 4 remain))",
        ),
        (
            hostile.declared_string(),
            "file is truncated or corrupt (the pickle is cut off (expected 4600000000 bytes in a "
            "unicodestring8, but only 4 remain))",
        ),
        (
            hostile.missing_memo(),
            "file is truncated or corrupt (the pickle reads memo slot 5, which was never written)",
        ),
        (hostile.empty_stack(), "file is truncated or corrupt (TUPLE1 at byte 2 finds too few items)"),
        (
            hostile.reduce_with_int_args(),
            "file is truncated or corrupt (REDUCE arguments are a plain value, not a tuple)",
        ),
        (
            hostile.extension_code(),
            "refused to load: the file contains pickled code or objects that are not tensors "
            "(extension code 1)",
        ),
        (hostile.text_persistent_id(), "file is truncated or corrupt (text persistent ids are not allowed)"),
        (hostile.top_level_list(), "expected a dict of tensors, found a list"),
        (
            hostile.int_key_dict(hostile.float_tensor()),
            "entry with a key that is not text (3) is not a named tensor",
        ),
        (
            hostile.one_tensor_dict(hostile.float_tensor(numel=4, shape=(4, 4))),
            "file is truncated or corrupt (a tensor of shape [4, 4] reaches element 15 of storage "
            "'0', which holds 4)",
        ),
        (
            hostile.one_tensor_dict(hostile.float_tensor(storage_key="7")),
            "file is truncated or corrupt (storage '7' has no data record in the archive)",
        ),
    ],
)
def test_hostile_data_pkl_is_refused_before_torch_runs(tmp_path, body, reason):
    ckpt = _ckpt(tmp_path)
    path = hostile.replace_model(ckpt, body, records={"0": b"\0" * 16})
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert failure(CheckpointError, load, ckpt) == f"{path}: {reason}"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 256 * 1024


def test_a_storage_claiming_more_bytes_than_its_record_is_refused(tmp_path):
    ckpt = _ckpt(tmp_path)
    path = hostile.replace_model(
        ckpt, hostile.one_tensor_dict(hostile.float_tensor(numel=1 << 40)), records={"0": b"\0" * 16}
    )
    assert failure(CheckpointError, load, ckpt) == (
        f"{path}: file is truncated or corrupt (storage '0' declares {4 << 40} bytes but its record holds 16)"
    )


def test_a_cut_off_data_pkl_is_corrupt(tmp_path):
    ckpt = _ckpt(tmp_path)
    path = hostile.replace_model(ckpt, hostile.cut_mid_opcode(), stop=False)
    message = failure(CheckpointError, load, ckpt)
    assert message.startswith(f"{path}: file is truncated or corrupt (the pickle is cut off")


def test_a_compressed_data_pkl_is_refused(tmp_path):
    ckpt = _ckpt(tmp_path)
    path = hostile.replace_model(ckpt, hostile.declared_string(), compress=True)
    assert failure(CheckpointError, load, ckpt) == (
        f"{path}: file is truncated or corrupt "
        "(member archive/data.pkl is compressed; torch never writes that)"
    )


def test_code_in_data_pkl_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    ckpt = _ckpt(tmp_path)
    path = hostile.replace_model(ckpt, hostile.code_payload(marker))
    assert failure(CheckpointError, load, ckpt) == (
        f"{path}: refused to load: the file contains pickled code or objects that are not tensors (os.system)"
    )
    assert not marker.exists()


@pytest.mark.parametrize("kind", sorted(hostile.SPECIAL_TENSORS))
def test_tensors_that_are_not_dense_weights_are_refused(tmp_path, kind):
    ckpt = _ckpt(tmp_path)
    path = hostile.replace_entry(ckpt, "lm_head.weight", hostile.SPECIAL_TENSORS[kind])
    message = failure(CheckpointError, load, ckpt)
    words = {"sparse csr": "a sparse tensor", "subclass": "a tensor subclass"}.get(kind, f"a {kind}")
    assert message.startswith(f"{path}: refused to load: it holds {words}"), message


@pytest.mark.parametrize("dtype", sorted(hostile.WRONG_DTYPES))
def test_weights_of_other_dtypes_are_refused(tmp_path, dtype):
    ckpt = _ckpt(tmp_path)
    path = hostile.replace_entry(ckpt, "lm_head.weight", hostile.WRONG_DTYPES[dtype])
    assert failure(CheckpointError, load, ckpt) == (
        f"{path}: weights must be float32, bfloat16 or float16; this one is not: 'lm_head.weight' ({dtype})"
    )


def test_the_scan_reads_the_shapes_and_dtypes_torch_builds(tmp_path):
    ckpt = write_checkpoint(tmp_path, "fork_engram_mhc", tokenizer=None, dtype_mix="cuda_mixed")
    shapes = ckpt_module.tensor_shapes(model_file(ckpt))
    sd = ckpt_module.load_state_dict(model_file(ckpt), mmap=False)
    assert {k: (t.dtype, t.shape) for k, t in shapes.items()} == {
        k: (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for k, t in sd.items()
    }


def test_a_file_changed_between_scan_and_load_is_refused(tmp_path):
    ckpt = _ckpt(tmp_path)
    path = model_file(ckpt)
    shapes = ckpt_module.tensor_shapes(path)
    drop_key(ckpt, "smear_lambda")
    assert failure(CheckpointError, ckpt_module.load_state_dict, path, expected=shapes) == (
        f"{path}: changed while it was being read; try again"
    )


@pytest.mark.parametrize(
    "value", [torch.tensor([1 + 1j, complex("nan")]), torch.tensor([1.0, 2.0], device="meta")]
)
def test_the_finite_check_never_raises_a_traceback(tmp_path, value):
    message = failure(CheckpointError, check_finite, {"x": value}, tmp_path / "f")
    assert message.startswith(f"{tmp_path / 'f'}: ")


def test_the_scan_bounds_memo_stack_and_opcodes():
    from desktop.engine.files import pickle_policy, pickle_scan

    tiny = pickle_policy.Policy(callables=frozenset(), max_memo=10, max_stack=10, max_ops=50)
    with pytest.raises(pickle_scan.PickleRefused, match="more than 10 items at once"):
        pickle_scan.scan_bytes(pickle.dumps(tuple(range(20))), tiny)
    remembered = b"".join(hostile.short_unicode(str(i)) + b"q" + bytes([i]) + b"a" for i in range(11))
    with pytest.raises(pickle_scan.PickleRefused, match="remembers more than 10 objects"):
        pickle_scan.scan_bytes(hostile.PROTO + b"]" + remembered + hostile.STOP, tiny)
    appended = b"".join(hostile.binint(i) + b"a" for i in range(30))
    with pytest.raises(pickle_scan.PickleRefused, match="more than 50 opcodes"):
        pickle_scan.scan_bytes(hostile.PROTO + b"]" + appended + hostile.STOP, tiny)


def test_dcp_metadata_written_by_torch_passes_the_scan_and_code_does_not(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp

    from desktop.engine.files import pickle_scan

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore")
        dcp.save(
            {"model": {"w": torch.zeros(2, 2), "b": torch.zeros(2).bfloat16()}, "step": 3},
            checkpoint_id=tmp_path,
        )
    pickle_scan.scan_dcp_metadata(tmp_path / ".metadata")
    evil = hostile.write_pickle(tmp_path / "evil" / ".metadata", hostile.code_payload(tmp_path / "pwned"))
    with pytest.raises(pickle_scan.PickleRefused) as err:
        pickle_scan.scan_dcp_metadata(evil)
    assert (err.value.kind, err.value.name) == ("global", "os.system")
    deep = hostile.write_pickle(tmp_path / "deep" / ".metadata", hostile.deep_tuples())
    with pytest.raises(pickle_scan.PickleRefused, match="deeper than 32 levels"):
        pickle_scan.scan_dcp_metadata(deep)


@pytest.mark.parametrize(
    ("kind", "make"),
    [
        ("a sparse tensor", lambda: torch.zeros(2, 2).to_sparse()),
        ("a meta-device tensor", lambda: torch.zeros(2, 2, device="meta")),
        ("a tensor subclass", lambda: torch.zeros(2, 2).as_subclass(hostile.TensorSubclass)),
    ],
)
def test_what_torch_built_is_checked_again_before_any_math(tmp_path, kind, make):
    """The scan decides first; this second look guards against torch building something else."""
    from desktop.engine.files.pickle_scan import TensorInfo

    expected = {"w": TensorInfo("float32", (2, 2), "0")}
    message = failure(CheckpointError, ckpt_module.check_tensors, {"w": make()}, expected, tmp_path / "m.pt")
    assert message == f"{tmp_path / 'm.pt'}: 'w' is {kind}; weights must be dense CPU tensors"


# ---------------------------------------------------------------------------------------------------
# typed meta fields and memory budgets: every value from the file is checked before it is used


@pytest.mark.parametrize(
    ("era", "field", "value", "problem"),
    [
        ("fork", "window_long", "abc", "must be an integer, got 'abc'"),
        ("fork", "rope_theta", "x", "must be a finite number, got 'x'"),
        ("fork", "rope_theta", [1], "must be a finite number, got [1]"),
        ("fork", "rope_theta", -5.0, "must be positive, got -5.0"),
        ("fork_engram", "engram_layers", "x", "must be comma-separated integers, got 'x'"),
        (
            "fork_engram",
            "engram_layers",
            {"a": 1},
            "must be a list or comma-separated integers, got {'a': 1}",
        ),
        (
            "fork_engram",
            "engram_ngram_orders",
            "2,3,1000000000",
            "=1000000000 is implausibly large (limit 64)",
        ),
        ("fork_engram", "engram_bottleneck_dim", 1.5, "must be an integer, got 1.5"),
        ("fork_mhc", "mhc_epsilon", "x", "must be a finite number, got 'x'"),
        ("fork_mhc", "mhc_sinkhorn_iters", 10**9, "=1000000000 is implausibly large (limit 100)"),
        ("fork_mhc", "mhc_blend_alpha", 7, "=7 is implausibly large (limit 1)"),
        ("fork", "activation", "gelu", "must be one of relu2, swiglu, got 'gelu'"),
        ("fork", "mamba_enabled", "no", "must be true or false, got 'no'"),
        ("E7", "n_layer", 10**40, "=a 41-digit number is implausibly large (limit 1024)"),
    ],
)
def test_meta_fields_are_typed(tmp_path, era, field, value, problem):
    ckpt = write_checkpoint(tmp_path, era, meta_overrides={"model_config": {field: value}}, tokenizer=None)
    message = failure(CheckpointError, load, ckpt)
    separator = "" if problem.startswith("=") else " "
    assert message == f"{model_file(ckpt)}: model_config.{field}{separator}{problem}"


def test_engram_layers_outside_the_model_are_refused(tmp_path):
    overrides = {"model_config": {"engram_layers": [0, 99]}}
    ckpt = write_checkpoint(tmp_path, "fork_engram", meta_overrides=overrides, tokenizer=None)
    assert failure(CheckpointError, load, ckpt) == (
        f"{model_file(ckpt)}: model_config.engram_layers [0, 99] names layers outside 0..2"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (hostile.deep_json(), "not valid JSON (nested deeper than 64 levels)"),
        (
            '{"model_config": {"sequence_len": ' + "7" * 5000 + "}}",
            "not valid JSON (a number has more than 4300 digits)",
        ),
        ('{"model_config": {"rope_theta": NaN}}', "not valid JSON (NaN is not a JSON value)"),
        ('{"model_config": {"rope_theta": 1e999}}', "not valid JSON (number 1e999 is out of range)"),
    ],
)
def test_meta_json_that_python_would_choke_on(tmp_path, text, problem):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer=None)
    _meta_path(ckpt).write_text(text, encoding="utf-8")
    assert failure(CheckpointError, load, ckpt) == f"{_meta_path(ckpt)}: {problem}"


def test_tables_the_meta_asks_for_must_fit_in_free_memory(tmp_path, monkeypatch):
    """sequence_len passes its own check, but 10 x 2**20 rotary rows would not fit in 2 GB."""
    from desktop.engine.kernels import memory

    monkeypatch.setattr(memory, "available_ram", lambda: 2 << 30)
    overrides = {"model_config": {"sequence_len": 1 << 20}}
    ckpt = write_checkpoint(tmp_path, "E7", meta_overrides=overrides, tokenizer=None)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    message = failure(OutOfMemoryError, load, ckpt)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 256 * 1024
    assert message.startswith(f"{model_file(ckpt)}: loading needs about ")
    assert message.endswith("; close other programs or use a smaller checkpoint")
    from desktop.engine.nanochat.classify import classify
    from desktop.engine.nanochat.config import table_bytes

    meta = ckpt_module.read_meta(_meta_path(ckpt))
    shapes = {k: t.shape for k, t in ckpt_module.tensor_shapes(model_file(ckpt)).items()}
    tables = table_bytes(classify(meta, shapes, "x"), 4)
    assert tables["rotary tables"] > 2 << 30
    expected = ", ".join(f"{what} {memory.human(n)}" for what, n in tables.items())
    assert f"{expected}) and 2.0 GB is free" in message


def test_a_model_that_fits_loads_with_the_budget_on(tmp_path, monkeypatch):
    from desktop.engine.kernels import memory

    monkeypatch.setattr(memory, "available_ram", lambda: 2 << 30)
    assert load(write_checkpoint(tmp_path, "fork_engram_mhc", tokenizer=None)).config.mhc


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -3.0])
def test_a_softcap_override_must_be_a_positive_number(tmp_path, value):
    ckpt = write_checkpoint(tmp_path, "E3", tokenizer=None)
    assert failure(CheckpointError, load, ckpt, softcap=value) == (
        f"the softcap override must be a positive number, got {value!r}"
    )
