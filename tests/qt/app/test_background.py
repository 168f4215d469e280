"""Background: folder scans, shape summaries and timelines off the GUI thread, debounced history
search; every answer arrives on the GUI thread, and a superseded lookup says nothing stale. No
asyncio loop is needed: Qt's event loop (qtbot's waits) delivers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.checkpoint_factory import write_checkpoint

from desktop.config import paths
from desktop.engine.messages import Message
from desktop.qt.app.background import Background
from desktop.qt.jobs.runner import Job
from desktop.store import HistoryStore

pytestmark = pytest.mark.gui
WAIT = 30000


@pytest.fixture
def background(qtbot, tmp_path) -> Iterator[Background]:
    paths.set_home(tmp_path / "home")
    store = HistoryStore(tmp_path / "history.sqlite3")
    yield Background(store)
    store.close()
    paths.set_home(None)


def on_gui_thread(signal) -> list:
    """Every emission of ``signal``, each noted with whether it came on the GUI thread."""
    got: list = []
    signal.connect(lambda *args: got.append((*args, threading.current_thread() is threading.main_thread())))
    return got


def flush(qtbot) -> None:
    """Everything jobs have posted so far is delivered (the runner delivers in order)."""
    seen: list[str] = []
    Job("flush").start(lambda _run: "flushed", done=seen.append)
    qtbot.waitUntil(lambda: seen == ["flushed"], timeout=WAIT)


def test_scan_lists_the_base_dir_the_added_folders_and_the_demo(qtbot, background, tmp_path):
    base = tmp_path / "nanochat"
    sft = write_checkpoint(base, "E7", phase="chatsft", tag="d4")
    extra = write_checkpoint(tmp_path / "mine", "E7", phase="chatsft", tag="x", step=3)
    background.extra_dirs.append(extra)
    got = on_gui_thread(background.checkpoints_found)
    with qtbot.waitSignal(background.checkpoints_found, timeout=WAIT):
        background.scan(base)
    ((entries, on_gui),) = got
    by_source = {(e.source, e.path) for e in entries}
    assert on_gui and ("sft", sft) in by_source and ("folder", extra) in by_source
    demo = paths.demo_checkpoint()
    if demo is not None:
        assert ("demo", demo) in by_source


def test_a_summary_reads_shapes_for_the_selection(qtbot, background, tmp_path):
    ckpt = write_checkpoint(tmp_path / "nanochat", "E7", phase="chatsft", tag="d4")
    got = on_gui_thread(background.summary_ready)
    with qtbot.waitSignal(background.summary_ready, timeout=WAIT):
        background.summarize(ckpt, 10)
    ((summary, on_gui),) = got
    assert on_gui and summary.path == ckpt and summary.era == "E7"
    assert summary.params > 0 and not summary.error


def test_a_newer_selection_supersedes_the_summary_of_the_older(qtbot, background, tmp_path):
    older = write_checkpoint(tmp_path / "nanochat", "E7", phase="chatsft", tag="d4")
    newer = write_checkpoint(tmp_path / "nanochat", "E7", phase="chatsft", tag="d6", step=20)
    got = on_gui_thread(background.summary_ready)
    background.summarize(older, 10)  # the user moves on before its answer is shown
    with qtbot.waitSignal(background.summary_ready, timeout=WAIT):
        background.summarize(newer, 20)
    flush(qtbot)
    assert [(s.path, s.step) for s, _ in got] == [(newer, 20)]


def test_a_newer_list_of_summaries_replaces_the_one_under_way(qtbot, background, tmp_path):
    ckpts = [write_checkpoint(tmp_path / "nanochat", "E7", phase="chatsft", tag=f"d{i}") for i in range(3)]
    got = on_gui_thread(background.summary_listed)
    background.summarize_many([(c, 10) for c in ckpts])
    background.summarize_many([(ckpts[2], 10), (ckpts[0], 10)])
    qtbot.waitUntil(lambda: len(got) >= 2, timeout=WAIT)
    flush(qtbot)
    assert [(s.path, on_gui) for s, on_gui in got] == [(ckpts[2], True), (ckpts[0], True)]


def test_a_runs_timeline_or_why_there_is_none(qtbot, background, tmp_path):
    run = write_checkpoint(tmp_path / "nanochat", "E7", phase="base", tag="d4")
    with qtbot.waitSignal(background.timeline_ready, timeout=WAIT) as ready:
        background.read_timeline(run)
    assert ready.args[0].points
    with qtbot.waitSignal(background.timeline_failed, timeout=WAIT) as failed:
        background.read_timeline(tmp_path / "nowhere")
    folder, line = failed.args
    assert folder == tmp_path / "nowhere" and line and "\n" not in line


def test_an_opened_folder_is_reported(qtbot, background, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with qtbot.waitSignal(background.folder_opened, timeout=WAIT) as opened:
        background.open_folder(empty)
    report = opened.args[0]
    assert report.folder == empty and report.dirs == () and report.problem


def test_search_is_debounced_to_the_last_query(qtbot, background):
    store = background.store
    conv = store.create_conversation("fruit")
    store.add_message(conv, Message.of_text("user", "apples and bananas"))
    emitted: list[list] = []
    background.search_results.connect(emitted.append)
    with qtbot.waitSignal(background.search_results, timeout=WAIT) as found:
        for query in ("ap", "appl", "bananas"):
            background.search(query)
    assert len(emitted) == 1  # the earlier queries were dropped before they ran
    assert [h.conversation_id for h in found.args[0]] == [conv]


def test_a_lookup_outliving_its_background_says_nothing(qtbot, tmp_path):
    """A scan still under way when its Background goes (the window closed) delivers nowhere."""
    import shiboken6

    store = HistoryStore(tmp_path / "history.sqlite3")
    background = Background(store)
    got = on_gui_thread(background.checkpoints_found)
    background.scan(Path(tmp_path / "nanochat"))
    shiboken6.delete(background)
    flush(qtbot)
    store.close()
    assert got == []
