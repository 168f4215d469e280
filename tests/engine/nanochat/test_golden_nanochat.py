"""Checkpoints written by nanochat's own code, at every era, reproduce its own Engine's ids.

Each case under tests/golden/nanochat/<era>/ was made by ``python -m tools.golden nanochat``:
that revision's ``GPT``, ``save_checkpoint``, tokenizer and ``Engine.generate`` (golden.json
names the commit of every file it ran). Nothing here imitates the format: the files are theirs.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from support.backend_helpers import stream
from support.golden import (
    CASES,
    MAX_NEW,
    PYTHON_END,
    against_engine,
    assert_files_as_written,
    check,
    manifest,
    reference,
)

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.params import SamplingParams


def sampling(key: str) -> SamplingParams:
    """``"T|top_k|seed"`` as the generator recorded it."""
    t, k, s = key.split("|")
    return SamplingParams(
        temperature=float(t), top_k=0 if k == "None" else int(k), seed=int(s), max_tokens=MAX_NEW
    )


def test_every_era_has_a_golden_case():
    assert {c.name for c in CASES} >= {"E0", "E0pad", "E1", "E2", "E3", "E4", "E5", "E6", "E7"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_files_are_the_ones_the_generator_wrote(case):
    assert_files_as_written(case)


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def opened(request) -> tuple[dict, NanochatBackend]:
    case: Path = request.param
    m = manifest(case)
    directory = case / "chatsft_checkpoints" / m["tag"]
    backend = NanochatBackend.open(
        directory, LoadOptions(step=m["step"], device="cpu", dtype="float32", base_dir=case)
    )
    yield m, backend
    backend.close()


def test_greedy_ids_and_calculator_calls_equal_nanochats_own(opened):
    m, backend = opened
    python_end = backend.tok.special_id("<|python_end|>")
    for c in m["cases"]:
        events = [ev for ev in stream(backend, c["prompt_ids"], sampling("0.0|None|42")) if not ev.continues]
        check(m, [ev.id for ev in events], reference(m, c)[0], python_end, c["text"])
        if against_engine(m):
            assert [int(ev.forced) for ev in events] == c["engine_greedy_forced"], c["text"]


def test_seeded_samples_equal_nanochats_own(opened):
    m, backend = opened
    python_end = backend.tok.special_id("<|python_end|>")
    for c in m["cases"]:
        for key, want in reference(m, c)[1].items():
            if not against_engine(m) and key.split("|")[1] != "None":
                continue  # GPT.generate's top-k draws from the whole masked vocabulary, the Engine's
                # (and Nanoscope's) from the k survivors: the same seed picks differently
            got = [ev.id for ev in stream(backend, c["prompt_ids"], sampling(key)) if not ev.continues]
            check(m, got, want, python_end, f"{c['text']} {key}")


def test_the_calculator_is_called_wherever_the_engine_is_the_reference(opened):
    m, _ = opened
    if against_engine(m):
        assert any(any(c["engine_greedy_forced"]) for c in m["cases"])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_nanoscope_generate_reproduces_the_greedy_ids(case, capsys, monkeypatch):
    m = manifest(case)
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(case))
    c = m["cases"][0]
    argv = [
        "generate",
        f"sft/{m['tag']}/{m['step']}",
        "--tokens",
        ",".join(map(str, c["prompt_ids"])),
        "--temperature",
        "0",
        "--max-tokens",
        str(MAX_NEW),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--json",
        *(f"--{k}={v}" for k, v in m["load_options"].items()),
    ]
    assert cli.main(argv) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    check(m, done["ids"], reference(m, c)[0], PYTHON_END, "nanoscope generate")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_base_checkpoint_loads_too(case):
    m = manifest(case)
    backend = NanochatBackend.open(
        case / "base_checkpoints" / m["tag"], LoadOptions(device="cpu", dtype="float32", base_dir=case)
    )
    try:
        assert backend.info().step == m["base_step"]
        ids = [ev.id for ev in stream(backend, m["cases"][1]["prompt_ids"][:4], sampling("0.0|None|1"))]
        assert ids  # a base model completes text; its ids are not recorded, only that it runs
    finally:
        backend.close()


def test_a_stop_mid_reply_keeps_the_stream_consistent(opened):
    """Stop after three tokens: the next reply from the same prompt is the Engine's again."""
    m, backend = opened
    c = m["cases"][0]
    cancel = threading.Event()
    for i, _ in enumerate(stream(backend, c["prompt_ids"], sampling("0.0|None|42"), cancel=cancel)):
        if i == 2:
            cancel.set()
    events = [ev for ev in stream(backend, c["prompt_ids"], sampling("0.0|None|42")) if not ev.continues]
    check(m, [ev.id for ev in events], reference(m, c)[0], backend.tok.special_id("<|python_end|>"), "again")
