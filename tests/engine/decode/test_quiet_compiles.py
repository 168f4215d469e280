"""A background compile stays out of the user's way (engine/foreground.py, compiled_draft.py): its
thread runs at the lowest priority, waits while a reply streams or the
user types, is started once per model in the process, and one stopped or failed is kept so that
no later session starts it again.

No real compile here (a cold inductor compile takes minutes): the compile is injected, a loop
of Python calls, or a stand-in twin; what is asserted is where the thread is, not how long."""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path

import pytest
import torch
from support.tiny_models import draft_of, tiny_gpt, tiny_state

from desktop.config.paths import DEMO_DIR, resource_path
from desktop.engine import foreground
from desktop.engine.backend import GenerationStats, LoadOptions, StreamOptions
from desktop.engine.decode import compiled_draft
from desktop.engine.decode.compiled_draft import CallStop, CompiledTwin, CompileStopped, shared_twin
from desktop.engine.decode.pass_timing import Decisions
from desktop.engine.decode.speculative import DRAFT_COMPILED
from desktop.engine.decode.verifier import COMPILED, Verifier
from desktop.engine.foreground import hold_background, holding, set_foreground_busy
from desktop.engine.kernels.tuning import KernelTuner
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

VOCAB = 48
HERE = (__file__,)  # the test's own functions stand for the compiler's


def compiler_step() -> None:
    """A call into "the compiler" (this file, given as CallStop's pause_in)."""


class Loop:
    """A compile stand-in: calls compiler_step until told to end, inside a CallStop, on a thread."""

    def __init__(self) -> None:
        self.stop = CallStop(pause_in=HERE)
        self.steps = 0
        self.enough = threading.Event()
        self.stepped = threading.Event()  # set at each step
        self.outcome = ""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.stop:
                while not self.enough.is_set():
                    compiler_step()
                    self.steps += 1
                    self.stepped.set()
            self.outcome = "ended"
        except CompileStopped:
            self.outcome = "stopped"


@pytest.fixture(autouse=True)
def nothing_held():
    assert holding() == []
    yield
    set_foreground_busy("typing", False)
    assert holding() == []


def test_a_compile_waits_while_a_reply_streams_and_goes_on_after():
    loop = Loop()
    with hold_background("a reply"):
        loop.thread.start()
        assert loop.stop.waiting.wait(30)  # at its first call into the compiler
        assert loop.steps == 0 and loop.thread.is_alive()
    assert loop.stepped.wait(30)  # free again: it goes on
    assert loop.steps > 0 and not loop.stop.waiting.is_set()
    loop.enough.set()
    loop.thread.join(30)
    assert loop.outcome == "ended"


def test_typing_holds_it_until_the_user_stops_typing_and_twice_busy_is_one_hold():
    loop = Loop()
    set_foreground_busy("typing", True)
    set_foreground_busy("typing", True)
    assert holding() == ["typing"]
    loop.thread.start()
    assert loop.stop.waiting.wait(30)
    set_foreground_busy("typing", False)
    assert holding() == []
    assert loop.stepped.wait(30)
    loop.enough.set()
    loop.thread.join(30)
    assert loop.outcome == "ended"


def test_a_stop_ends_a_waiting_compile():
    loop = Loop()
    with hold_background("a reply"):
        loop.thread.start()
        assert loop.stop.waiting.wait(30)
        loop.stop.request()
        loop.thread.join(30)
        assert loop.outcome == "stopped" and loop.steps == 0


def test_it_never_waits_holding_loggings_lock():
    """A wait under a lock the reply's thread takes would wait on that reply for good."""
    done = threading.Event()

    def work() -> None:
        with CallStop(pause_in=HERE), logging._lock:  # type: ignore[attr-defined]
            compiler_step()
        done.set()

    with hold_background("a reply"):
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        assert done.wait(30)  # ran through, held or not


def test_a_stop_never_lands_inside_logging_and_leaves_no_lock_held():
    """A stop requested while the compile's thread logs lands after logging, never at the entry
    of the handler's release() in the finally after emit, which would leave the handler's lock
    held by the ended thread: every later log line in the process would wait on it for good."""
    stop = CallStop(pause_in=HERE)

    class Requesting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # As another thread's request() lands: here, with no Python call after it in emit,
            # the next function the thread enters is the handler's release().
            stop._requested.append(True)

    handler = Requesting()
    log = logging.getLogger("nanoscope.test.callstop")
    log.addHandler(handler)
    log.propagate = False
    outcome: list[str] = []

    def work() -> None:
        try:
            with stop:
                log.warning("compiling")
                compiler_step()  # the stop lands here, out of logging
                outcome.append("ran on")
        except CompileStopped:
            outcome.append("stopped")

    try:
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        thread.join(30)
        assert outcome == ["stopped"]
        assert handler.lock is not None and handler.lock.acquire(timeout=5), "the handler's lock is held"
        handler.lock.release()
    finally:
        log.removeHandler(handler)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_a_thread_lowers_its_own_priority_never_the_processes():
    before = os.getpriority(os.PRIO_PROCESS, 0)
    seen: list[int] = []

    def work() -> None:
        foreground.lower_this_threads_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(30)
    assert seen == [19] and os.getpriority(os.PRIO_PROCESS, 0) == before


