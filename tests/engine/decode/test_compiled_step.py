"""Plain replies' one-row steps compiled in fast and int8 mode (engine/decode/compiled_step.py):
never in exact mode, which owes nanochat's bits; a reply says whether its steps ran compiled or
why not; the compiled steps give the eager steps' greedy ids; the decision (compiled faster, or
slower) is kept for the next session; without a compiler the steps stay eager and say so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.backend_helpers import reply_ids

from desktop.config.paths import DEMO_DIR, resource_path
from desktop.engine.backend import GenerationStats, LoadOptions
from desktop.engine.decode.compiled_draft import why_not_compiled
from desktop.engine.decode.compiled_step import COMPILED, COMPILING, SLOWER
from desktop.engine.decode.generation import stream_reply
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend
from desktop.qt.chat.message_footer import format_stats

DEMO = resource_path(DEMO_DIR)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
COMPILE_WAIT_S = 900  # a cold compile on two busy cores takes minutes


def open_demo(home: Path, dtype: str) -> NanochatBackend:
    options = LoadOptions(device="cpu", dtype=dtype, kernel_cache=home / "kernels.json", compile_drafts=True)
    backend = open_backend(DEMO, options)
    assert isinstance(backend, NanochatBackend)
    return backend


def reply(backend: NanochatBackend) -> tuple[list[int], GenerationStats]:
    stats = GenerationStats()
    ids = backend.encode("The capital of France is")
    return reply_ids(backend, ids, GREEDY, stats=stats), stats


def compiled_steps_of(model, backend: NanochatBackend) -> int:
    """How many passes of a greedy reply through ``model`` ran compiled code (run-only mode
    falls back to the eager forward, silently, whenever a guard fails)."""
    prompt = backend.encode("The capital of France is")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        list(stream_reply(model, backend.tok, prompt, GREEDY))
    return sum(e.count for e in prof.key_averages() if e.key.startswith("Torch-Compiled Region"))


def test_exact_mode_never_compiles_its_steps(tmp_path):
    backend = open_demo(tmp_path, "float32")
    try:
        assert backend._step.twin is None
        _, stats = reply(backend)
        assert not stats.step_compiled and stats.step_eager == ""
    finally:
        backend.close()


def test_without_a_compiler_steps_stay_eager_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    backend = open_demo(tmp_path, "int8")
    try:
        _, stats = reply(backend)
        assert not stats.step_compiled
        assert stats.step_eager == "eager steps (no compiler toolchain)"
        text, _ = format_stats({"stats": {**stats.__dict__}})
        assert "eager steps (no compiler toolchain)" in text
    finally:
        backend.close()


@pytest.mark.slow
@pytest.mark.skipif(why_not_compiled() is not None, reason=f"{why_not_compiled()}")
def test_int8_steps_compile_and_the_next_session_keeps_the_decision(tmp_path):
    backend = open_demo(tmp_path, "int8")
    try:
        eager_ids, stats = reply(backend)
        assert stats.step_eager == COMPILING and not stats.step_compiled
        twin = backend._step.twin
        assert twin is not None and twin.done.wait(COMPILE_WAIT_S), "the compile did not end"
        assert twin.error is None, twin.error
        assert compiled_steps_of(twin.switched(backend.model), backend) >= GREEDY.max_tokens - 1
        ids, stats = reply(backend)  # the reply's start adopts it, if faster here
        kept = backend._step.decisions.recall(COMPILED)
        assert kept["compiled"] in (0.0, 1.0)
        if kept["compiled"] == 1.0:
            assert stats.step_compiled and stats.step_eager == ""
            assert ids == eager_ids  # the same function, within float rounding
            assert "compiled steps" in format_stats({"stats": {**stats.__dict__}})[0]
        else:
            assert not stats.step_compiled and stats.step_eager == SLOWER
    finally:
        backend.close()
    again = open_demo(tmp_path, "int8")
    try:
        if kept["compiled"] == 1.0:
            assert again._step.twin is not None  # compiled again (inductor's cache: faster)
        else:
            assert again._step.twin is None  # found slower here: never compiled again
            _, stats = reply(again)
            assert stats.step_eager == SLOWER
    finally:
        again.close()
