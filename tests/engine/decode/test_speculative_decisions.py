"""Speculative decoding's timing-driven decisions are kept per model and machine (pass_timing.Decisions):
whether a compiled twin verifies or drafts, and its costs, hold from the first reply of the next
session, before its compile has ended; a twin found slower is not compiled again.

The timings are injected (each test says which form is faster), so nothing here depends on the
machine's speed or load; the compiled twin is stood in for by the eager model itself (what is
tested is which form is used and at what costs, not the compiler)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from support.tiny_models import draft_of, tiny_gpt, tiny_state

from desktop.engine.decode import speculative, verifier
from desktop.engine.decode.compiled_draft import Switched
from desktop.engine.decode.pass_timing import Decisions
from desktop.engine.decode.verifier import Verifier
from desktop.engine.kernels.tuning import KernelTuner

VOCAB = 48


class Twin:
    """A compile that has ended (or not yet), its code standing in for the compiled forward."""

    def __init__(self, done: bool = True, error: str | None = None) -> None:
        self.done = threading.Event()
        self.error = error  # why it ended without code
        if done:
            self.done.set()

    def switched(self, eager):
        return Switched(eager, eager)

    def stop(self) -> None:
        pass


@pytest.fixture
def model():
    return tiny_gpt(tiny_state(VOCAB, 0), VOCAB)


def _timings(monkeypatch, module, compiled_faster: bool) -> None:
    """``module``'s stopwatch: the compiled form takes half the eager time, or twice it."""

    def timed_ms(model, make_cache, rows):
        eager = 1.0 + 0.5 * (rows - 1)
        return eager * (0.5 if compiled_faster else 2.0) if isinstance(model, Switched) else eager

    monkeypatch.setattr(module, "timed_ms", timed_ms)


def _session(cache: Path) -> Decisions:
    """A new start of the app: a new tuner reading the same file."""
    return Decisions(KernelTuner(cache), "tiny model")


def test_a_faster_verifier_twin_lends_its_kept_costs_from_the_next_sessions_first_reply(
    tmp_path, monkeypatch, model
):
    cache = tmp_path / "kernels.json"
    _timings(monkeypatch, verifier, compiled_faster=True)
    first = Verifier(model, lambda n: None, _session(cache))
    first.compile(Twin)
    first.settle()
    assert first.compiled and first.verify_cost is not None
    costs = first.costs(1.0)

    _timings(monkeypatch, verifier, compiled_faster=False)  # timed again, it would lose now
    later = Verifier(model, lambda n: None, _session(cache))
    later.compile(lambda: Twin(done=False))  # its compile has not ended at the first reply
    later.settle()
    assert not later.compiled and later.costs(1.0) == costs  # the same draft lengths already
    assert later.twin is not None
    later.twin.done.set()
    later.settle()
    assert later.compiled and later.costs(1.0) == costs and not later.renewed


def test_a_slower_verifier_twin_is_not_compiled_again(tmp_path, monkeypatch, model):
    cache = tmp_path / "kernels.json"
    _timings(monkeypatch, verifier, compiled_faster=False)
    first = Verifier(model, lambda n: None, _session(cache))
    first.compile(Twin)
    first.settle()
    assert not first.compiled and first.costs(0.4) == (1.0, 0.4)

    started: list[Twin] = []
    later = Verifier(model, lambda n: None, _session(cache))
    later.compile(lambda: started.append(Twin()) or started[-1])
    assert not started and later.costs(0.4) == (1.0, 0.4)


def test_a_drafts_kept_compiled_decision_holds_before_its_compile_ends(tmp_path, monkeypatch, model):
    cache = tmp_path / "kernels.json"
    _timings(monkeypatch, speculative, compiled_faster=True)
    first = draft_of(model, cost=0.6)
    first.decisions = _session(cache)
    assert first.should_compile()  # nothing decided yet: compile, and time it when ready
    first.twin = Twin()  # type: ignore[assignment]
    first.settle()
    assert first.compiled and first.cost < 0.6

    _timings(monkeypatch, speculative, compiled_faster=False)
    later = draft_of(model, cost=0.6)
    later.decisions = _session(cache)
    assert later.should_compile() and later.cost == first.cost  # before its twin is ready
    later.twin = Twin()  # type: ignore[assignment]
    later.settle()
    assert later.compiled and later.cost == first.cost


def test_a_re_measure_decides_again_and_says_so(tmp_path, monkeypatch, model):
    cache = tmp_path / "kernels.json"
    _timings(monkeypatch, speculative, compiled_faster=True)
    first = draft_of(model, cost=0.6)
    first.decisions = _session(cache)
    first.twin = Twin()  # type: ignore[assignment]
    first.settle()
    assert first.compiled and not first.renewed

    KernelTuner(cache).forget()  # Settings › Re-measure kernels
    _timings(monkeypatch, speculative, compiled_faster=False)
    later = draft_of(model, cost=0.6)
    later.decisions = _session(cache)
    assert later.should_compile()  # forgotten: timed again once compiled
    later.twin = Twin()  # type: ignore[assignment]
    later.settle()
    assert not later.compiled and later.cost == 0.6 and later.renewed
