"""The memory check before loading: it compares estimates with the RAM the OS says is *available*.

psutil is the boundary to the machine, so its reading is replaced here; what is tested is the
decision made from it. The total installed RAM must never stand in for the free RAM (it did on
macOS, where the warning could then never fire).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from desktop.engine.discovery import CheckpointSummary
from desktop.engine.kernels import memory


def _summary(name: str, params: int) -> CheckpointSummary:
    return CheckpointSummary(Path(name), 1, "E7", params, 2048, 65536, 32, 2048, "bfloat16", 0, 0)


def _machine(monkeypatch: pytest.MonkeyPatch, *, total: int, available: int) -> None:
    reading = SimpleNamespace(total=total, available=available, free=available // 2)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: reading)


def test_low_available_memory_warns_although_the_total_is_plenty(monkeypatch):
    pair = [_summary("a", 10**9), _summary("b", 10**9)]
    need = sum(s.memory_estimate(4) for s in pair)
    _machine(monkeypatch, total=100 * need, available=need - 1)
    ok, needed, available, message = memory.fits(pair, "cpu", "float32")
    assert (ok, needed, available) == (False, need, need - 1)
    assert "These 2 checkpoints need" in message and "RAM" in message
    assert f"{memory.human(need - 1)} is free" in message and "\n" not in message


def test_enough_available_memory_does_not_warn(monkeypatch):
    one = _summary("a", 10**9)
    need = one.memory_estimate(4)
    _machine(monkeypatch, total=need, available=need)
    assert memory.fits([one], "cpu", "float32") == (True, need, need, "")


def test_available_ram_is_the_available_reading_not_the_total(monkeypatch):
    _machine(monkeypatch, total=64 * 2**30, available=3 * 2**30)
    assert memory.available_ram() == 3 * 2**30


def test_models_already_loaded_count_as_memory_they_would_give_back(monkeypatch):
    loaded, new = _summary("a", 10**9), _summary("b", 10**9)
    need = loaded.memory_estimate(4) + new.memory_estimate(4)
    _machine(monkeypatch, total=100 * need, available=new.memory_estimate(4))
    ok, _needed, available, message = memory.fits([loaded, new], "cpu", "float32", loaded=[loaded])
    assert ok and available == need and message == ""


def test_an_unreadable_reading_turns_the_check_off_with_one_log_line(monkeypatch, caplog):
    def refuse() -> SimpleNamespace:
        raise PermissionError("/proc/meminfo: permission denied")

    monkeypatch.setattr(psutil, "virtual_memory", refuse)
    huge = _summary("a", 10**12)
    with caplog.at_level(logging.WARNING, logger=memory.__name__):
        assert memory.fits([huge], "cpu", "float32") == (True, huge.memory_estimate(4), 0, "")
    assert len(caplog.records) == 1 and "permission denied" in caplog.records[0].getMessage()
    assert caplog.records[0].exc_info is None


def test_the_real_reading_is_plausible():
    ram = memory.available_ram()
    assert ram is not None and 0 < ram <= psutil.virtual_memory().total


def test_draft_copies_are_named_apart_and_an_unreadable_one_is_not_counted(monkeypatch):
    """Compare counts a copy of the drafting pane's checkpoint per pane that loads it; the
    message names them, and a copy whose summary failed is left out of both."""
    a, b = _summary("a", 10**9), _summary("b", 10**9)
    _machine(monkeypatch, total=10**15, available=1)
    _ok, needed, _available, message = memory.fits([a, b], "cpu", "float32", drafts=[a, a])
    assert needed == 3 * a.memory_estimate(4) + b.memory_estimate(4)
    assert message.startswith("These 2 checkpoints and 2 draft copies of one need about")
    assert "Turn Speculative off" in message
    broken = _summary("c", 10**9)
    broken.error = "cannot read"
    _ok, needed, _available, message = memory.fits([a, broken], "cpu", "float32", drafts=[broken])
    assert needed == a.memory_estimate(4)
    assert message.startswith("This checkpoint needs about") and "Speculative" not in message
