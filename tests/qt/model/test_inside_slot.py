"""The Inside pass through a real ModelSlot (issue #45): asked on the GUI thread, run on the
model's own thread between its other requests, answered with the cache or one line."""

from __future__ import annotations

import threading

import pytest
from support.golden import GOLDEN, manifest

from desktop.config import paths
from desktop.config.settings import Settings
from desktop.engine import inside as inside_module
from desktop.engine.inside import InsideCache
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.qt.model.slot import ModelSlot

pytestmark = pytest.mark.gui

WAIT = 60000
CASE = GOLDEN / "nanochat" / "E7"


@pytest.fixture
def slot(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv(paths.NANOCHAT_BASE_ENV, str(CASE))
    paths.set_home(tmp_path)
    settings = Settings(tmp_path / "settings.json")
    settings.set("device", "cpu")
    slot = ModelSlot(settings)
    yield slot
    slot.shutdown()
    paths.set_home(None)


def load_golden(qtbot, slot: ModelSlot) -> dict:
    m = manifest(CASE)
    with qtbot.waitSignal(slot.loaded, timeout=WAIT):
        slot.load(CASE / "chatsft_checkpoints" / m["tag"], m["step"])
    return m


def test_an_inside_pass_runs_on_the_models_thread_and_returns_the_cache(qtbot, slot, monkeypatch):
    m = load_golden(qtbot, slot)
    ids = list(m["cases"][0]["prompt_ids"])[:20]
    threads: list[threading.Thread] = []
    real = inside_module.inspect_all

    def spy(*args):
        threads.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr("desktop.engine.inside.inspect_all", spy)
    with qtbot.waitSignal(slot.inside_ready, timeout=WAIT) as got:
        request = slot.inside(ids)
    assert got.args[0] == request and slot.inside_passes == 1
    cache = got.args[1]
    assert isinstance(cache, InsideCache) and list(cache.ids) == ids and cache.reply_start == len(ids)
    assert threads and threads[0] is not threading.main_thread()
    inside = cache.at(5)
    assert inside.produced == ids[6] and len(inside.lens) == cache.n_layer
    assert len(cache.labels) >= max(ids) + 1 and isinstance(cache.labels[ids[0]], str)


def test_a_reply_inside_renders_the_prompt_as_a_generation_does(qtbot, slot):
    load_golden(qtbot, slot)
    chat = [Message.of_text("user", "hi")]
    with qtbot.waitSignal(slot.context, timeout=WAIT) as ctx, qtbot.waitSignal(slot.finished, timeout=WAIT):
        slot.generate(chat, SamplingParams(temperature=0.0, max_tokens=4))
    prompt_ids = list(ctx.args[0].ids)
    with qtbot.waitSignal(slot.inside_ready, timeout=WAIT) as got:
        slot.reply_inside(chat, [5, 6, 7])
    cache = got.args[1]
    assert list(cache.ids) == [*prompt_ids, 5, 6, 7] and cache.reply_start == len(prompt_ids)


def test_no_model_and_an_empty_sequence_fail_in_one_line(qtbot, slot):
    with qtbot.waitSignal(slot.inside_failed, timeout=WAIT) as got:
        request = slot.inside([1, 2])
    assert got.args == [request, "no model is loaded"]
    load_golden(qtbot, slot)
    with qtbot.waitSignal(slot.inside_failed, timeout=WAIT) as got:
        slot.inside([])
    assert "empty" in got.args[1] and "\n" not in got.args[1]


def gated(monkeypatch) -> threading.Event:
    """The model's thread waits at the start of its next Inside pass until the returned event is
    set: what the test sends meanwhile queues behind that pass, as a user's requests do."""
    gate = threading.Event()
    real = inside_module.inspect_all

    def held(*args):
        if not gate.is_set():
            assert gate.wait(WAIT / 1000)
        return real(*args)

    monkeypatch.setattr("desktop.engine.inside.inspect_all", held)
    return gate


def test_a_prepared_pass_gives_way_to_a_message_sent_after_it(qtbot, slot, monkeypatch):
    m = load_golden(qtbot, slot)
    ids = list(m["cases"][0]["prompt_ids"])[:20]
    gate = gated(monkeypatch)
    order: list[str] = []
    slot.inside_failed.connect(lambda _r, why: order.append(f"prepared: {why}"))
    slot.finished.connect(lambda *_: order.append("reply"))
    slot.inside(ids)  # held at the gate on the model's thread
    prepared = slot.prepare_inside(ids, 10)
    with qtbot.waitSignal(slot.inside_failed, timeout=WAIT) as gave_way:
        slot.generate([Message.of_text("user", "hi")], SamplingParams(temperature=0.0, max_tokens=4))
        gate.set()
    assert gave_way.args[0] == prepared and "gave way" in gave_way.args[1]
    qtbot.waitUntil(lambda: order[-1:] == ["reply"], timeout=WAIT)
    assert order[0].startswith("prepared:")  # ended before the reply started, not after it

    # Nothing sent after it: the prepared pass runs to its end.
    with qtbot.waitSignal(slot.inside_ready, timeout=WAIT) as got:
        request = slot.prepare_inside(ids, 10)
    assert got.args[0] == request and got.args[1].reply_start == 10 and list(got.args[1].ids) == ids
