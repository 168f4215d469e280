"""The model worker: its slots called synchronously (no thread), then on its own QThread
(load, stream, stop, fail, shut down), with pytest-qt and no sleeps."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Signal
from support.checkpoint_factory import truncate_file, write_checkpoint
from support.chunk_checks import chunk_checks
from support.golden import GOLDEN
from support.hf_factory import write_hf_model

from desktop.config.paths import DEMO_DIR, resource_path
from desktop.engine.backend import LoadOptions, ModelInfo, Prompt, StreamOptions
from desktop.engine.decode.chunked import PREFILL_CHUNK
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.qt.model.worker import ModelWorker, WorkerHost, default_opener

pytestmark = pytest.mark.gui

CPU = LoadOptions(device="cpu")
HI = [Message.of_text("user", "hi")]
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("nanochat")
    return write_checkpoint(base, "E7", phase="chatsft", tokenizer="pkl")


class Recorder:
    """Every signal a worker emits, in order, as (name, args)."""

    NAMES = ("progress", "loaded", "load_failed", "context", "token", "finished", "failed", "scored")

    def __init__(self, worker: ModelWorker) -> None:
        self.events: list[tuple[str, tuple]] = []
        for name in self.NAMES:
            getattr(worker, name).connect(lambda *args, name=name: self.events.append((name, args)))

    def named(self, name: str) -> list[tuple]:
        return [args for n, args in self.events if n == name]


# ----- the slots, synchronously (the worker stays on this thread) --------------------------------


def test_slots_load_generate_score_in_order(qtbot, sft_dir):
    worker = ModelWorker()
    rec = Recorder(worker)
    worker._on_load(str(sft_dir), CPU)
    (info,) = rec.named("loaded")[0]
    assert isinstance(info, ModelInfo) and info.era == "E7" and info.capabilities.chat
    assert rec.named("progress"), "a load reports progress"
    params = SamplingParams(temperature=0.0, max_tokens=6)
    worker._on_generate(5, HI, params, StreamOptions(), None)
    kinds = [n for n, _ in rec.events if n in ("context", "token", "finished")]
    assert kinds[0] == "context" and kinds[-1] == "finished" and set(kinds[1:-1]) == {"token"}
    (request, prompt) = rec.named("context")[0]
    assert request == 5 and isinstance(prompt, Prompt) and prompt.tokens == len(prompt.ids)
    ids = [ev.id for _r, ev in rec.named("token") if not ev.continues]
    stats = rec.named("finished")[0][1]
    assert stats["new_tokens"] == len(ids) > 0
    # Teacher-forcing the greedy reply: every token was the argmax, so none scores below the top.
    worker._on_score(6, HI, ids, {"top": 1})
    request, result = rec.named("scored")[0]
    assert request == 6 and len(result["token_logprobs"]) == len(ids)
    assert [row[0][0] for row in result["top"]] == ids
    worker._on_unload()
    assert worker.backend is None


def test_slots_report_failures_as_one_line(qtbot, tmp_path):
    worker = ModelWorker()
    rec = Recorder(worker)
    worker._on_generate(2, HI, SamplingParams(), StreamOptions(), None)
    assert rec.named("failed") == [(2, "no model is loaded")]
    worker._on_score(3, HI, [1, 2], {})
    assert rec.named("failed")[-1] == (3, "no model is loaded")
    worker._on_load(str(tmp_path / "missing"), CPU)
    (reason,) = rec.named("load_failed")[0]
    assert "missing" in reason and "\n" not in reason


# ----- on its own thread ------------------------------------------------------------------------


class Relay(QObject):
    """The worker's signals re-emitted on the GUI thread, as the app receives them (a plain
    callable connected to the worker would run on the worker's thread)."""

    loaded = Signal(object)
    load_failed = Signal(str)
    token = Signal(int, object)
    finished = Signal(int, dict)
    failed = Signal(int, str)

    def __init__(self, worker: ModelWorker) -> None:
        super().__init__()
        for name in ("loaded", "load_failed", "token", "finished", "failed"):
            getattr(worker, name).connect(getattr(self, name))


@pytest.fixture
def host(qtbot):
    host = WorkerHost()
    host.relay = Relay(host.worker)
    yield host
    host.shutdown()
    assert host.model_thread.isFinished()


def _load(qtbot, host: WorkerHost, path: Path) -> ModelInfo:
    with qtbot.waitSignal(host.relay.loaded, timeout=30000) as blocker:
        host.load(str(path), CPU)
    return blocker.args[0]


