"""``nanoscope eval`` with several tasks, nanochat's eval_bundle and a lite sample: every chosen
task asked of each step, a second run read back from the store (and said), what flipped with
each example's prompt, and one line with exit 2 for input it cannot use."""

from __future__ import annotations

import json

import pytest
from support import REPO
from support.eval_bundle import make_bundle

from desktop.cli import main as cli
from desktop.engine.runs.timeline import timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
STEPS = [p.step for p in timeline_of(DEMO).points]
TWO = f"{STEPS[0]},{STEPS[-1]}"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["eval", str(DEMO), "--device", "cpu", "--steps", TWO, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_several_tasks_in_one_sweep_then_read_back_from_the_store(capsys):
    code, out, err = run(capsys, "--task", "samples,answers", "--lite", "3", "--json")
    assert code == 0 and "kept results" not in err
    lines = [json.loads(line) for line in out.splitlines()]
    answers = [x for x in lines if x["task"] == "answers" and "step" in x]
    # each step: the first three of base_train's prompts, then the first three problems
    assert [x["task"] for x in lines[:6]] == ["samples"] * 3 + ["answers"] * 3
    asked = [(s, n) for s in (STEPS[0], STEPS[-1]) for n in (1, 2, 3)]
    assert [(a["step"], a["line"]) for a in answers] == asked
    flips = lines[-1]
    right = {(a["step"], a["line"]): a["correct"] for a in answers}
    lost = [n for n in (1, 2, 3) if right[(STEPS[0], n)] and not right[(STEPS[-1], n)]]
    assert [f["line"] for f in flips["lost"]] == lost and all(f["prompt"] for f in flips["lost"])
    code, again, err = run(capsys, "--task", "samples,answers", "--lite", "3", "--json")
    assert code == 0 and again == out
    assert err.count("kept results") == 4  # two steps, two tasks


def test_core_from_a_bundle_names_its_lite_sample_and_the_core_score(tmp_path, capsys):
    bundle = make_bundle(tmp_path)
    code, out, err = run(capsys, "--task", "core", "--data", str(bundle), "--lite", "2")
    assert code == 0, err
    assert "CORE mc_task (lite 2: nanochat's --max-per-task 2):" in out
    assert "CORE lm_task (lite 2" in out
    assert out.count("CORE over 4 tasks") == 2
    code, out, err = run(capsys, "--task", "core:schema_task", "--data", str(bundle), "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and {x["task"] for x in lines} == {"core:schema_task"}
    assert len([x for x in lines if "step" in x]) == 2 * 2  # both examples at both steps


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--task", "everything"], "choose from samples"),
        (["--task", "mc,bpb", "--data", "x"], "one at a time"),
        (["--task", "answers", "--lite", "0"], "--lite must be at least 1"),
        (["--task", "core", "--data", "/nonexistent"], "no eval_bundle"),
        (["--task", "bpb"], "needs --data"),
    ],
)
def test_input_it_cannot_use_is_one_line(capsys, argv, says):
    code, _out, err = run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and says in err


def test_a_core_task_not_in_the_bundle_is_one_line(tmp_path, capsys):
    bundle = make_bundle(tmp_path)
    code, _out, err = run(capsys, "--task", "core:nope", "--data", str(bundle))
    assert code == 2 and err.count("\n") == 1 and "no task 'nope'" in err


def test_a_bundle_under_the_base_dir_is_found(tmp_path, capsys, monkeypatch):
    make_bundle(tmp_path)
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    code, out, err = run(capsys, "--task", "core:mc_task", "--lite", "1")
    assert code == 0, err
    assert "CORE mc_task (lite 1" in out


def test_a_hostile_bundle_line_is_a_warning_and_the_rest_is_asked(tmp_path, capsys):
    bundle = make_bundle(tmp_path)
    data = bundle / "eval_data" / "lm.jsonl"
    data.write_text(data.read_text("utf-8") + "{broken\n", "utf-8")
    code, out, err = run(capsys, "--task", "core:lm_task", "--data", str(bundle), "--json")
    assert code == 0 and err.count("\n") == 1 and f"{data}:4: not a JSON object; skipped" in err
    assert len([line for line in out.splitlines() if '"step"' in line]) == 3 * 2
