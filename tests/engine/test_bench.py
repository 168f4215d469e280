"""``nanoscope bench``'s memory figures: peak RSS while a long reply streams, and its budget.

Only the coherence of the figures is checked (what was streamed, what the budget is made of),
never a speed or whether this machine's RSS fits: both depend on the machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.checkpoint_factory import write_checkpoint

from desktop.cli.main import main
from desktop.engine.bench import (
    RSS_OVERHEAD,
    BenchRequest,
    IdsOnlyTokenizer,
    kv_cache_bytes,
    run_bench,
    stream_memory,
)
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.kernels import gemv
from desktop.engine.kernels import tuning as kernel_tuning
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.nanochat.loader import LoadedModel, load_model

MB = 2**20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("bench"), "E7", phase="base", step=10)


@pytest.fixture(scope="module")
def loaded(checkpoint) -> LoadedModel:
    return load_model(checkpoint, None, "cpu", "float32")


def allocated_kv_bytes(loaded: LoadedModel, positions: int, dtype: torch.dtype) -> int:
    """What a KV cache of ``positions`` really allocates (keys, values, token ids, smear history)."""
    cache = KVCache(loaded.config, 1, positions, torch.device("cpu"), dtype)
    parts = [cache.k, cache.v, cache.tokens] + ([cache.embeds] if cache.embeds is not None else [])
    return sum(t.nbytes for t in parts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kv_budget_is_what_the_cache_allocates(loaded, dtype):
    assert kv_cache_bytes(loaded.config, 40, dtype) == allocated_kv_bytes(loaded, 40, dtype)


def stream(loaded: LoadedModel, positions: int) -> dict:
    backend = NanochatBackend(loaded, IdsOnlyTokenizer(loaded.config.vocab_size))
    file_bytes = loaded.model_file.stat().st_size
    return stream_memory(backend, loaded.config, loaded.model.compute_dtype, file_bytes, positions)


def test_stream_fills_the_positions_asked_for(loaded):
    out = stream(loaded, 24)
    assert (out["stream_positions"], out["stream_prompt_tokens"]) == (24, 12)
    kv = allocated_kv_bytes(loaded, 24, torch.float32)
    budget = loaded.model_file.stat().st_size + kv + RSS_OVERHEAD
    assert out["stream_rss_budget_mb"] == round(budget / MB, 1)
    assert out["kv_cache_mb"] == round(kv / MB, 1)
    assert out["stream_within_budget"] == (out["stream_peak_rss_mb"] <= out["stream_rss_budget_mb"])


def test_stream_stops_at_the_models_context(loaded):
    context = loaded.config.sequence_len
    out = stream(loaded, context + 100)
    assert out["stream_positions"] == context
    assert out["kv_cache_mb"] == round(allocated_kv_bytes(loaded, context, torch.float32) / MB, 1)


def test_run_bench_reports_the_stream_beside_the_load(checkpoint):
    req = BenchRequest(
        checkpoint, None, "cpu", "float32", prompt_tokens=4, new_tokens=2, repeats=1, stream_tokens=16
    )
    result = run_bench(req, warn=lambda _text: None)
    assert (result["stream_positions"], result["stream_prompt_tokens"]) == (16, 8)
    assert result["stream_peak_rss_mb"] > 0 and result["stream_peak_scope"] in ("stream", "process")
    # The stream's budget holds the same checkpoint bytes as the load budget, plus the KV cache.
    expected = result["checkpoint_mb"] + result["kv_cache_mb"] + RSS_OVERHEAD / MB
    assert result["stream_rss_budget_mb"] == pytest.approx(expected, abs=0.2)
    assert result["stream_within_budget"] == (result["stream_peak_rss_mb"] <= result["stream_rss_budget_mb"])


@pytest.mark.parametrize("value", ["0", str(2**21)])
def test_stream_tokens_flag_is_checked_before_anything_loads(capsys, tmp_path, value):
    code = main(["bench", str(tmp_path / "nothing-here"), "--stream-tokens", value])
    err = capsys.readouterr().err
    message = f"--stream-tokens must be between 1 and 1048576, got {value}"
    assert (code, err) == (2, f"nanoscope: error: {message}\n")


def test_retime_times_the_kernels_again_where_a_plain_run_uses_the_saved_ones(
    checkpoint, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(gemv, "MIN_SPLIT_BYTES", 1)  # the tiny checkpoint's matrices are timed
    monkeypatch.setattr(kernel_tuning, "BUSY_SHARE", float("inf"))  # saved whatever else runs
    home = tmp_path / "home"
    args = ["--home", str(home), "bench", str(checkpoint), "--device", "cpu", "--dtype", "float32"]
    args += ["--repeats", "1", "--new-tokens", "2", "--prompt-tokens", "4", "--stream-tokens", "8", "--json"]

    def timed(extra: list[str]) -> int:
        assert main(args + extra) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["kernels_timed"]

    assert timed([]) > 0  # a new machine: everything is timed
    assert timed([]) == 0  # then remembered
    assert timed(["--retime"]) > 0
