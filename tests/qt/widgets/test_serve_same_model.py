"""A checkpoint served by ``nanoscope serve``, used through Nanoscope's own remote backend in the
real window: listed from Settings › Servers, chatted with, and compared in Compare with the same
checkpoint loaded locally, where "Same model?" finds them identical token by token."""

from __future__ import annotations

import keyring
import pytest
from keyring.backends import fail
from PySide6.QtCore import Qt
from support.golden import GOLDEN
from support.serving import serving

from desktop.config import keystore as keystore_module
from desktop.config.servers import publish
from desktop.engine.backend import LoadOptions
from desktop.engine.remote.servers import directory
from desktop.qt.app.app import build, shutdown

pytestmark = pytest.mark.gui
E7 = GOLDEN / "nanochat" / "E7"
SFT = E7 / "chatsft_checkpoints" / "d2"


@pytest.fixture
def served(monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(E7))
    with serving(SFT, LoadOptions(device="cpu", base_dir=E7)) as s:
        yield s


@pytest.fixture
def window(qtbot, served, monkeypatch):
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    monkeypatch.setattr(keystore_module, "_store", None)
    win = build()
    qtbot.addWidget(win)
    win.settings.set("servers", [{"id": "self", "name": "Nanoscope", "url": served.url}])
    win.background.servers = publish(win.settings)
    entries = [e for source in win.background.servers for e in source.entries()]
    win.background.checkpoints_found.emit(entries)
    win.show()
    yield win
    shutdown(win)
    keyring.set_keyring(previous)
    directory.publish([])


def test_chat_through_the_servers_list_then_same_model_against_the_local_copy(qtbot, window, served):
    remote = next(e for e in window.picker.entries if e.source == "remote")
    assert served.model in remote.tag
    assert window.picker.select(remote.path, 0)
    with qtbot.waitSignal(window.controller.model_loaded, timeout=60000) as loaded:
        qtbot.mouseClick(window.picker.load_btn, Qt.MouseButton.LeftButton)
    info = loaded.args[0]
    assert info.family == "remote" and info.context_length == 128
    # nanoscope serve gives ids and log-probabilities, so nothing is greyed out for their lack.
    assert info.capabilities.token_ids and info.capabilities.logprobs
    window.sampling.set_values({"temperature": 0.0, "max_tokens": 12})
    with qtbot.waitSignal(window.controller.reply_finished, timeout=60000) as done:
        window.input.editor.setPlainText("What is 12 times 7?")
        qtbot.keyClick(window.input.editor, Qt.Key.Key_Return)
    assert done.args[0]["new_tokens"] >= 1
    served = window.chat.widgets[-1].message
    assert served.plain_text()
    # The calculator's call reads as a tool call, not as special tokens' names in the text.
    assert {p.kind for p in served.parts} >= {"text", "python", "python_output"}
    assert "<|" not in served.plain_text()

    compare, view = window.compare, window.compare_view
    with qtbot.waitSignal(compare.pane_loaded, timeout=60000):
        compare.load(0, SFT, 20)
    with qtbot.waitSignal(compare.pane_loaded, timeout=60000):
        compare.load(1, remote.path, 0)
    assert compare.panes[1].info.family == "remote"
    view.set_sampling({"temperature": 0.7, "max_tokens": 16, "seed": 5})
    view.input.editor.setPlainText("What is 12 times 7?")
    with qtbot.waitSignal(compare.same_model_reported, timeout=60000) as reported:
        assert view.check_same_model()
    _a, _b, report = reported.args
    local_run, served_run = compare.panes[0].run, compare.panes[1].run
    assert report.compared_by == "ids"
    assert report.first_difference is None, report.summary("A", "B")
    assert local_run.trace.ids == served_run.trace.ids and len(local_run.trace.ids) >= 8
    assert local_run.reply.parts == served_run.reply.parts
    assert report.mean_abs_dlogprob is not None and report.mean_abs_dlogprob < 1e-4
    assert view.status.text() == report.summary("A", "B")
    assert view.status.text().startswith("Same 16 tokens (by token ids)")
