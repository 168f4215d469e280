"""A sweep over a run's saved steps: each step's greedy continuation of each prompt, as that step
alone gives it, with one checkpoint in memory at a time; Stop ends it after the prompt being
written; nanoscope eval prints it."""

from __future__ import annotations

import json
import threading

import pytest
from support import REPO
from support.backend_helpers import reply_ids

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend
from desktop.engine.runs import evals, sweep
from desktop.engine.runs.timeline import timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"
PROMPTS = ("The capital of France is", "My favorite color is")
CPU = LoadOptions(device="cpu")


def test_nanochats_own_sample_prompts_are_the_default():
    assert len(evals.SAMPLE_PROMPTS) == 7 and evals.SAMPLE_PROMPTS[0] == "The capital of France is"


def test_each_step_says_what_it_alone_says_and_only_one_is_open_at_a_time(monkeypatch):
    points = list(timeline_of(DEMO).points)[::3]  # the first and the last step
    live, most = [0], [0]

    def counted(target, options, progress=None):
        backend = open_backend(target, options, progress)
        live[0] += 1
        most[0] = max(most[0], live[0])
        close = backend.close

        def closing() -> None:
            live[0] -= 1
            close()

        backend.close = closing  # type: ignore[method-assign]
        return backend

    monkeypatch.setattr(sweep, "open_backend", counted)
    samples = list(evals.sample_sweep(points, PROMPTS, options=CPU))
    assert [(s.step, s.prompt) for s in samples] == [(p.step, q) for p in points for q in PROMPTS]
    assert most[0] == 1 and live[0] == 0
    greedy = SamplingParams(temperature=0.0, max_tokens=evals.SAMPLE_TOKENS)
    for point in points:
        backend = open_backend(DEMO, LoadOptions(device="cpu", step=point.step))
        try:
            for sample in (s for s in samples if s.step == point.step):
                assert list(sample.ids) == reply_ids(backend, backend.render(sample.prompt, None), greedy)
        finally:
            backend.close()


def test_stop_ends_the_sweep_after_the_prompt_being_written():
    cancel = threading.Event()
    seen = list(
        evals.sample_sweep(
            list(timeline_of(DEMO).points),
            PROMPTS,
            options=CPU,
            cancel=cancel,
            progress=lambda *_: cancel.set(),
        )
    )
    assert len(seen) == 1


def test_nanoscope_eval_prints_one_json_line_per_sample(capsys):
    step = timeline_of(DEMO).points[-1].step
    argv = ["eval", str(DEMO), "--task", "samples", "--steps", str(step), "--prompt", PROMPTS[0]]
    assert cli.main([*argv, "--device", "cpu", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    shown = json.loads(line)
    assert (shown["step"], shown["prompt"]) == (step, PROMPTS[0]) and len(shown["ids"]) <= evals.SAMPLE_TOKENS


@pytest.mark.parametrize(
    ("steps", "says"), [("12x", "comma-separated step numbers"), ("7", "no saved step 7")]
)
def test_a_wrong_step_list_is_one_line(capsys, steps, says):
    assert cli.main(["eval", str(DEMO), "--task", "samples", "--steps", steps]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
