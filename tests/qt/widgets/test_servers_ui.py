"""Servers in the app: the Settings › Servers dialog, keys kept out of every file, and a served
model (a real ``transformers serve`` on 127.0.0.1) picked, chatted with, stopped, regenerated and
compared with a local checkpoint through the real window."""

from __future__ import annotations

import socket
from pathlib import Path

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail
from PySide6.QtCore import Qt
from support.checkpoint_factory import write_checkpoint
from support.served_model import local_greedy, served_model

from desktop.config import keystore as keystore_module
from desktop.config import paths
from desktop.config.keystore import NO_KEYRING, KeyStore
from desktop.config.servers import publish
from desktop.config.settings import Settings
from desktop.engine.messages import TokenEvent, TokenTrace
from desktop.engine.params import SamplingParams
from desktop.engine.remote.servers import directory
from desktop.qt.app.app import build, shutdown
from desktop.qt.widgets.servers_dialog import ServersDialog
from desktop.session.compare.same_model import compare_replies

pytestmark = pytest.mark.gui
KEY = "sk-nanoscope-test-7f3a9c1d5e"


class MemoryKeyring(KeyringBackend):
    """Stands in for the OS keyring (the machine running the tests may have none)."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.store.pop((service, username), None)


@pytest.fixture(scope="session")
def served(request, tmp_path_factory):
    return served_model(request, tmp_path_factory)


@pytest.fixture
def os_keyring(monkeypatch):
    previous = keyring.get_keyring()
    ring = MemoryKeyring()
    keyring.set_keyring(ring)
    monkeypatch.setattr(keystore_module, "_store", None)  # the app's store sees this keyring
    yield ring
    keyring.set_keyring(previous)
    directory.publish([])


@pytest.fixture
def no_keyring(monkeypatch):
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    monkeypatch.setattr(keystore_module, "_store", None)
    yield
    keyring.set_keyring(previous)


def fill_server(qtbot, dialog: ServersDialog, url: str, name: str, key: str = "") -> None:
    qtbot.mouseClick(dialog.add_btn, Qt.MouseButton.LeftButton)
    qtbot.keyClicks(dialog.url_edit, url)
    qtbot.keyClicks(dialog.name_edit, name)
    if key:
        qtbot.keyClicks(dialog.key_edit, key)


def test_settings_refuse_a_key_in_the_server_list(tmp_path):
    settings = Settings(tmp_path / "settings.json")
    with pytest.raises(ValueError, match="unknown server fields"):
        settings.set("servers", [{"id": "s1", "url": "http://127.0.0.1:1", "api_key": KEY}])
    with pytest.raises(ValueError, match="unique slug"):
        settings.set("servers", [{"id": "a b", "url": "http://127.0.0.1:1"}])


def test_dialog_tests_a_server_and_saves_it_with_the_key_in_the_keyring(qtbot, served, os_keyring, tmp_path):
    settings = Settings(tmp_path / "settings.json")
    keys = KeyStore()
    dialog = ServersDialog(settings, keys)
    qtbot.addWidget(dialog)
    fill_server(qtbot, dialog, served.url, "Tiny box", KEY)
    qtbot.mouseClick(dialog.test_btn, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.test_result.text().startswith(("✓", "⚠")), timeout=30000)
    assert dialog.test_result.text() == f"✓ 1 model: {served.model}"
    dialog.accept()
    settings.save()
    saved = settings.get("servers")
    assert [(s["name"], s["url"]) for s in saved] == [("Tiny box", served.url)]
    assert KEY not in settings.path.read_text()
    assert keys.get(saved[0]["id"]) == KEY and KEY in os_keyring.store.values()
    assert dialog.session_note == ""


def test_without_a_keyring_the_key_is_kept_for_the_session_only(qtbot, no_keyring, tmp_path):
    settings = Settings(tmp_path / "settings.json")
    keys = KeyStore()
    dialog = ServersDialog(settings, keys)
    qtbot.addWidget(dialog)
    assert keys.problem == NO_KEYRING and dialog.keyring_note.text() == NO_KEYRING
    fill_server(qtbot, dialog, "http://127.0.0.1:9", "Nowhere", KEY)
    dialog.accept()
    settings.save()
    assert dialog.session_note == NO_KEYRING
    assert keys.get(settings.get("servers")[0]["id"]) == KEY
    assert KEY not in settings.path.read_text()
    assert KeyStore().get(settings.get("servers")[0]["id"]) is None  # gone with the session


def test_dialog_test_reports_an_unreachable_server_in_one_line(qtbot, no_keyring, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dialog = ServersDialog(Settings(tmp_path / "settings.json"), KeyStore())
    qtbot.addWidget(dialog)
    fill_server(qtbot, dialog, f"http://127.0.0.1:{port}", "Closed")
    qtbot.mouseClick(dialog.test_btn, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.test_result.text().startswith("⚠"), timeout=30000)
    assert "connection refused" in dialog.test_result.text() and "\n" not in dialog.test_result.text()
    dialog.error.clear()
    qtbot.keyClicks(dialog.url_edit, "\b" * 40 + "ftp://x")
    dialog.accept()
    assert "http://" in dialog.error.text() and dialog.result() != dialog.DialogCode.Accepted


# ----- the window ---------------------------------------------------------------------------------


@pytest.fixture
def window(qtbot, served, os_keyring):
    win = build()
    qtbot.addWidget(win)
    win.settings.set("servers", [{"id": "tiny", "name": "Tiny box", "url": served.url}])
    keystore_module.keystore().set("tiny", KEY)
    win.background.servers = publish(win.settings)
    # The window is not started, so no scan runs: list the servers as a scan would.
    entries = [e for source in win.background.servers for e in source.entries()]
    win.background.checkpoints_found.emit(entries)
    win.show()
    yield win
    shutdown(win)


def send(qtbot, win, text: str) -> dict:
    with qtbot.waitSignal(win.controller.reply_finished, timeout=60000) as done:
        win.input.editor.setPlainText(text)
        qtbot.keyClick(win.input.editor, Qt.Key.Key_Return)
    return done.args[0]


def test_chat_with_a_served_model_stop_and_regenerate_and_no_file_holds_the_key(qtbot, window, served):
    entry = next(e for e in window.picker.entries if e.source == "remote")
    assert entry.tag == f"Tiny box · {served.model}"
    assert window.picker.select(entry.path, 0)
    with qtbot.waitSignal(window.controller.model_loaded, timeout=60000) as loaded:
        qtbot.mouseClick(window.picker.load_btn, Qt.MouseButton.LeftButton)
    info = loaded.args[0]
    assert info.family == "remote" and info.name == f"Tiny box · {served.model}"
    # transformers serve refuses top_k, min_p and repetition_penalty: the panel greys them out.
    assert not window.sampling.rows["top_k"].isEnabled() and window.sampling.rows["temperature"].isEnabled()
    assert "refuses" in window.sampling.rows["top_k"].toolTip()

    window.sampling.set_values({"temperature": 0.0, "max_tokens": 10})
    stats = send(qtbot, window, "hello world")
    assert stats["new_tokens"] == 10 and stats["stopped"] == "max_tokens"
    assert window.chat.widgets[-1].message.plain_text() == local_greedy(served, "hello world", 10)

    window.sampling.set_values({"temperature": 1.0, "max_tokens": 200})
    seen: list[TokenEvent] = []

    def stop_after_two(ev: TokenEvent) -> None:
        seen.append(ev)
        if len(seen) == 2:
            qtbot.keyClick(window.input.editor, Qt.Key.Key_Escape)

    window.controller.reply_event.connect(stop_after_two)
    stats = send(qtbot, window, "tell me a story")
    window.controller.reply_event.disconnect(stop_after_two)
    assert stats["stopped"] == "cancelled"
    partial = window.chat.widgets[-1].message.plain_text()
    assert partial and len(seen) < 200

    window.sampling.set_values({"temperature": 0.0, "max_tokens": 6})
    with qtbot.waitSignal(window.controller.reply_finished, timeout=60000) as done:
        window.chat.regenerate_requested.emit(len(window.chat.widgets) - 1)
    assert done.args[0]["stopped"] == "max_tokens"
    history = [{"role": w.message.role, "content": w.message.plain_text()} for w in window.chat.widgets[:-1]]
    assert [m["content"] for m in history[::2]] == ["hello world", "tell me a story"]
    assert window.chat.widgets[-1].message.plain_text() == local_greedy(served, history, 6)

    shutdown(window)  # writes settings, history and the log
    written = [paths.settings_path(), paths.history_db_path(), *Path(paths.log_dir()).glob("*")]
    assert any(p.is_file() for p in written)
    for path in written:
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_compare_a_served_model_beside_a_local_checkpoint(qtbot, window, served, tmp_path):
    local = write_checkpoint(tmp_path / "nanochat", "E7", phase="chatsft", tokenizer="pkl")
    remote = next(e for e in window.picker.entries if e.source == "remote")
    compare, view = window.compare, window.compare_view
    with qtbot.waitSignal(compare.pane_loaded, timeout=60000):
        compare.load(0, local, 10)
    with qtbot.waitSignal(compare.pane_loaded, timeout=60000):
        compare.load(1, remote.path, 0)
    assert compare.panes[1].info.family == "remote"

    view.set_sampling({"temperature": 0.7, "max_tokens": 8, "seed": 5})
    view.input.editor.setPlainText("hello world")
    with qtbot.waitSignal(compare.same_model_reported, timeout=60000) as reported:
        assert view.check_same_model()
    a, b, report = reported.args
    assert (a, b) == (0, 1)
    local_run, served_run = compare.panes[0].run, compare.panes[1].run
    assert served_run.stats["new_tokens"] == 8 and local_run.params == served_run.params
    assert served_run.params.greedy and served_run.params.seed == 5
    assert served_run.reply.plain_text() == local_greedy(served, "hello world", 8)
    # A random nanochat checkpoint and a random Llama: they differ, compared by text.
    assert report.compared_by == "text" and report.first_difference is not None
    assert report.mean_abs_dlogprob is None  # transformers serve gives no probabilities
    assert view.status.text() == report.summary("A", "B")
    assert compare.divergence is not None  # the ordinary divergence marker works on text too


def test_same_model_report_by_ids_and_by_text():
    def trace(ids, texts, lps):
        t = TokenTrace()
        for i, text, lp in zip(ids, texts, lps, strict=True):
            t.add(TokenEvent(i, text, False, "text", logprob=lp))
        return t

    a = trace([1, 2, 3], ["He", "llo", "!"], [-0.1, -0.2, -0.3])
    b = trace([1, 2, 4], ["He", "llo", "?"], [-0.15, -0.1, -2.0])
    by_ids = compare_replies(a, b, by_ids=True)
    assert (by_ids.first_difference, by_ids.logprob_tokens) == (2, 2)
    assert by_ids.mean_abs_dlogprob == pytest.approx((0.05 + 0.1) / 2)
    c = trace([-1, -1], ["Hel", "lo!"], [None, None])  # cut elsewhere, no ids, no probabilities
    by_text = compare_replies(a, c, by_ids=False)
    assert by_text.identical and by_text.mean_abs_dlogprob is None
    d = trace([-1, -1], ["He", "lp"], [-0.1, -1.0])
    differ = compare_replies(a, d, by_ids=False)
    assert (differ.first_difference, differ.first_difference_b, differ.logprob_tokens) == (1, 1, 1)
    assert SamplingParams(temperature=0.0).greedy
