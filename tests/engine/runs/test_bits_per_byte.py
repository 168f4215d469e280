"""Bits per byte at each step, as nanochat defines it: nats over the text's tokens, over ln 2,
over the bytes they stand for; every token a target once, in windows of the model's context."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support import REPO

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import LIMITS, FileRefused
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.runs import bits_per_byte as bpb
from desktop.engine.runs.timeline import timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
TEXT = (REPO / "README.md").read_text(encoding="utf-8")


def test_one_window_equals_the_model_s_own_logits():
    text = TEXT[:600]
    backend = NanochatBackend.open(DEMO, LoadOptions(device="cpu"))
    try:
        ids = backend.tok.encode(text)
        full = [backend.tok.special_id("<|bos|>"), *ids]
        with torch.inference_mode():
            logprobs = torch.log_softmax(backend.loaded.model(torch.tensor([full]))[0, :-1].float(), -1)
        nats = -logprobs.gather(1, torch.tensor(ids).unsqueeze(1)).sum().item()
        want = nats / math.log(2) / len(text.encode("utf-8"))
        measured = bpb.measure(backend, text)
        assert measured is not None
        got, tokens, n_bytes, cut = measured
    finally:
        backend.close()
    assert (tokens, n_bytes, cut) == (len(ids), len(text.encode("utf-8")), False)
    assert got == pytest.approx(want, rel=1e-5)


def test_a_long_text_is_scored_in_windows_each_token_once():
    text = TEXT[:12_000]  # several of the demo's 1,024-token windows
    backend = NanochatBackend.open(DEMO, LoadOptions(device="cpu"))
    try:
        ids = backend.tok.encode(text)
        assert len(ids) > 2 * backend.info().context_length
        measured = bpb.measure(backend, text)
        assert measured is not None
        _, tokens, n_bytes, cut = measured
    finally:
        backend.close()
    assert (tokens, cut) == (len(ids), False)
    assert abs(n_bytes - len(text.encode("utf-8"))) <= 8  # a character cut between two windows


def test_a_sweep_gives_each_step_and_stops_at_the_token_cap(monkeypatch):
    monkeypatch.setattr(bpb, "MAX_TOKENS", 300)
    points = timeline_of(DEMO).points
    results = list(bpb.bpb_sweep(points, TEXT[:5000]))
    assert [(r.stage, r.step) for r in results] == [(p.stage, p.step) for p in points]
    assert all(r.tokens == 300 and r.cut and 0 < r.bits_per_byte < 20 for r in results)


def test_only_the_head_of_a_huge_file_is_read(tmp_path):
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(100 << 20)  # sparse: 100 MB of zero bytes
    text, more = bpb.read_text(big)
    assert more and len(text) == LIMITS["eval_text"]


@pytest.mark.parametrize("name", ["empty", "dev_zero", "folder"])
def test_a_text_that_is_not_there_is_one_line(tmp_path, name):
    path = tmp_path / name
    if name == "empty":
        path.write_text("   \n")
    elif name == "dev_zero":
        path.symlink_to(Path("/dev/zero"))
    else:
        path.mkdir()
    with pytest.raises((NanoscopeError, FileRefused)) as err:
        bpb.read_text(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_nanoscope_eval_bpb_prints_each_step(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text(TEXT[:800], encoding="utf-8")
    steps = [p.step for p in timeline_of(DEMO).points]
    argv = [
        "eval",
        str(DEMO),
        "--task",
        "bpb",
        "--data",
        str(data),
        "--steps",
        f"{steps[0]},{steps[-1]}",
        "--json",
    ]
    assert cli.main(argv) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["step"] for r in shown] == [steps[0], steps[-1]]
    assert all(r["bytes"] == len(TEXT[:800].encode("utf-8")) for r in shown)
    assert cli.main(["eval", str(DEMO), "--task", "bpb"]) == 2
    assert "--task bpb needs --data" in capsys.readouterr().err
