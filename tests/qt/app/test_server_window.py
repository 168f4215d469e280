"""File › Serve over the OpenAI API…, through the real window: the user chats, opens the Server
panel, serves Chat's model, a client (the ``openai`` package) asks the same question and gets the
same greedy reply, the request appears in the panel and the status bar, Stop ends it, and a port
already taken is one line while the app keeps chatting."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from support.golden import GOLDEN
from support.window import WAIT, action, send, start_with_base

from desktop.session.serving import FAILED, OFF, SERVING

pytestmark = pytest.mark.gui
E7 = GOLDEN / "nanochat" / "E7"
QUESTION = "What is 12 times 7?"


def test_serve_chats_model_answer_a_client_show_the_request_then_stop(qtbot, windows, monkeypatch):
    win = start_with_base(qtbot, windows, monkeypatch, E7, fake=False)
    win.sampling.set_values({"temperature": 0.0, "max_tokens": 16})
    send(qtbot, win, QUESTION)
    chat_reply = win.chat.widgets[-1].message

    action(win, "Serve over the OpenAI API…").trigger()
    panel = win.server_panel
    assert panel is not None and panel.isVisible()
    assert panel.checkpoint.currentText().startswith("Chat's model: ")
    panel.port.setValue(0)  # any free port: the address tells which
    qtbot.mouseClick(panel.switch, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: win.serving.state in (SERVING, FAILED), timeout=WAIT)
    assert win.serving.state == SERVING, win.serving.error
    url = panel.url.text()
    assert url == win.serving.url and url.startswith("http://127.0.0.1:")
    qtbot.mouseClick(panel.copy_btn, Qt.MouseButton.LeftButton)
    assert QApplication.clipboard().text() == url
    assert not win.serving_label.isHidden() and url in win.serving_label.text()
    assert not panel.checkpoint.isEnabled()  # what serves cannot change under it

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=16,
        extra_body={"return_token_ids": True},
    )
    # The same model, the same greedy question: the same tokens as Chat's reply.
    assert answer.choices[0].model_extra["token_ids"] == chat_reply.tokens.ids
    assert chat_reply.plain_text().startswith(answer.choices[0].message.content.split("<|")[0])
    qtbot.waitUntil(lambda: panel.table.rowCount() >= 2, timeout=WAIT)  # /v1/models, then the chat
    row = panel.table.rowCount() - 1
    assert panel.table.item(row, 2).text() == "POST /v1/chat/completions"
    assert panel.table.item(row, 3).text() == "200"
    assert int(panel.table.item(row, 5).text()) == answer.usage.completion_tokens
    assert "2 requests" in panel.status.text()

    qtbot.mouseClick(panel.switch, Qt.MouseButton.LeftButton)  # Stop serving
    qtbot.waitUntil(lambda: win.serving.state == OFF, timeout=WAIT)
    assert win.serving_label.isHidden() and panel.url.text() == ""
    with pytest.raises(httpx.TransportError):
        httpx.get(url.removesuffix("/v1") + "/health", timeout=5)
    assert send(qtbot, win, "and again")["new_tokens"] >= 1  # Chat's own model was never touched


def test_a_port_in_use_is_one_line_and_the_app_keeps_chatting(qtbot, windows, monkeypatch):
    win = start_with_base(qtbot, windows, monkeypatch, E7, fake=False)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        panel = win.open_server_panel()
        panel.port.setValue(taken.getsockname()[1])
        qtbot.mouseClick(panel.switch, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: win.serving.state == FAILED, timeout=WAIT)
    finally:
        taken.close()
    text = panel.status.text()
    assert text.startswith("Not serving: cannot serve on 127.0.0.1:") and "\n" not in text
    assert not panel.switch.isChecked() and panel.checkpoint.isEnabled()
    assert send(qtbot, win, "hello")["new_tokens"] >= 1


def test_serve_an_earlier_step_of_a_run(qtbot, windows, monkeypatch, nanochat_base):
    """The panel offers each checkpoint's steps, the latest first; the one picked is what serves."""
    win = start_with_base(qtbot, windows, monkeypatch, nanochat_base, fake=False)
    panel = win.open_server_panel()
    run = panel.checkpoint.findText("sft/d4")
    assert run >= 0
    panel.checkpoint.setCurrentIndex(run)
    assert [panel.step.itemText(i) for i in range(panel.step.count())] == ["step 20", "step 10"]
    panel.step.setCurrentIndex(1)
    panel.port.setValue(0)
    qtbot.mouseClick(panel.switch, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: win.serving.state in (SERVING, FAILED), timeout=WAIT)
    assert win.serving.state == SERVING, win.serving.error
    assert win.serving.model_id == "sft/d4@10"
    models = httpx.get(f"{win.serving.url}/models", timeout=30).json()["data"]
    assert [m["id"] for m in models] == ["sft/d4@10"]
    assert not panel.step.isEnabled()
    qtbot.mouseClick(panel.switch, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: win.serving.state == OFF, timeout=WAIT)