def test_load_then_stream_tokens_and_finish(qtbot, host, sft_dir):
    info = _load(qtbot, host, sft_dir)
    assert info.era == "E7" and info.capabilities.chat is True
    tokens: list[TokenEvent] = []
    host.relay.token.connect(lambda _rid, ev: tokens.append(ev))
    with qtbot.waitSignal(host.relay.finished, timeout=30000) as done:
        host.generate(1, HI, SamplingParams(temperature=0.0, max_tokens=12))
    request_id, stats = done.args
    assert request_id == 1
    assert stats["new_tokens"] == len([t for t in tokens if not t.continues]) > 0
    assert stats["prompt_tokens"] > 0 and stats["ttft_ms"] > 0


def test_stop_ends_generation_within_a_token_and_keeps_partial(qtbot, host, sft_dir):
    _load(qtbot, host, sft_dir)
    seen: list[TokenEvent] = []

    def on_token(_rid: int, ev: TokenEvent) -> None:
        seen.append(ev)
        if len(seen) == 3:
            host.stop()  # the GUI thread sets the Event directly; the worker checks it between tokens

    host.relay.token.connect(on_token)
    with qtbot.waitSignal(host.relay.finished, timeout=30000) as done:
        host.generate(7, HI, SamplingParams(temperature=1.0, max_tokens=400, seed=3))
    stats = done.args[1]
    assert stats["stopped"] == "cancelled"
    # Queued token signals may still be in flight when stop is set, but the worker saw the
    # Event before producing more than one further token.
    assert 3 <= stats["new_tokens"] <= 4


def test_corrupt_checkpoint_reports_and_worker_stays_usable(qtbot, host, sft_dir, tmp_path):
    bad = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer="pkl")
    truncate_file(next(bad.glob("model_*.pt")), 0.5)
    with qtbot.waitSignal(host.relay.load_failed, timeout=30000) as failed:
        host.load(str(bad), CPU)
    message = failed.args[0]
    assert "model_000010.pt" in message and "truncated or corrupt" in message
    assert "\n" not in message
    info = _load(qtbot, host, sft_dir)  # the same worker loads a good one afterwards
    assert info.path == str(sft_dir)


def test_shutdown_stops_a_running_generation(qtbot, sft_dir):
    host = WorkerHost()
    relay = Relay(host.worker)
    with qtbot.waitSignal(relay.loaded, timeout=30000):
        host.load(str(sft_dir), CPU)
    with qtbot.waitSignal(relay.token, timeout=30000):
        host.generate(1, HI, SamplingParams(temperature=1.0, max_tokens=100000))
    assert host.shutdown(timeout_ms=30000)
    assert host.model_thread.isFinished()


def test_a_rust_panic_in_a_backend_is_reported_and_the_worker_stays_usable(qtbot, tmp_path):
    """pyo3's PanicException derives from BaseException, not Exception: it must still end the
    request with ``failed``, not kill the slot silently."""
    from support.fake_backend import FakeBackend, open_fake

    class PanicException(BaseException):  # what pyo3 raises for a Rust panic
        pass

    class PanickingBackend(FakeBackend):
        def stream(self, *args, **kwargs):
            raise PanicException("called `Option::unwrap()` on a `None` value")

    worker = ModelWorker(opener=lambda target, options, progress: PanickingBackend(target, options))
    rec = Recorder(worker)
    worker._on_load(str(tmp_path / "m"), CPU)
    worker._on_generate(1, HI, SamplingParams(), StreamOptions(), None)
    assert rec.named("failed") == [(1, "PanicException: called `Option::unwrap()` on a `None` value")]
    worker.backend = open_fake(tmp_path / "m", CPU, lambda *_: None)
    worker._on_generate(2, HI, SamplingParams(temperature=0.0, max_tokens=3), StreamOptions(), None)
    assert rec.named("finished")[-1][0] == 2


def test_stop_reaches_the_tokenization_of_a_long_prompt(qtbot, sft_dir):
    """A prompt that takes long to tokenize is cut off by Stop before the token loop starts
    (chat rendering encodes it a chunk at a time and checks the Event between chunks)."""
    worker = ModelWorker()
    rec = Recorder(worker)
    worker._on_load(str(sft_dir), CPU)
    worker.cancel.set()  # Stop pressed while the prompt is still being encoded
    long_prompt = [Message.of_text("user", "a line of a long paste\n" * 2000)]
    worker._on_generate(4, long_prompt, SamplingParams(max_tokens=8), StreamOptions(), None)
    # Nothing after the tokenizer ran: no prompt was reported, nothing was prefilled or sampled.
    assert rec.named("context") == [] and rec.named("token") == [] and rec.named("failed") == []
    (request, stats) = rec.named("finished")[0]
    assert request == 4 and stats["stopped"] == "cancelled" and stats["new_tokens"] == 0
    worker.cancel.clear()  # the next request runs as usual
    worker._on_generate(5, HI, SamplingParams(temperature=0.0, max_tokens=3), StreamOptions(), None)
    assert rec.named("finished")[-1][1]["new_tokens"] > 0