class InjectedCompile(CompiledTwin):
    """A CompiledTwin whose compile is injected: it notes its thread's priority, then calls into
    the compiler until told to finish (``finish``)."""

    made = 0

    def __init__(self) -> None:
        type(self).made += 1
        super().__init__(tiny_gpt(tiny_state(VOCAB, 0), VOCAB), lambda n: None, [8], backend="eager")
        self.finish = threading.Event()
        self.seen: dict[str, int] = {}
        self._call_stop.pause_in = HERE

    def _compile(self) -> None:
        if sys.platform.startswith("linux"):
            self.seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        while not self.finish.is_set():
            compiler_step()
        self._run = lambda *args, **kwargs: torch.zeros(1)


@pytest.mark.compile_priority
def test_one_compile_per_model_in_the_process_and_the_last_holder_ends_it():
    InjectedCompile.made = 0
    first = shared_twin("tiny @1", InjectedCompile)
    second = shared_twin("tiny @1", InjectedCompile)  # a second pane, or the model loaded again
    assert second is first and InjectedCompile.made == 1 and first.holders == 2
    assert not first.stop()  # one holder lets go: it goes on for the other
    assert not first._stop.is_set()
    assert first.stop()  # the last: ended mid-compile
    first.done.wait(30)
    assert first.error == "stopped" and first.compiled is None
    third = shared_twin("tiny @1", InjectedCompile)  # let go by all: a new one
    assert third is not first and InjectedCompile.made == 2
    assert isinstance(third, InjectedCompile)
    third.finish.set()
    third.done.wait(30)
    assert third.compiled is not None and third.error is None
    if sys.platform.startswith("linux"):
        assert third.seen == {"nice": 19}
    assert not third.stop()  # ended already: its code stays for who took it
    assert third.compiled is not None and "tiny @1" not in compiled_draft._SHARED


def test_the_compile_thread_waits_while_held():
    twin = shared_twin("tiny @2", InjectedCompile)
    assert isinstance(twin, InjectedCompile)
    with hold_background("a reply"):
        assert twin.waiting.wait(30)
        twin.finish.set()  # it may not finish while held: it waits
        assert not twin.done.is_set()
    assert twin.done.wait(30) and twin.compiled is not None
    twin.stop()


class Twin:
    """A stand-in compile under way or ended (with ``error``, without code)."""

    def __init__(self, done: bool = False, error: str | None = None) -> None:
        self.done = threading.Event()
        if done:
            self.done.set()
        self.error = error

    def stop(self) -> bool:
        return not self.done.is_set()

    def switched(self, eager):
        return None


def _session(cache: Path) -> Decisions:
    return Decisions(KernelTuner(cache), "tiny model")


def test_a_failed_verifier_compile_is_not_started_in_the_next_session(tmp_path):
    cache = tmp_path / "kernels.json"
    model = tiny_gpt(tiny_state(VOCAB, 0), VOCAB)
    first = Verifier(model, lambda n: None, _session(cache))
    first.compile(Twin)
    assert first.twin is not None
    first.twin.done.set()
    first.twin.error = "CalledProcessError: g++ failed"  # type: ignore[misc]
    first.settle()
    assert _session(cache).recall(COMPILED)["compiled"] == 0.0

    started: list[Twin] = []
    later = Verifier(model, lambda n: None, _session(cache))
    later.compile(lambda: started.append(Twin()) or started[-1])
    assert not started and not later.compiled


def test_a_compile_stopped_mid_way_is_tried_again_in_the_next_session(tmp_path):
    """Quitting (or letting the draft go) mid-compile measured nothing: the next session compiles."""
    cache = tmp_path / "kernels.json"
    model = tiny_gpt(tiny_state(VOCAB, 0), VOCAB)
    first = Verifier(model, lambda n: None, _session(cache))
    first.compile(Twin)
    first.stop()  # the model closed mid-compile
    assert _session(cache).recall(COMPILED) == {}
    started: list[Twin] = []
    later = Verifier(model, lambda n: None, _session(cache))
    later.compile(lambda: started.append(Twin()) or started[-1])
    assert len(started) == 1
    later.stop()

    draft = draft_of(model)
    draft.decisions = _session(cache)
    draft.twin = Twin()  # type: ignore[assignment]
    draft.let_go()  # another draft picked, speculative decoding off, or the model closed
    assert draft.twin is None
    again = draft_of(model)
    again.decisions = _session(cache)
    assert again.should_compile() and _session(cache).recall(DRAFT_COMPILED) == {}


def test_a_compile_that_paid_off_is_not_given_up_by_a_later_stop(tmp_path):
    cache = tmp_path / "kernels.json"
    _session(cache).remember(DRAFT_COMPILED, lambda: {"compiled": 1.0, "cost": 0.2})
    draft = draft_of(tiny_gpt(tiny_state(VOCAB, 0), VOCAB))
    draft.decisions = _session(cache)
    draft.twin = Twin()  # type: ignore[assignment]
    draft.let_go()
    assert _session(cache).recall(DRAFT_COMPILED) == {"compiled": 1.0, "cost": 0.2}


def test_a_reply_holds_background_work_while_it_streams_cli_or_app():
    backend = open_backend(resource_path(DEMO_DIR), LoadOptions())
    prompt = backend.render([Message.of_text("user", "Hi")], 8)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    events = backend.stream(prompt, params, threading.Event(), StreamOptions(), GenerationStats())
    next(events)
    assert holding() == ["a reply"]
    list(events)
    assert holding() == []
    backend.close()


def test_compiled_code_is_kept_beside_the_kernel_timings_unless_the_user_named_a_place(monkeypatch, tmp_path):
    """A compile that paid off is found in inductor's cache in the next session, even after a
    reboot emptied the temporary folder (its default place)."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    compiled_draft.keep_compiled_code_in(tmp_path / "inductor")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    compiled_draft.keep_compiled_code_in(tmp_path / "inductor")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
