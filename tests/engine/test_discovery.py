"""Finding checkpoints under a nanochat base dir, summarising them without building a model, and
resolving ``SOURCE[/TAG[/STEP]]`` specs (spec §1.1, §2.2)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from support.checkpoint_factory import (
    default_config,
    model_file,
    read_checkpoint,
    truncate_file,
    write_checkpoint,
)

from desktop.engine.discovery import discover, resolve_spec, summarize
from desktop.engine.errors import NanoscopeError
from desktop.engine.nanochat import model as model_module


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """Every upstream and fork phase directory, several tags, unsorted steps and some clutter."""
    root = tmp_path_factory.mktemp("nanochat")
    write_checkpoint(root, "E2", phase="base", tag="d3")
    write_checkpoint(root, "E7", phase="base", tag="d12", step=7)
    write_checkpoint(root, "E2", phase="mid", tag="d3", step=300)
    for step in (100, 5, 20):
        write_checkpoint(root, "E7", phase="chatsft", tag="d12", step=step, seed=step)
    write_checkpoint(root, "E3", phase="chatsft", tag="d4", dtype_mix="cuda_mixed")
    write_checkpoint(root, "E7", phase="chatrl", tag="d12", step=60)
    write_checkpoint(root, "fork_engram", phase="sft", tag="d3", step=8, dtype_mix="bf16_all")
    write_checkpoint(root, "fork", phase="gspo", tag="d3", step=9)
    (root / "base_checkpoints" / "empty").mkdir()  # a tag folder with no model file: not listed
    clutter = root / "chatsft_checkpoints" / "d12"
    (clutter / "model_final.pt").write_bytes(b"x")
    (clutter / "model_000007.pt.tmp").write_bytes(b"x")
    (root / "tokenizer" / "model_000001.pt").write_bytes(b"x")  # not a phase directory
    return root


def test_discover_lists_every_phase_and_tag(base):
    found = {(e.source, e.tag): e for e in discover(base)}
    assert set(found) == {
        ("base", "d3"),
        ("base", "d12"),
        ("mid", "d3"),
        ("sft", "d12"),
        ("sft", "d4"),
        ("rl", "d12"),
        ("sft", "d3"),  # the fork's sft_checkpoints
        ("rl", "d3"),  # the fork's gspo_checkpoints
    }
    assert found[("sft", "d12")].steps == [5, 20, 100]  # numeric order; stray names ignored
    assert found[("sft", "d12")].path == base / "chatsft_checkpoints" / "d12"
    assert found[("rl", "d3")].path == base / "gspo_checkpoints" / "d3"
    assert found[("mid", "d3")].steps == [300]


def test_discover_orders_by_phase(base):
    order = ["base", "mid", "sft", "rl"]
    sources = [e.source for e in discover(base)]
    assert sources == sorted(sources, key=order.index)


def test_discover_adds_extra_folders_once(base, tmp_path):
    extra = write_checkpoint(tmp_path / "elsewhere", "E2", tag="mine", step=3, tokenizer=None)
    already = base / "chatsft_checkpoints" / "d4"
    empty = tmp_path / "nothing"
    empty.mkdir()
    entries = discover(base, extra_dirs=[extra, already, empty])
    folders = [e for e in entries if e.source == "folder"]
    assert [(e.tag, e.path, e.steps) for e in folders] == [("mine", extra, [3])]
    assert sum(e.path == already for e in entries) == 1
    assert entries[-1].source == "folder"


def test_discover_on_a_missing_base_dir(tmp_path):
    assert discover(tmp_path / "missing") == []


@pytest.fixture
def no_model_building(monkeypatch):
    """Summaries read shapes only: building a GPT here would mean weights were loaded."""

    def refuse(*args, **kwargs):
        raise AssertionError("summarize must not build a model")

    monkeypatch.setattr(model_module.GPT, "__init__", refuse)


@pytest.mark.parametrize(
    ("phase", "tag", "step", "era", "dtype"),
    [
        ("chatsft", "d12", 20, "E7", "float32"),
        ("chatsft", "d4", 10, "E3", "float32+bfloat16"),  # fp32 matrices outweigh the bf16 embeddings
        ("sft", "d3", 8, "fork", "bfloat16"),
        ("base", "d3", 10, "E2", "float32"),
    ],
)
def test_summaries(base, no_model_building, phase, tag, step, era, dtype):
    directory = base / f"{phase}_checkpoints" / tag
    summary = summarize(directory, step)
    sd, meta = read_checkpoint(directory, step)
    mc = meta["model_config"]
    assert summary.error == ""
    assert (summary.path, summary.step, summary.era) == (directory, step, era)
    assert summary.params == sum(t.numel() for t in sd.values())
    assert summary.file_bytes == os.path.getsize(model_file(directory, step))
    assert summary.stored_dtype == dtype
    by_dtype: dict[torch.dtype, int] = {}
    for t in sd.values():
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.numel() * t.element_size()
    assert summary.stored_dtype.split("+")[0] == str(max(by_dtype, key=by_dtype.get)).removeprefix("torch.")
    dims = (summary.sequence_len, summary.vocab_size, summary.n_layer, summary.n_embd)
    assert dims == (mc["sequence_len"], mc["vocab_size"], mc["n_layer"], mc["n_embd"])
    as_dict = summary.to_dict()
    assert as_dict["path"] == str(directory) and as_dict["params"] == summary.params


def test_summary_of_each_step(base, no_model_building):
    directory = base / "chatsft_checkpoints" / "d12"
    for step in (5, 20, 100):
        summary = summarize(directory, step)
        assert (summary.step, summary.error) == (step, "")
        assert summary.file_bytes == os.path.getsize(model_file(directory, step))


def test_memory_estimate_covers_weights_and_kv(base, no_model_building):
    summary = summarize(base / "chatsft_checkpoints" / "d12", 20)
    cfg = default_config("E7")
    kv_per_token_fp32 = 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * 4  # k and v, every layer
    assert summary.kv_bytes_per_token == kv_per_token_fp32
    assert summary.memory_estimate(4) == summary.params * 4 + kv_per_token_fp32 * cfg.sequence_len
    assert summary.memory_estimate(2, context=10) == summary.params * 2 + kv_per_token_fp32 // 2 * 10


def test_summary_of_a_broken_checkpoint_reports_instead_of_raising(tmp_path, no_model_building):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer=None)
    path = truncate_file(model_file(ckpt))
    summary = summarize(ckpt, 10)
    assert str(path) in summary.error and "\n" not in summary.error
    assert summary.file_bytes == os.path.getsize(path)
    missing = summarize(ckpt, 99)
    assert missing.error and missing.file_bytes == 0


def test_summary_of_an_unsupported_variant(tmp_path, no_model_building):
    ckpt = write_checkpoint(tmp_path, "moe", tokenizer=None)
    assert "not supported" in summarize(ckpt, 10).error


# ---------------------------------------------------------------------------------------------------
# SOURCE[/TAG[/STEP]]


@pytest.mark.parametrize(
    ("spec", "path", "step"),
    [
        ("sft", "chatsft_checkpoints/d12", None),  # the largest d<N> tag, like find_largest_model
        ("sft/d4", "chatsft_checkpoints/d4", None),
        ("sft/d12/20", "chatsft_checkpoints/d12", 20),
        ("base", "base_checkpoints/d12", None),
        ("mid/d3/300", "mid_checkpoints/d3", 300),
        ("rl/d12", "chatrl_checkpoints/d12", None),
        ("rl/d3", "gspo_checkpoints/d3", None),
    ],
)
def test_resolve_spec(base, spec, path, step):
    assert resolve_spec(spec, base) == (base / path, step)


def test_resolve_spec_accepts_a_directory(base):
    directory = base / "chatrl_checkpoints" / "d12"
    assert resolve_spec(str(directory), base) == (directory, None)


def test_resolve_spec_without_d_tags_takes_the_newest_folder(tmp_path):
    older = write_checkpoint(tmp_path, "E2", phase="chatsft", tag="first", tokenizer=None)
    newer = write_checkpoint(tmp_path, "E2", phase="chatsft", tag="second", tokenizer=None)
    os.utime(older, (1_000_000, 1_000_000))
    os.utime(newer, (2_000_000, 2_000_000))
    assert resolve_spec("sft", tmp_path)[0] == newer


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("sft/d99", ["sft/d99", "no such checkpoint"]),
        ("chat", ["chat", "base|mid|sft|rl"]),
        ("sft/d12/latest", ["step must be a number"]),
    ],
)
def test_resolve_spec_errors(base, spec, words):
    with pytest.raises(NanoscopeError) as info:
        resolve_spec(spec, base)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_resolve_spec_when_the_source_has_no_checkpoints(tmp_path):
    with pytest.raises(NanoscopeError, match=re.escape(str(tmp_path))):
        resolve_spec("mid", tmp_path)