@pytest.fixture(scope="module")
def long_context_folders(tmp_path_factory) -> dict[str, Path]:
    """A folder of each family that holds 2,048 positions, each written by its own tool's code:
    the demo (the demo trainer, nanochat's format), the golden KempnerForge run ``long-context``
    and a NanoChat folder transformers' ``save_pretrained`` writes here."""
    hf = write_hf_model(
        tmp_path_factory.mktemp("hf-long") / "nanochat", "nanochat", max_position_embeddings=2048
    )
    return {
        "nanochat": resource_path(DEMO_DIR),
        "kempnerforge": GOLDEN / "kempnerforge" / "long-context" / "run",
        "hf": hf,
    }


@pytest.mark.parametrize("family", ["nanochat", "kempnerforge", "hf"])
def test_stop_during_the_prefill_of_a_long_prompt_ends_it_and_the_next_send_goes_on_from_there(
    qtbot, tmp_path, long_context_folders, family
):
    """A long paste into a chat: Stop pressed once the prompt is shown (the prefill has begun)
    ends the reply with nothing said, and the next send prefills only what the stopped one had
    not, where this CPU prefills in chunks (engine/decode/chunked.py). In every family."""
    worker = ModelWorker()
    rec = Recorder(worker)
    kernels = tmp_path / "kernels.json"  # where the check of chunks is kept, per machine
    options = LoadOptions(device="cpu", dtype="float32", kernel_cache=kernels)
    worker._on_load(str(long_context_folders[family]), options)
    assert rec.named("failed") == []
    paste = [Message.of_text("user", " ".join(f"Line {i}: the cat sat on the mat." for i in range(90)))]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    worker.context.connect(lambda *_: worker.cancel.set())  # Stop, as the prompt is shown
    worker._on_generate(1, paste, params, StreamOptions(), None)
    (_, prompt), (_, stopped) = rec.named("context")[0], rec.named("finished")[0]
    assert 2048 > prompt.tokens > PREFILL_CHUNK
    assert (stopped["stopped"], stopped["new_tokens"], rec.named("token")) == ("cancelled", 0, [])

    worker.context.disconnect()
    worker.cancel.clear()
    worker._on_generate(2, paste, params, StreamOptions(), None)
    (request, again) = rec.named("finished")[-1]
    assert request == 2 and again["new_tokens"] > 0 and rec.named("failed") == []
    checked = list(chunk_checks(kernels).values())
    assert checked in ([0.0], [1.0])  # the machine was asked once
    # Chunks: the stopped prefill kept its first chunk. One pass: it ran to the end.
    assert again["prefilled_tokens"] == (prompt.tokens - PREFILL_CHUNK if checked == [1.0] else 1)


def test_a_load_still_running_at_quit_neither_aborts_nor_holds_the_exit():
    """A load reads no Stop (a slow disk, a stuck network share): quitting gives up waiting for
    its thread. Destroying a QThread that still runs makes Qt abort the process; the app's exit
    must instead end it with the code it was given. In a subprocess, as only an exit shows it."""
    script = """
import sys, threading
from PySide6.QtCore import QCoreApplication
from desktop.engine.backend import LoadOptions
from desktop.qt.app.app import exit_code_after
from desktop.qt.model.worker import WorkerHost
app = QCoreApplication(sys.argv[:1])
opening, never = threading.Event(), threading.Event()
def stuck(target, options, progress):
    opening.set()
    never.wait()
host = WorkerHost(opener=stuck)
host.load("somewhere", LoadOptions())
assert opening.wait(60)
assert not host.shutdown(timeout_ms=100)
print("quitting", flush=True)
sys.exit(exit_code_after(7))
"""
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "quitting" in done.stdout, done.stderr[-2000:]
    assert done.returncode == 7 and "Destroyed while thread" not in done.stderr, done.stderr[-2000:]


def test_a_load_under_way_at_quit_ends_at_its_next_stage(qtbot):
    """Quitting while a model loads: the load ends at its next stage, one line says why, nothing
    is kept, and the thread ends, rather than the window waiting out the whole load. The disk
    here answers only once the app is closing."""
    reached = threading.Event()

    def slow_disk(target: Path, options: LoadOptions, progress) -> object:
        progress(1, "waiting for the disk")
        reached.set()
        host.worker.closing.wait()
        return default_opener(target, options, progress)

    host = WorkerHost(opener=slow_disk)
    relay = Relay(host.worker)
    host.load(str(resource_path(DEMO_DIR)), CPU)
    assert reached.wait(60)
    with qtbot.waitSignal(relay.load_failed, timeout=30000) as failed:
        assert host.shutdown(timeout_ms=30000)
    assert "the app is closing" in failed.args[0] and "\n" not in failed.args[0]
    assert host.worker.backend is None
