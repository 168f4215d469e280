"""A folder full of hostile files next to a good checkpoint: the scan lists what it can, quickly
and without running out of memory, and each hostile model refuses in one line naming its file.

Never the catch-all: ``nanoscope: error: unexpected ...`` means a failure nobody explained.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import pytest
from support.checkpoint_factory import write_checkpoint
from support.hostile_folders import HOSTILE

from desktop.cli import main as cli


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
