"""ChatController against a fake backend: the sequences a user goes through (send, stop,
regenerate, edit, switch chats, fail, reload), on a real worker thread and a real SQLite store."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from support.fake_backend import FakeBackend, open_fake

from desktop.config import paths
from desktop.config.settings import Settings
from desktop.engine.backend import Capabilities
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message
from desktop.engine.params import SamplingParams
from desktop.qt.chat.controller import ChatController
from desktop.qt.chat.message_footer import format_stats
from desktop.qt.model.slot import ModelSlot
from desktop.store import HistoryStore

pytestmark = pytest.mark.gui
WAIT = 10000
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


@pytest.fixture
def chat(qtbot, tmp_path):
    paths.set_home(tmp_path)
    settings = Settings(tmp_path / "settings.json")
    store = HistoryStore(tmp_path / "history.sqlite3")
    controller = ChatController(store, settings, ModelSlot(settings, opener=open_fake))
    FakeBackend.gate.set()
    yield controller
    FakeBackend.gate.set()
    controller.shutdown()
    store.close()
    paths.set_home(None)


def load(qtbot, c: ChatController, name: str = "m") -> None:
    with qtbot.waitSignal(c.model_loaded, timeout=WAIT):
        c.load_checkpoint(Path("/fake") / name, 7)


def send(qtbot, c: ChatController, text: str, params: SamplingParams = GREEDY) -> dict:
    with qtbot.waitSignal(c.reply_finished, timeout=WAIT) as done:
        assert c.send(text, params)
    return done.args[0]


def test_send_streams_into_the_reply_the_view_renders_and_saves_it(qtbot, chat):
    load(qtbot, chat)
    started, events = [], []
    chat.reply_started.connect(lambda message, siblings: started.append((message, siblings)))
    chat.reply_event.connect(events.append)
    stats = send(qtbot, chat, "hello calc")
    ((reply, siblings),) = started
    assert siblings == (0, 1)
    assert reply is chat.path[-1][1]  # one object: the controller fills it, the view renders it
    assert [p.kind for p in reply.parts] == [TEXT, PYTHON, PYTHON_OUTPUT]
    assert reply.parts[0].text == "echo: hello calc" and reply.parts[2].text == "42"
    assert reply.tokens.ids == [ev.id for ev in events] and stats["new_tokens"] == len(events)
    assert reply.meta["sampling"] == GREEDY.to_dict() and reply.meta["step"] == 7
    stored = chat.store.active_path(chat.conv_id)
    assert [m.role for _, m in stored] == ["user", "assistant"]
    assert stored[1][1].parts == reply.parts and stored[1][1].tokens == reply.tokens
    assert chat.store.is_complete(stored[1][0])


def test_regenerate_shows_each_new_branch_at_once(qtbot, chat):
    load(qtbot, chat)
    send(qtbot, chat, "hi")
    places = []
    chat.reply_started.connect(lambda _m, siblings: places.append(siblings))
    for _ in range(3):
        with qtbot.waitSignal(chat.reply_finished, timeout=WAIT):
            chat.regenerate(1, GREEDY)
    assert places == [(1, 2), (2, 3), (3, 4)]
    # Switching back to the first branch shows it, and the conversation still has two messages.
    shown = []
    chat.conversation_changed.connect(lambda messages, siblings: shown.append(siblings))
    chat.switch_branch(1, -3)
    assert shown[-1] == [(0, 1), (0, 4)] and len(chat.path) == 2


def test_edit_and_resend_answers_the_new_text(qtbot, chat):
    load(qtbot, chat)
    send(qtbot, chat, "first")
    with qtbot.waitSignal(chat.reply_finished, timeout=WAIT):
        chat.edit_and_resend(0, "second", GREEDY)
    assert [m.plain_text() for _, m in chat.path] == ["second", "echo: second"]


def test_stop_keeps_the_partial_reply(qtbot, chat):
    load(qtbot, chat)
    FakeBackend.gate.clear()
    with qtbot.waitSignal(chat.reply_finished, timeout=WAIT) as done:
        assert chat.send("slow down", GREEDY)
        chat.stop()
        FakeBackend.gate.set()
    assert done.args[0]["stopped"] == "cancelled"
    assert not chat.busy
    reply = chat.path[-1][1]
    assert reply.role == "assistant" and len(reply.tokens) == done.args[0]["new_tokens"]


def test_a_failing_reply_keeps_its_text_and_the_next_one_works(qtbot, chat):
    load(qtbot, chat)
    notices = []
    chat.notice.connect(lambda level, title, message: notices.append((level, message)))
    stats = send(qtbot, chat, "fail please")
    assert stats == {"error": "RuntimeError: the fake model broke down"}
    assert chat.path[-1][1].plain_text() == "ec" and ("error", stats["error"]) in notices
    assert send(qtbot, chat, "again")["new_tokens"] > 0
    assert chat.path[-1][1].plain_text() == "echo: again"


def test_switching_chats_mid_reply_keeps_each_reply_in_its_own_chat(qtbot, chat):
    load(qtbot, chat)
    send(qtbot, chat, "one")
    first = chat.conv_id
    FakeBackend.gate.clear()
    with qtbot.waitSignal(chat.reply_finished, timeout=WAIT):
        chat.new_chat()  # nothing streaming: no reply to finish yet
        assert chat.send("slow two", GREEDY)
        chat.open_conversation(first)  # stops the reply in flight
        FakeBackend.gate.set()
    assert chat.conv_id == first and [m.plain_text() for _, m in chat.path] == ["one", "echo: one"]
    second = next(r.id for r in chat.store.list_conversations() if r.id != first)
    replies = [m for _, m in chat.store.active_path(second) if m.role == "assistant"]
    assert len(replies) == 1 and "echo: slow two".startswith(replies[0].plain_text())


def test_nothing_is_sent_without_a_model(qtbot, chat):
    notices = []
    chat.notice.connect(lambda level, title, message: notices.append(title))
    assert not chat.send("anyone?", GREEDY)
    assert notices == ["No model loaded"] and chat.store.list_conversations() == []


def test_a_failed_load_keeps_the_model_that_was_loaded(qtbot, chat):
    load(qtbot, chat, "good")
    with qtbot.waitSignal(chat.model_load_failed, timeout=WAIT) as failed:
        chat.load_checkpoint(Path("/fake/broken"), 1)
    assert "truncated or corrupt" in failed.args[1]
    assert chat.model_info is not None and chat.model_info.tag == "good"
    assert send(qtbot, chat, "still there")["new_tokens"] > 0


def test_old_turns_are_dropped_to_fit_and_the_user_is_told(qtbot, chat):
    load(qtbot, chat)
    notices, contexts = [], []
    chat.notice.connect(lambda level, title, message: notices.append(title))
    chat.context_changed.connect(lambda used, total: contexts.append((used, total)))
    for i in range(6):
        send(qtbot, chat, f"message number {i} " + "x" * 20)
    assert "Context full" in notices
    assert all(total == 200 and used <= 200 for used, total in contexts)


def test_the_raw_token_labels_come_from_the_reply(qtbot, chat):
    load(qtbot, chat)
    send(qtbot, chat, "calc")
    reply: Message = chat.path[-1][1]
    labels = reply.tokens.labels()
    assert "<|python_start|>" in labels and "".join(labels[: len("echo: calc")]) == "echo: calc"


def test_a_run_without_its_training_toml_asks_for_one_and_remembers_it(qtbot, tmp_path):
    """KempnerForge keeps the model config in the training TOML: the slot asks for it, loads with
    the one picked, and uses it again next time without asking."""
    from desktop.engine.errors import CheckpointError
    from desktop.engine.kempnerforge.config import NO_TOML

    seen_configs: list[Path | None] = []

    def open_run(target, options, progress):
        seen_configs.append(options.config)
        if options.config is None:
            raise CheckpointError(f"{target}: {NO_TOML}; none found in {target}")
        backend = FakeBackend(target, options)
        backend._info = replace(backend._info, family="kempnerforge")
        return backend

    paths.set_home(tmp_path)
    try:
        settings = Settings(tmp_path / "settings.json")
        slot = ModelSlot(settings, opener=open_run)
        run, toml = tmp_path / "run", tmp_path / "train.toml"
        toml.write_text("[model]\n")
        with qtbot.waitSignal(slot.config_needed, timeout=WAIT) as asked:
            slot.load(run, 3)
        assert asked.args == [str(run), 3]
        with qtbot.waitSignal(slot.loaded, timeout=WAIT):
            slot.load(run, 3, toml)
        again = ModelSlot(settings, opener=open_run)  # a later session
        with qtbot.waitSignal(again.loaded, timeout=WAIT):
            again.load(run, 3)
        assert seen_configs == [None, toml, toml]
        slot.shutdown()
        again.shutdown()
    finally:
        paths.set_home(None)


def test_a_draft_chosen_for_a_model_that_cannot_draft_here_is_named_as_not_used(qtbot, tmp_path):
    """A served model drafts on its server, if at all: a reply with a draft chosen in Chat streams
    without one, and its meta (saved, and what the footer shows) says why."""
    why = "speculative decoding runs on the server, not here"

    def open_served(target: Path, options, progress) -> FakeBackend:
        backend = open_fake(target, options, progress)
        backend._info = replace(backend._info, capabilities=Capabilities(unavailable=(("draft", why),)))
        return backend

    paths.set_home(tmp_path)
    settings = Settings(tmp_path / "settings.json")
    settings.set("draft", "int8")
    store = HistoryStore(tmp_path / "history.sqlite3")
    c = ChatController(store, settings, ModelSlot(settings, opener=open_served))
    try:
        load(qtbot, c)
        send(qtbot, c, "hi")
        reply = c.path[-1][1]
        assert "draft" not in reply.meta and reply.meta["draft_skipped"] == f"draft not used: {why}"
        assert f"draft not used: {why}" in format_stats(reply.meta)[0]
        saved = store.active_path(c.conv_id)[-1][1]
        assert saved.meta["draft_skipped"] == reply.meta["draft_skipped"]
    finally:
        c.shutdown()
        store.close()
        paths.set_home(None)
