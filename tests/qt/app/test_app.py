"""The whole window driven as a user would: real worker thread, tiny checkpoints, real SQLite."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, QTimer, QUrl, Slot
from PySide6.QtGui import QAction, QDesktopServices
from PySide6.QtWidgets import QApplication, QMessageBox
from support.checkpoint_factory import truncate_file, write_checkpoint

from desktop.cli import main as cli
from desktop.config import logfile, paths
from desktop.config.paths import demo_checkpoint
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT
from desktop.qt.app.app import build, show_error, shutdown
from desktop.qt.app.main_window import MainWindow
from desktop.qt.chat.message_blocks import ToolCallBlock
from desktop.store import HistoryStore

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("nanochat"), "E7", phase="chatsft", tokenizer="pkl")


@pytest.fixture
def window(qtbot):
    win = build()
    qtbot.addWidget(win)
    win.show()
    yield win
    shutdown(win)  # closeEvent: stop, quit, wait; then the settings and the history store


def load(qtbot, win, path: Path, step: int = 10) -> dict:
    with qtbot.waitSignal(win.controller.model_loaded, timeout=60000) as blocker:
        win.controller.load_checkpoint(path, step)
    return blocker.args[0]


def send(qtbot, win, text: str, timeout: int = 60000) -> dict:
    with qtbot.waitSignal(win.controller.reply_finished, timeout=timeout) as done:
        win.input.editor.setPlainText(text)
        qtbot.keyClick(win.input.editor, Qt.Key.Key_Return)
    return done.args[0]


def test_send_streams_tokens_into_the_view_and_reports_stats(qtbot, window, sft_dir):
    load(qtbot, window, sft_dir)
    window.sampling.set_values({"temperature": 0.0, "max_tokens": 16})
    events = []
    window.controller.reply_event.connect(events.append)
    stats = send(qtbot, window, "hello")
    assert stats["new_tokens"] == len([e for e in events if e.id >= 0]) > 0
    assert window.input.editor.toPlainText() == ""  # accepted, so cleared
    reply = window.chat.widgets[-1].message
    assert reply.role == "assistant"
    assert "".join(p.text for p in reply.parts) == "".join(e.text for e in events if e.special is None)
    assert window.status.speed.text().endswith("tok/s")
    used, total = window.status.context.text().split(" / ")
    assert int(used) == stats["prompt_tokens"] + stats["new_tokens"] and int(total) == 64


def test_stop_keeps_the_partial_reply(qtbot, window, sft_dir):
    load(qtbot, window, sft_dir)
    window.sampling.set_values({"temperature": 1.0, "top_k": 0, "max_tokens": 400})
    seen = []

    def on_event(ev) -> None:
        seen.append(ev)
        if len(seen) == 5:
            qtbot.keyClick(window.input.editor, Qt.Key.Key_Escape)

    window.controller.reply_event.connect(on_event)
    # The tiny model's reply ends by itself within its 64-token context; on a busy machine the
    # worker could get there before the window sees the fifth token. So the worker waits at its
    # fifth token until the Escape sets its cancel (a direct slot runs on the worker's thread).
    worker = window.controller.slot.host.worker
    emitted = []

    def hold_at_the_fifth(_request_id: int, _ev: object) -> None:
        emitted.append(1)
        if len(emitted) == 5:
            worker.cancel.wait(60)

    worker.token.connect(hold_at_the_fifth, Qt.ConnectionType.DirectConnection)
    stats = send(qtbot, window, "tell me a long story")
    worker.token.disconnect(hold_at_the_fifth)
    assert stats["stopped"] == "cancelled"
    reply_id, reply = window.controller.path[-1]
    assert reply.role == "assistant" and 5 <= stats["new_tokens"] < 400
    stored = dict(window.controller.store.active_path(window.controller.conv_id))[reply_id]
    assert stored.parts == reply.parts  # the partial reply is saved, complete
    assert window.controller.store.is_complete(reply_id)


def test_corrupt_checkpoint_shows_an_error_and_the_window_keeps_working(qtbot, window, sft_dir, tmp_path):
    bad = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer="pkl")
    truncate_file(next(bad.glob("model_*.pt")), 0.4)
    with qtbot.waitSignal(window.controller.model_load_failed, timeout=60000):
        window.controller.load_checkpoint(bad, 10)
    assert not window.banner.isHidden() and window.banner.level == "error"
    assert "truncated or corrupt" in window.banner.message.text()
    assert bad.name in window.banner.title.text() and str(bad) in window.banner.message.text()
    load(qtbot, window, sft_dir)
    assert send(qtbot, window, "still there?")["new_tokens"] > 0


def test_sampling_values_reach_the_worker_and_are_stored_with_the_reply(qtbot, window, sft_dir):
    load(qtbot, window, sft_dir)
    window.sampling.set_values(
        {
            "temperature": 0.7,
            "top_k": 13,
            "top_p": 0.9,
            "min_p": 0.05,
            "repetition_penalty": 1.2,
            "max_tokens": 9,
            "seed": 1234,
            "seed_locked": True,
        }
    )
    stats = send(qtbot, window, "sample please")
    assert stats["new_tokens"] <= 9
    reply_id, _ = window.controller.path[-1]
    stored = dict(window.controller.store.active_path(window.controller.conv_id))[reply_id]
    assert stored.meta["sampling"] == {
        "temperature": 0.7,
        "top_k": 13,
        "top_p": 0.9,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
        "max_tokens": 9,
        "seed": 1234,
    }
    assert stored.meta["step"] == 10 and stored.meta["era"] == "E7" and stored.meta["dtype"] == "float32"
    assert stored.meta["stats"]["new_tokens"] == stats["new_tokens"]


def test_unlocked_seeds_stay_fresh_when_a_library_reseeds_random(qtbot, window, sft_dir):
    """Regenerate with the seed unlocked: each reply gets a new seed, the one the panel shows,
    even when something in the process calls random.seed between the replies."""
    load(qtbot, window, sft_dir)
    window.sampling.set_values({"temperature": 1.0, "max_tokens": 4, "seed_locked": False})
    seeds = []
    for text in ("first", "second", "third"):
        random.seed(0)
        send(qtbot, window, text)
        reply_id, _ = window.controller.path[-1]
        stored = dict(window.controller.store.active_path(window.controller.conv_id))[reply_id]
        assert stored.meta["sampling"]["seed"] == window.sampling.seed_box.value()
        seeds.append(stored.meta["sampling"]["seed"])
    assert len(set(seeds)) == 3


def test_history_survives_closing_and_reopening(qtbot, sft_dir):
    first = build()
    qtbot.addWidget(first)
    load(qtbot, first, sft_dir)
    first.sampling.set_values({"temperature": 0.0, "max_tokens": 6})
    send(qtbot, first, "remember me")
    conv_id = first.controller.conv_id
    before = [m for _, m in first.controller.path]
    shutdown(first)
    assert not first.controller.slot.host.model_thread.isRunning()

    second = build()
    qtbot.addWidget(second)
    rows = second.controller.store.list_conversations()
    assert [r.id for r in rows] == [conv_id] and rows[0].title == "remember me"
    second.controller.refresh_list()
    assert second.sidebar.list.count() == 1
    second.controller.open_conversation(conv_id)
    assert [m.parts for m in (w.message for w in second.chat.widgets)] == [m.parts for m in before]
    shutdown(second)


@pytest.mark.skipif(demo_checkpoint() is None, reason="the bundled demo model is not built")
def test_forced_calculator_tokens_render_as_a_tool_call_block(qtbot, window):
    demo = demo_checkpoint()
    from desktop.engine.nanochat.checkpoint import model_steps

    load(qtbot, window, demo, model_steps(demo)[-1])
    window.sampling.apply_preset("Greedy")
    events = []
    window.controller.reply_event.connect(events.append)
    send(qtbot, window, "What is 12 times 7?")
    forced = "".join(e.text for e in events if e.forced)
    assert "84" in forced
    widget = window.chat.widgets[-1]
    blocks = widget.findChildren(ToolCallBlock)
    assert len(blocks) == 1
    assert blocks[0].expression.replace(" ", "") == "12*7" and blocks[0].output.strip() == "84"
    kinds = [p.kind for p in widget.message.parts]
    assert PYTHON in kinds and PYTHON_OUTPUT in kinds


def test_worker_thread_is_gone_after_quit(qtbot, sft_dir):
    win = build()
    qtbot.addWidget(win)
    load(qtbot, win, sft_dir)
    thread = win.controller.slot.host.model_thread
    assert thread.isRunning()
    shutdown(win)
    assert thread.isFinished()


def test_send_without_a_model_keeps_the_text(qtbot, window):
    window.input.editor.setPlainText("not lost")
    qtbot.keyClick(window.input.editor, Qt.Key.Key_Return)
    assert window.input.editor.toPlainText() == "not lost"
    assert not window.banner.isHidden() and "No model loaded" in window.banner.title.text()
    assert HistoryStore(window.controller.store.path).list_conversations() == []


def test_a_100_kb_paste_is_sent_with_a_truncation_warning(qtbot, window, sft_dir):
    load(qtbot, window, sft_dir)
    window.sampling.set_values({"temperature": 0.0, "max_tokens": 4})
    big = "lorem ipsum dolor sit amet " * 4000  # ~108 KB, far past the 64-token context
    stats = send(qtbot, window, big)
    assert stats["new_tokens"] > 0
    assert not window.banner.isHidden() and window.banner.level == "warning"
    assert "truncated" in window.banner.title.text().lower()
    used, total = (int(x) for x in window.status.context.text().split(" / "))
    assert used <= total
    _, user = window.controller.path[-2]
    assert user.plain_text() == big.strip()  # the full text is kept in history, only the prompt was cut


# --- the app shell: settings saved as they change, crash log, log folder, store closed at quit ------


def settings_on_disk(win) -> dict:
    path = win.settings.path
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def test_a_setting_changed_in_the_menu_is_on_disk_while_the_app_runs(qtbot, window):
    dark = next(a for a in window.findChildren(QAction) if a.text() == "Dark")
    dark.trigger()
    assert settings_on_disk(window).get("theme") != "dark"  # debounced, not written in the click
    qtbot.waitUntil(lambda: settings_on_disk(window).get("theme") == "dark", timeout=5000)
    assert window.isVisible()


@pytest.mark.qt_no_exception_capture  # the app's own hook is under test, not pytest-qt's
def test_an_exception_in_a_slot_goes_to_the_log_file_and_a_message_box(qtbot, window):
    log = logfile.setup_logging()
    assert log is not None and log.parent == paths.home() / "log"
    logfile.install_exception_hooks(show_error)
    try:

        def broken_slot() -> None:
            raise RuntimeError("a slot went wrong 8086")

        QTimer.singleShot(0, broken_slot)

        def box_shown() -> QMessageBox | None:
            boxes = [w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox)]
            boxes = [b for b in boxes if b.isVisible()]
            return boxes[0] if boxes else None

        qtbot.waitUntil(lambda: box_shown() is not None, timeout=5000)
        assert "RuntimeError: a slot went wrong 8086" in box_shown().text()
        box_shown().close()
        text = log.read_text(encoding="utf-8")
        assert "CRITICAL [MainThread] desktop.config.logfile: Uncaught exception" in text
        assert "in broken_slot" in text and "RuntimeError: a slot went wrong 8086" in text
    finally:
        logfile.teardown_logging()


def test_help_menu_opens_the_log_folder(qtbot, window):
    class Receiver(QObject):
        def __init__(self) -> None:
            super().__init__()
            self.opened: list[str] = []

        @Slot(QUrl)
        def open(self, url: QUrl) -> None:
            self.opened.append(url.toLocalFile())

    receiver = Receiver()
    QDesktopServices.setUrlHandler("file", receiver, "open")  # Qt's hook for a scheme's opener
    try:
        action = next(a for a in window.findChildren(QAction) if a.text() == "Open log folder")
        action.trigger()
    finally:
        QDesktopServices.unsetUrlHandler("file")
    assert receiver.opened == [str(paths.log_dir())]
    assert paths.log_dir() == paths.home() / "log"


def test_quitting_the_app_closes_the_history_database(qapp, tmp_path):
    """A real start through the CLI entry point, quit once the window shows."""
    home = tmp_path / "home"
    db = home / "data" / "history.sqlite3"
    seen: dict[str, bool] = {}

    def quit_once_shown() -> None:
        if not any(isinstance(w, MainWindow) and w.isVisible() for w in qapp.topLevelWidgets()):
            QTimer.singleShot(20, quit_once_shown)
            return
        seen["wal while running"] = db.with_name(db.name + "-wal").exists()
        qapp.quit()

    QTimer.singleShot(0, quit_once_shown)
    assert cli.main(["--home", str(home)]) == 0
    assert seen == {"wal while running": True}  # the store was open (WAL mode) while the app ran
    assert db.is_file()
    assert not db.with_name(db.name + "-wal").exists()  # the last connection closed at quit
    assert not db.with_name(db.name + "-shm").exists()
    log = (home / "log" / logfile.LOG_NAME).read_text(encoding="utf-8")
    assert "GUI starting" in log and "GUI closed" in log
