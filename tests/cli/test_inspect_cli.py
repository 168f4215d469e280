"""``nanoscope inspect`` on a golden checkpoint nanochat's own code wrote, a Hugging Face folder
transformers wrote and a KempnerForge run's step (docs/INSIDE.md)."""

from __future__ import annotations

import json
import math

import pytest
from support.golden import CASES, GOLDEN, manifest

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.inside import Inside, inspect
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.registry import open_backend

CASE = next(c for c in CASES if c.name == "E7")
DIRECTORY = CASE / "chatsft_checkpoints" / manifest(CASE)["tag"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["inspect", str(DIRECTORY), "--device", "cpu", "--dtype", "float32", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_chat_json_is_the_engines_numbers_for_the_reply(capsys):
    code, out, err = run(capsys, "--chat", "What is 2+2?", "--max-tokens", "12", "--position", "-2", "--json")
    assert code == 0, err
    d = json.loads(out)
    ids, start = d["ids"], d["reply_start"]
    assert len(ids) == start + 12 and d["position"] == len(ids) - 2
    assert d["produced"] == ids[-1] and d["token"] == ids[-2]
    assert d["exact"] is True and d["note"] == "" and d["era"] == "E7"
    assert d["labels"][str(d["produced"])]
    backend = NanochatBackend.open(DIRECTORY, LoadOptions(device="cpu", dtype="float32", base_dir=CASE))
    try:
        want = inspect(backend, ids, d["position"])
    finally:
        backend.close()
    assert Inside.from_dict(d) == want
    att = d["attribution"]
    assert abs(math.fsum(t["value"] for t in att["terms"]) + att["residual"] - att["pre_softcap"]) < 1e-4
    assert len(d["lens"]) == 2 and len(d["attention"][0][0]) == d["position"] + 1


def test_tokens_human_table(capsys):
    ids = manifest(CASE)["cases"][0]["prompt_ids"][:9]
    code, out, err = run(capsys, "--tokens", ",".join(map(str, ids)), "--position", "7")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("sft/") and "(E7, float32, exact)" in lines[0]
    assert lines[1].startswith("position 7 of 9 (prompt): token ")
    assert f"(id {ids[8]}, came next)" in lines[1]
    assert lines[2].startswith("read out: the residual stream each block returns")
    assert [line.split()[0] for line in lines if line.startswith("  L") and "| rank" in line] == ["L0", "L1"]
    assert any(
        " is first the top prediction after block " in line or "never the top" in line for line in lines
    )
    assert sum(" head " in line for line in lines) == 2
    names = [
        line.split()[0]
        for line in lines[lines.index(next(x for x in lines if x.startswith("attribution"))) + 1 :]
    ]
    assert names[0] == "embedding" and names[-1] == "residual" and "backout" in names


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--tokens", "1,2,3", "--position", "3"], "--position 3 is past the end: the tokens are at 0..2"),
        (["--tokens", "1,2,3", "--position", "-4"], "--position -4 is past the end"),
        (["--tokens", "", "--position", "0"], "nothing to inspect: the prompt is empty"),
        (["--chat", "  ", "--position", "0"], "nothing to inspect: the prompt is empty"),
        (["--tokens", "1,x", "--position", "0"], "--tokens must be comma-separated integers"),
        (["--tokens", "1,99999", "--position", "0"], "token ids out of range"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code != 0 and out == ""
    assert err.startswith("nanoscope: error: ") and words in err and err.count("\n") == 1


def test_a_served_model_has_no_inside(capsys):
    code = cli.main(["inspect", "remote:gpu-box/d20", "--tokens", "1,2", "--position", "0"])
    out, err = capsys.readouterr()
    assert code != 0 and out == ""
    assert err.startswith("nanoscope: error: remote:gpu-box/d20: a served model has no inside to show")
    assert err.count("\n") == 1


HF_CASE = GOLDEN / "transformers" / "nanochat"
KF_CASE = GOLDEN / "kempnerforge" / "dense-gqa-qknorm"


def test_a_hugging_face_folder_chat_json_is_the_engines_numbers(capsys):
    argv = ["inspect", str(HF_CASE), "--device", "cpu", "--dtype", "float32"]
    code = cli.main([*argv, "--chat", "What is 2+2?", "--max-tokens", "8", "--position", "-2", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    ids = d["ids"]
    assert d["family"] == d["era"] == "hf-nanochat" and d["exact"] is True
    assert d["position"] == len(ids) - 2 and d["produced"] == ids[-1]
    backend = open_backend(HF_CASE, LoadOptions(device="cpu", dtype="float32"))
    try:
        want = inspect(backend, ids, d["position"])
    finally:
        backend.close()
    assert Inside.from_dict(d) == want
    att = d["attribution"]
    assert att["softcap"] == 15.0
    assert abs(math.fsum(t["value"] for t in att["terms"]) + att["residual"] - att["pre_softcap"]) < 1e-4
    assert len(d["lens"]) == 2 and len(d["attention"][0]) == 4


def test_a_kempnerforge_step_human_table(capsys):
    step = manifest(KF_CASE)["steps"][0]
    argv = ["inspect", str(KF_CASE / "run"), "--step", str(step), "--device", "cpu", "--dtype", "float32"]
    code = cli.main([*argv, "--tokens", "5,9,20,31,40,50", "--position", "4"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert f"step {step} (dense, float32, exact)" in lines[0]
    assert lines[1].startswith("position 4 of 6 (prompt): token ") and "(id 50, came next)" in lines[1]
    assert lines[2].startswith(
        "read out: the residual stream each block returns, read out through the final RMSNorm"
    )
    assert [line.split()[0] for line in lines if line.startswith("  L") and "| rank" in line] == ["L0", "L1"]
    names = [
        line.split()[0]
        for line in lines[lines.index(next(x for x in lines if x.startswith("attribution"))) + 1 :]
    ]
    assert names == ["embedding", "L0", "L0", "L1", "L1", "residual"]
    assert "softcapped" not in next(x for x in lines if x.startswith("attribution"))
