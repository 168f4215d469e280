"""A KempnerForge run trained and saved by KempnerForge's own code reproduces its own ids.

tests/golden/kempnerforge/<case>/ was made by ``python -m tools.golden kempnerforge``: its config
loader, model, training pieces and ``CheckpointManager`` (one gloo rank on the CPU) wrote
``run/step_<N>/`` and ``run/latest``; its ``scripts/generate.py`` loader and ``generate()``
produced the ids in golden.json (which names the commit of every file it ran). The weights are
bf16, as KempnerForge trains by default; both sides run them in float32.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.backend_helpers import reply_ids
from support.golden import GOLDEN, assert_files_as_written, manifest

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.kempnerforge.backend import KempnerForgeBackend
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

CASES = sorted(p.parent for p in (GOLDEN / "kempnerforge").glob("*/golden.json"))


def sampling(key: str, max_tokens: int) -> SamplingParams:
    """``"T|top_k|top_p|seed"`` as the generator recorded it (KempnerForge's sample() knobs)."""
    t, k, p, s = key.split("|")
    return SamplingParams(
        temperature=float(t), top_k=int(k), top_p=float(p), seed=int(s), max_tokens=max_tokens
    )


def open_cpu(target: Path, step: int | None = None) -> KempnerForgeBackend:
    backend = open_backend(target, LoadOptions(step=step, device="cpu", dtype="float32"))
    assert isinstance(backend, KempnerForgeBackend)
    return backend


def test_there_is_a_golden_run():
    assert CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_files_are_the_ones_the_generator_wrote(case):
    assert_files_as_written(case)


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def run(request) -> tuple[Path, dict]:
    return request.param, manifest(request.param)


def check_step(backend: KempnerForgeBackend, m: dict, step: int) -> None:
    assert backend.info().step == step
    for c in m["expected"][str(step)]:
        prompt = backend.render(c["text"], None)
        assert list(prompt.ids) == c["prompt_ids"], c["text"]  # AutoTokenizer.encode's ids
        greedy = SamplingParams(temperature=0.0, max_tokens=m["max_new_tokens"])
        assert reply_ids(backend, prompt, greedy) == c["greedy"], c["text"]
        for key, want in c["sampled"].items():
            assert reply_ids(backend, prompt, sampling(key, m["max_new_tokens"])) == want, (
                f"{c['text']} {key}"
            )


def test_the_run_opens_at_latest_and_reproduces_generate(run):
    case, m = run
    backend = open_cpu(case / "run")
    try:
        check_step(backend, m, m["latest"])
    finally:
        backend.close()


def test_every_step_directory_reproduces_its_own_ids(run):
    case, m = run
    for step in m["steps"]:
        backend = open_cpu(case / "run" / f"step_{step}")
        try:
            check_step(backend, m, step)
        finally:
            backend.close()


def test_an_earlier_step_opens_by_number(run):
    case, m = run
    backend = open_cpu(case / "run", step=m["steps"][0])
    try:
        assert backend.info().step == m["steps"][0]
        c = m["expected"][str(m["steps"][0])][0]
        assert (
            reply_ids(backend, c["prompt_ids"], SamplingParams(temperature=0.0, max_tokens=8))
            == c["greedy"][:8]
        )
    finally:
        backend.close()


def test_nanoscope_generate_reproduces_the_greedy_ids(run, capsys):
    case, m = run
    c = m["expected"][str(m["latest"])][0]
    argv = [
        "generate",
        str(case / "run"),
        "--prompt",
        c["text"],
        "--temperature",
        "0",
        "--max-tokens",
        str(m["max_new_tokens"]),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--json",
    ]
    assert cli.main(argv) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert done["prompt_ids"] == c["prompt_ids"]
    assert done["ids"] == c["greedy"]
