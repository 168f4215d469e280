"""Background: folder scans and shape summaries off the GUI thread, debounced history search,
all on a real qasync loop (as in the app)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import qasync
from support.checkpoint_factory import write_checkpoint

from desktop.config import paths
from desktop.engine.messages import Message
from desktop.qt.app.background import Background
from desktop.store import HistoryStore

pytestmark = pytest.mark.gui
WAIT = 30000


@pytest.fixture
def loop(qapp) -> Iterator[asyncio.AbstractEventLoop]:
    loop = qasync.QEventLoop(qapp, already_running=False)
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


@pytest.fixture
def background(qtbot, tmp_path) -> Iterator[Background]:
    paths.set_home(tmp_path / "home")
    store = HistoryStore(tmp_path / "history.sqlite3")
    yield Background(store)
    store.close()
    paths.set_home(None)


def run_until(loop: asyncio.AbstractEventLoop, signal, action) -> list:
    """Start ``action`` on the running loop and return the first emission of ``signal``."""
    got: list = []
    done = asyncio.Event()

    def on_signal(*args) -> None:
        got.append(args)
        done.set()

    signal.connect(on_signal)

    async def main() -> None:
        action()
        await asyncio.wait_for(done.wait(), WAIT / 1000)

    loop.run_until_complete(main())
    signal.disconnect(on_signal)
    return got[0]


def test_scan_lists_the_base_dir_the_added_folders_and_the_demo(loop, background, tmp_path):
    base = tmp_path / "nanochat"
    sft = write_checkpoint(base, "E7", phase="chatsft", tag="d4")
    extra = write_checkpoint(tmp_path / "mine", "E7", phase="chatsft", tag="x", step=3)
    background.extra_dirs.append(extra)
    (entries,) = run_until(loop, background.checkpoints_found, lambda: background.scan(base))
    by_source = {(e.source, e.path) for e in entries}
    assert ("sft", sft) in by_source and ("folder", extra) in by_source
    demo = paths.demo_checkpoint()
    if demo is not None:
        assert ("demo", demo) in by_source


def test_a_summary_reads_shapes_for_the_selection(loop, background, tmp_path):
    ckpt = write_checkpoint(tmp_path / "nanochat", "E7", phase="chatsft", tag="d4")
    (summary,) = run_until(loop, background.summary_ready, lambda: background.summarize(ckpt, 10))
    assert summary.path == ckpt and summary.era == "E7" and summary.params > 0 and not summary.error


def test_search_is_debounced_to_the_last_query(loop, background):
    store = background.store
    conv = store.create_conversation("fruit")
    store.add_message(conv, Message.of_text("user", "apples and bananas"))
    emitted: list[list] = []
    background.search_results.connect(emitted.append)

    def type_quickly() -> None:
        for query in ("ap", "appl", "bananas"):
            background.search(query)

    (hits,) = run_until(loop, background.search_results, type_quickly)
    assert len(emitted) == 1  # the earlier queries were cancelled before they ran
    assert [h.conversation_id for h in hits] == [conv]


def test_without_a_running_loop_the_work_is_skipped(background):
    background.scan(Path("/nowhere"))
    background.search("x")  # no loop in plain Qt code: nothing runs, nothing raises
