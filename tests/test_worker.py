"""The model worker on its own QThread: load, stream, stop, fail, shut down (pytest-qt, no sleeps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkpoint_factory import truncate_file, write_checkpoint

from desktop.engine.messages import Message, TokenEvent
from desktop.worker import WorkerHost

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("nanochat")
    return write_checkpoint(base, "E7", phase="chatsft", tokenizer="pkl")


@pytest.fixture
def host(qtbot):
    host = WorkerHost()
    yield host
    host.shutdown()
    assert host.thread.isFinished()


def _load(qtbot, host: WorkerHost, path: Path) -> dict:
    with qtbot.waitSignal(host.worker.loaded, timeout=30000) as blocker:
        host.load(str(path), {"device": "cpu"})
    return blocker.args[0]


def test_load_then_stream_tokens_and_finish(qtbot, host, sft_dir):
    info = _load(qtbot, host, sft_dir)
    assert info["era"] == "E7" and info["chat_mode"] is True
    tokens: list[TokenEvent] = []
    host.worker.token.connect(lambda _rid, ev: tokens.append(ev))
    with qtbot.waitSignal(host.worker.finished, timeout=30000) as done:
        host.generate(1, [Message.of_text("user", "hi")], {"temperature": 0.0, "max_tokens": 12})
    request_id, stats = done.args
    assert request_id == 1
    assert stats["new_tokens"] == len([t for t in tokens if t.id >= 0]) > 0
    assert stats["prompt_tokens"] > 0 and stats["ttft_ms"] > 0


def test_stop_ends_generation_within_a_token_and_keeps_partial(qtbot, host, sft_dir):
    _load(qtbot, host, sft_dir)
    seen: list[TokenEvent] = []

    def on_token(_rid: int, ev: TokenEvent) -> None:
        seen.append(ev)
        if len(seen) == 3:
            host.stop()  # the GUI thread sets the Event directly; the worker checks it between tokens

    host.worker.token.connect(on_token)
    with qtbot.waitSignal(host.worker.finished, timeout=30000) as done:
        host.generate(7, [Message.of_text("user", "hi")], {"temperature": 1.0, "max_tokens": 400, "seed": 3})
    stats = done.args[1]
    assert stats["stopped"] == "cancelled"
    # Queued token signals may still be in flight when stop is set, but the worker saw the
    # Event before producing more than one further token.
    assert 3 <= stats["new_tokens"] <= 4


def test_corrupt_checkpoint_reports_and_worker_stays_usable(qtbot, host, sft_dir, tmp_path):
    bad = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer="pkl")
    truncate_file(next(bad.glob("model_*.pt")), 0.5)
    with qtbot.waitSignal(host.worker.load_failed, timeout=30000) as failed:
        host.load(str(bad), {"device": "cpu"})
    message = failed.args[0]
    assert "model_000010.pt" in message and "truncated or corrupt" in message
    assert "\n" not in message
    info = _load(qtbot, host, sft_dir)  # the same worker loads a good one afterwards
    assert info["path"] == str(sft_dir)


def test_generate_without_model_fails_cleanly(qtbot, host):
    with qtbot.waitSignal(host.worker.failed, timeout=10000) as failed:
        host.generate(2, [Message.of_text("user", "hi")], {"temperature": 0.0, "max_tokens": 4})
    assert failed.args == [2, "no checkpoint is loaded"]


def test_shutdown_stops_a_running_generation(qtbot, sft_dir):
    host = WorkerHost()
    with qtbot.waitSignal(host.worker.loaded, timeout=30000):
        host.load(str(sft_dir), {"device": "cpu"})
    with qtbot.waitSignal(host.worker.token, timeout=30000):
        host.generate(1, [Message.of_text("user", "hi")], {"temperature": 1.0, "max_tokens": 100000})
    assert host.shutdown(timeout_ms=30000)
    assert host.thread.isFinished()
