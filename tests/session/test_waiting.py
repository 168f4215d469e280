"""A message sent before the chat's model is ready, without Qt: it is held while a model is looked
for or loads, the line under it says what it waits for (the load's own progress, the time
waited), it comes back when the model arrives (to be answered) or when no model comes (to give
back), a second one is refused, and nothing is held when no model is coming at all."""

from __future__ import annotations

from desktop.engine.params import SamplingParams
from desktop.session.waiting import LOOKING, HeldMessage, ModelWait, target_name


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def message(text: str = "What is 12 times 7?") -> HeldMessage:
    return HeldMessage(text, SamplingParams(temperature=0.0), "be brief", "")


def test_nothing_is_held_when_no_model_is_coming() -> None:
    wait = ModelWait()
    assert not wait.hold(message())
    assert wait.held is None and wait.line() == ""


def test_a_message_sent_while_checkpoints_are_looked_for_waits_and_says_so() -> None:
    clock = Clock()
    wait = ModelWait(clock)
    changes: list[str] = []
    wait.events.changed.connect(lambda: changes.append(wait.line()))
    wait.looking()
    sent = message()
    assert wait.hold(sent)
    assert wait.held == sent
    assert wait.line() == f"Waiting for a model · {LOOKING}"
    wait.loading("d4 step 20")
    assert wait.line() == "Waiting for d4 step 20 to load · 0%"
    wait.progress(0, "loading d4 step 20")  # the slot's first report only repeats the target
    assert wait.line() == "Waiting for d4 step 20 to load · 0%"
    clock.now += 9.4
    wait.progress(74, "Tuning for this CPU… once per machine, at most 12 s more")
    assert wait.line() == (
        "Waiting for d4 step 20 to load · Tuning for this CPU… once per machine, at most 12 s more (74%)"
        " · 9 s so far"
    )
    assert len(changes) == 5  # each step was shown
    assert wait.arrived() == sent
    assert wait.held is None and not wait.coming and wait.line() == ""


def test_a_second_message_is_refused_while_one_waits() -> None:
    wait = ModelWait()
    wait.loading("d4 step 20")
    assert wait.hold(message("first"))
    assert not wait.hold(message("second"))
    assert wait.held is not None and wait.held.text == "first"


def test_a_failed_load_gives_the_message_back() -> None:
    wait = ModelWait()
    wait.loading("broken step 1")
    wait.hold(message())
    wait.progress(10, "checking model_000001.pt")
    held = wait.failed()
    assert held is not None and held.text == "What is 12 times 7?" and held.system_prompt == "be brief"
    assert not wait.coming and wait.held is None
    wait.progress(50, "late report")  # after the end: nothing is loading any more
    assert wait.percent == 0 and not wait.hold(message())


def test_cancel_gives_the_message_back_and_the_model_still_comes() -> None:
    wait = ModelWait()
    wait.loading("d4 step 20")
    wait.hold(message())
    held = wait.cancel()
    assert held is not None and wait.held is None and wait.coming
    assert wait.cancel() is None
    assert wait.arrived() is None  # nothing to answer once it is loaded


def test_what_loads_is_named_as_the_picker_names_it(tmp_path) -> None:
    run = tmp_path / "chatsft_checkpoints" / "d20"
    assert target_name(run, 2400) == "sft/d20 step 2,400"
    assert target_name(tmp_path / "my-export", None) == "my-export"
