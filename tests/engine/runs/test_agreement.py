"""Agreement of two checkpoints (the acceptance rate of one drafting greedily for the other), on
the demo's four steps of one trained run."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import TokenizerError
from desktop.engine.messages import Message
from desktop.engine.registry import open_backend
from desktop.engine.runs.agreement import agreement

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "resources" / "demo" / "chatsft_checkpoints" / "demo"
QUESTIONS = ("What is 345 plus 789?", "Count the letter e in excellence.", "Write a poem about the sea.")


@pytest.fixture(scope="module")
def last_step():
    backend = open_backend(DEMO, LoadOptions(step=2400, dtype="float32"))
    yield backend
    backend.close()


def prompts(backend):
    return [backend.render([Message.of_text("user", q)], 32) for q in QUESTIONS]


def test_a_step_agrees_with_itself_fully_and_later_steps_agree_more(last_step):
    ask = prompts(last_step)
    itself = agreement(last_step, f"{DEMO}@2400", ask, max_tokens=32)
    assert itself.rate == 1.0 and itself.tokens > 0
    early, late = (agreement(last_step, f"{DEMO}@{step}", ask, max_tokens=32).rate for step in (300, 1700))
    assert early is not None and late is not None
    assert 0 < early < 1 and early < late  # the run converges on what its last step says


def test_a_stopped_agreement_reads_no_more_prompts(last_step):
    cancel = threading.Event()
    cancel.set()
    assert agreement(last_step, f"{DEMO}@300", prompts(last_step), cancel=cancel).tokens == 0


def test_a_draft_with_another_tokenizer_is_one_line(last_step):
    other = ROOT / "tests" / "golden" / "nanochat" / "E7" / "chatsft_checkpoints" / "d2"
    with pytest.raises(TokenizerError, match="differs from the model's"):
        agreement(last_step, str(other), prompts(last_step))
