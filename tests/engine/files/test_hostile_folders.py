"""A folder full of hostile files next to a good checkpoint: the scan lists what it can, quickly
and without running out of memory, and each hostile model refuses in one line naming its file.

Never the catch-all: ``nanoscope: error: unexpected ...`` means a failure nobody explained.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest
from support.checkpoint_factory import write_checkpoint
from support.hf_factory import write_hf_model
from support.kf_reference import RefConfig, write_run

from desktop.cli import main as cli


def _kf_with_a_trillion_stages(base: Path) -> Path:
    run, _ = write_run(base / "kf", RefConfig(), steps=(10,))
    (run / "step_20" / "pp1000000000000").mkdir(parents=True)  # one stage named 10^12
    return run / "step_20"


def _kf_dotted_toml(base: Path) -> Path:
    run, _ = write_run(base / "kf2", RefConfig(), steps=(10,))
    (run.parent / "train.toml").write_text("a" + ".a" * 30_000 + " = 1\n")
    return run


def _hf_fifo_weights(base: Path) -> Path:
    folder = write_hf_model(base / "hf-fifo", "llama")
    weights = next(folder.glob("*.safetensors"))
    weights.unlink()
    os.mkfifo(weights)  # reading it would block for ever
    return folder


def _hf_tokenizer_dev_zero(base: Path) -> Path:
    folder = write_hf_model(base / "hf-zero", "llama")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("/dev/zero")
    return folder


def _hf_zero_rope(base: Path) -> Path:
    folder = write_hf_model(base / "hf-rope", "llama")
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = 0
    if isinstance(config.get("rope_parameters"), dict):  # transformers 5 keeps it here
        config["rope_parameters"]["rope_theta"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _nanochat_fifo_model(base: Path) -> Path:
    tag = base / "base_checkpoints" / "fifo"
    tag.mkdir(parents=True)
    os.mkfifo(tag / "model_000001.pt")
    (tag / "meta_000001.json").write_text("{}")
    return tag


def _nanochat_quadratic_meta(base: Path) -> Path:
    ckpt = write_checkpoint(base, "E7", phase="base", tag="quotes", step=1, tokenizer=None)
    (ckpt / "meta_000001.json").write_text('"' + '\\"' * 100_000)
    return ckpt


HOSTILE = {
    "kf-trillion-stages": (_kf_with_a_trillion_stages, "pipeline stages pp0 are missing"),
    "kf-dotted-toml": (_kf_dotted_toml, "a dotted key of 32 parts or more"),
    "hf-fifo-weights": (_hf_fifo_weights, "not a regular file (a named pipe)"),
    "hf-tokenizer-dev-zero": (_hf_tokenizer_dev_zero, "not a regular file (a device)"),
    "hf-rope-theta-0": (_hf_zero_rope, "rope_theta must be a finite positive number"),
    "nanochat-fifo-model": (_nanochat_fifo_model, "no model file for step 1"),
    "nanochat-quadratic-meta": (_nanochat_quadratic_meta, "a string is never closed"),
}


@pytest.fixture(scope="module")
def hostile_base(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    base = tmp_path_factory.mktemp("hostile")
    write_checkpoint(base, "E7", phase="chatsft", tag="good", step=5, tokenizer="pkl")
    return base, {name: make(base) for name, (make, _) in HOSTILE.items()}


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_scan_lists_the_good_checkpoint_beside_every_hostile_one(hostile_base, capsys, monkeypatch):
    base, _ = hostile_base
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(base))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    code, out, err = _run(["list", "--json"], capsys)
    assert code == 0 and "unexpected" not in err and "Traceback" not in err
    listed = {Path(c["path"]).name for c in json.loads(out)["checkpoints"]}
    assert "good" in listed
    assert time.monotonic() - started < 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20  # KB: under 1 GB


@pytest.mark.parametrize("name", HOSTILE)
def test_each_hostile_model_refuses_in_one_line_naming_the_problem(hostile_base, capsys, monkeypatch, name):
    base, made = hostile_base
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(base))
    started = time.monotonic()
    code, _, err = _run(["generate", str(made[name]), "--prompt", "hi", "--max-tokens", "2"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("nanoscope: error: "), err
    assert "unexpected" not in err and "Traceback" not in err
    assert HOSTILE[name][1] in err
    assert time.monotonic() - started < 30
