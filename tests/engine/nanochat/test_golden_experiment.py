"""An experiment of nanochat's experiment_refactor branch (PR #800), written by that branch's own
code (``python -m tools.golden experiment``): discovery lists its stages with the per-experiment
tokenizer, and its SFT checkpoint reproduces the branch's own Engine ids through the backend,
``nanoscope generate --json`` and ``nanoscope list``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.backend_helpers import stream
from support.golden import EXPERIMENT_CASES, MAX_NEW, assert_files_as_written, manifest

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.discovery import discover, resolve_spec
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.params import SamplingParams

IDS = [c.name for c in EXPERIMENT_CASES]


def sampling(key: str) -> SamplingParams:
    t, k, s = key.split("|")
    return SamplingParams(
        temperature=float(t), top_k=0 if k == "None" else int(k), seed=int(s), max_tokens=MAX_NEW
    )


def stage_dir(case: Path, m: dict, stage: str) -> Path:
    return case / "experiments" / m["experiment"] / m["tag"] / stage


def test_there_is_an_experiment_case():
    assert EXPERIMENT_CASES


@pytest.mark.parametrize("case", EXPERIMENT_CASES, ids=IDS)
def test_the_files_are_the_ones_the_generator_wrote(case):
    assert_files_as_written(case)


@pytest.mark.parametrize("case", EXPERIMENT_CASES, ids=IDS)
def test_discovery_lists_every_stage_with_its_steps(case):
    m = manifest(case)
    tag = f"{m['experiment']}/{m['tag']}"
    found = {(e.source, e.tag): e for e in discover(case)}
    assert found[("base", tag)].steps == m["base_steps"]
    assert found[("sft", tag)].steps == [m["step"]]
    assert found[("sft", tag)].path == stage_dir(case, m, "sft")
    assert resolve_spec(f"sft/{tag}/{m['step']}", case) == (stage_dir(case, m, "sft"), m["step"])


@pytest.fixture(scope="module", params=EXPERIMENT_CASES, ids=IDS)
def opened(request):
    case: Path = request.param
    m = manifest(case)
    backend = NanochatBackend.open(
        stage_dir(case, m, "sft"), LoadOptions(step=m["step"], device="cpu", dtype="float32")
    )
    yield case, m, backend
    backend.close()


def test_the_experiments_own_tokenizer_is_used(opened):
    case, m, backend = opened
    assert Path(backend.tok.path).parent == case / "experiments" / m["experiment"] / "tokenizer"
    assert backend.info().name == f"sft/{m['experiment']}/{m['tag']} · step {m['step']}"


def test_greedy_ids_and_calculator_calls_equal_the_branchs_engine(opened):
    _case, m, backend = opened
    for c in m["cases"]:
        events = [ev for ev in stream(backend, c["prompt_ids"], sampling("0.0|None|42")) if not ev.continues]
        assert [ev.id for ev in events] == c["engine_greedy"], c["text"]
        assert [int(ev.forced) for ev in events] == c["engine_greedy_forced"], c["text"]
    assert any(any(c["engine_greedy_forced"]) for c in m["cases"])


def test_seeded_samples_equal_the_branchs_engine(opened):
    _case, m, backend = opened
    for c in m["cases"]:
        for key, want in c["engine_sampled"].items():
            got = [ev.id for ev in stream(backend, c["prompt_ids"], sampling(key)) if not ev.continues]
            assert got == want, f"{c['text']} {key}"


@pytest.mark.parametrize("case", EXPERIMENT_CASES, ids=IDS)
def test_nanoscope_generate_and_list_read_the_experiment(case, capsys, monkeypatch):
    m = manifest(case)
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(case))
    c = m["cases"][0]
    spec = f"sft/{m['experiment']}/{m['tag']}/{m['step']}"
    argv = ["generate", spec, "--tokens", ",".join(map(str, c["prompt_ids"])), "--temperature", "0"]
    argv += ["--max-tokens", str(MAX_NEW), "--device", "cpu", "--dtype", "float32", "--json"]
    assert cli.main(argv) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert done["ids"] == c["engine_greedy"]
    assert cli.main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["checkpoints"]
    sft = next(e for e in listed if e["source"] == "sft")
    assert (sft["tag"], sft["steps"], sft["latest"]["error"]) == (
        f"{m['experiment']}/{m['tag']}",
        [m["step"]],
        "",
    )


@pytest.mark.parametrize("case", EXPERIMENT_CASES, ids=IDS)
def test_a_base_step_opens_as_a_text_completer(case):
    m = manifest(case)
    backend = NanochatBackend.open(
        stage_dir(case, m, "base"), LoadOptions(step=m["base_steps"][0], device="cpu", dtype="float32")
    )
    try:
        assert (backend.info().step, backend.chat_mode) == (m["base_steps"][0], False)
    finally:
        backend.close()
