"""The Chat screen's conversation without Qt: a reply streams token by token into the path, new
versions get their place among the old ones, a fork or a continuation keeps its start while it
streams, the context counter and the speed move with the tokens, and opening another
conversation replaces what was shown."""

from __future__ import annotations

import pytest

from desktop.engine.messages import TEXT, Message, TokenEvent
from desktop.session.compare.pane_run import Fork, fork_of
from desktop.session.conversation import (
    SPEED_EVERY_S,
    ConversationSession,
    continuation,
    refork,
    reply_message,
)
from desktop.store import HistoryStore, StreamingWriter


class Clock:
    """Seconds the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path) -> HistoryStore:
    return HistoryStore(tmp_path / "history.db")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def session(store, clock) -> ConversationSession:
    return ConversationSession(store, clock)


def record(session: ConversationSession) -> dict[str, list]:
    """Every event the session emits, by name, with its arguments."""
    seen: dict[str, list] = {name: [] for name in session.events.names()}
    for name in seen:
        getattr(session.events, name).connect(lambda *args, name=name: seen[name].append(args))
    return seen


def token(text: str, given: bool = False) -> TokenEvent:
    return TokenEvent(ord(text[0]), text, False, TEXT, given=given)


def ask(session: ConversationSession, store: HistoryStore, text: str) -> None:
    """The user's message, stored and put on the path (as the controller does on send)."""
    if session.conv_id is None:
        session.conv_id = store.create_conversation(text)
    parent = session.path[-1][0] if session.path else None
    user = Message.of_text("user", text)
    session.add(store.add_message(session.conv_id, user, parent), user)


def begin(session: ConversationSession, store: HistoryStore, meta: dict | None = None, said=()) -> Message:
    """A reply stored after the path and streaming (as the controller starts one)."""
    assert session.conv_id is not None
    reply = reply_message(dict(meta or {}), said)
    parent = session.path[-1][0] if session.path else None
    session.begin_reply(store.add_message(session.conv_id, reply, parent, complete=False), reply)
    return reply


def stream(
    session: ConversationSession, store: HistoryStore, text: str, prompt: int = 10, stats: dict | None = None
) -> None:
    """The model's prompt, then ``text`` one character a token, then the end, saved."""
    session.set_prompt(prompt, 100)
    for c in text:
        session.add_token(token(c))
    reply, reply_id = session.reply, session.reply_id
    assert reply is not None and reply_id is not None
    stats = stats or {"prompt_tokens": prompt + session.kept, "new_tokens": len(reply.tokens) - session.kept}
    reply.meta["stats"] = stats
    StreamingWriter(store, reply_id).finish(reply)
    session.finish_reply(stats)


def test_send_streams_tokens_into_the_reply_then_it_joins_the_path(session, store):
    seen = record(session)
    ask(session, store, "hello")
    reply = begin(session, store)
    assert seen["reply_started"] == [(reply, (0, 1))]
    assert seen["changed"][-1] == ([session.path[0][1]], [(0, 1)])  # the path before the reply
    session.set_prompt(7, 100)
    for c in "hi!":
        session.add_token(token(c))
    assert reply.plain_text() == "hi!" and session.streaming
    assert [args[0].text for args in seen["reply_token"]] == ["h", "i", "!"]
    session.finish_reply({"prompt_tokens": 7, "new_tokens": 3})
    assert not session.streaming and session.path[-1][1] is reply
    assert [m.role for m in session.messages] == ["user", "assistant"]
    assert session.places == [(0, 1), (0, 1)]
    assert seen["reply_finished"] == [({"prompt_tokens": 7, "new_tokens": 3},)]
    assert session.context_used() == (10, 100)
    session.add_token(token("x"))  # a late token of the finished reply
    assert reply.plain_text() == "hi!"


def test_a_regeneration_is_version_two_of_two_and_switching_back_shows_one_of_two(session, store):
    ask(session, store, "hello")
    first = begin(session, store)
    stream(session, store, "one")
    seen = record(session)
    session.cut(1)  # regenerate the reply at 1
    second = begin(session, store)
    assert seen["reply_started"] == [(second, (1, 2))]
    stream(session, store, "two")
    assert session.places[-1] == (1, 2) and session.messages[-1] is second

    assert session.switch_branch(1, -1)
    assert session.places == [(0, 1), (0, 2)]
    assert session.messages[-1].plain_text() == first.plain_text() == "one"
    assert seen["changed"][-1] == (session.messages, [(0, 1), (0, 2)])
    assert not session.switch_branch(1, -1)  # there is no version before the first
    assert session.switch_branch(1, +1) and session.messages[-1].plain_text() == "two"


def test_a_fork_keeps_the_start_and_the_given_token_while_it_streams(session, store):
    ask(session, store, "hello")
    begin(session, store)
    stream(session, store, "abcdef")
    original = session.messages[-1]
    fork = fork_of(original.tokens, 3, ord("X"), "X", "chars")
    assert isinstance(fork, Fork)
    seen = record(session)
    session.cut(1)
    reply = begin(session, store, {"fork": {"from": session.path[0][0], "at": 3}}, fork.said)
    assert session.kept == 3 and reply.plain_text() == "abc"  # shown before any token arrives
    assert seen["reply_started"] == [(reply, (1, 2))]
    session.set_prompt(10, 100)
    session.add_token(token("X", given=True))
    assert reply.plain_text() == "abcX" and reply.tokens.given == [False, False, False, True]
    session.add_token(token("y"))
    assert reply.plain_text() == "abcXy"
    assert seen["context"][-1] == (10 + 5, 100)  # the prompt, the kept start, the given and new tokens
    # Regenerating the fork starts from the same point with the same choice.
    session.finish_reply({"prompt_tokens": 13, "new_tokens": 2})
    again = refork(session.path[-1][0], reply)
    assert again is not None
    start, where = again
    assert start.said_text == "abc" and start.given_text == "X" and where["at"] == 3


def test_a_continuation_keeps_all_it_said_while_it_goes_on(session, store):
    ask(session, store, "tell me")
    begin(session, store)
    stream(session, store, "once", stats={"prompt_tokens": 9, "new_tokens": 4, "stopped": "max_tokens"})
    reply_id, cut = session.path[-1]
    start, said, where = continuation(reply_id, cut)
    assert start.said_text == "once" and where == {"from": reply_id, "at": 4, "continued": True}
    seen = record(session)
    session.cut(1)
    longer = begin(session, store, {"fork": where}, said)
    assert longer.plain_text() == "once" and session.kept == 4
    session.set_prompt(9, 100)
    assert seen["context"][-1] == (9 + 4, 100)  # the kept start counts from the first moment
    for c in " upon":
        session.add_token(token(c))
        assert longer.plain_text().startswith("once")
    assert longer.plain_text() == "once upon"
    assert [used for used, _ in seen["context"][-5:]] == [14, 15, 16, 17, 18]


def test_the_context_used_moves_with_each_token(session, store):
    seen = record(session)
    ask(session, store, "hello")
    begin(session, store)
    session.set_prompt(20, 100)
    for c in "abcd":
        session.add_token(token(c))
    assert [args for args in seen["context"][-5:]] == [(20, 100), (21, 100), (22, 100), (23, 100), (24, 100)]


def test_the_speed_is_measured_while_the_reply_streams_a_few_times_a_second(session, store, clock):
    seen = record(session)
    ask(session, store, "hello")
    begin(session, store)
    session.set_prompt(5, 100)
    clock.now += 0.5  # the prompt's processing
    session.add_token(token("a"))
    assert seen["speed"] == []  # one token is no rate yet
    clock.now += 0.1
    session.add_token(token("b"))
    assert seen["speed"] == [(pytest.approx(10.0), pytest.approx(500.0))]
    clock.now += 0.1
    session.add_token(token("c"))  # too soon after the last report
    assert len(seen["speed"]) == 1
    clock.now += SPEED_EVERY_S
    session.add_token(token("d"))
    assert seen["speed"][-1] == (pytest.approx(3 / (0.2 + SPEED_EVERY_S)), pytest.approx(500.0))


def test_opening_another_conversation_replaces_its_messages(session, store):
    ask(session, store, "first chat")
    begin(session, store)
    stream(session, store, "one")
    first = session.conv_id
    session.new()
    assert session.messages == [] and session.context_used() == (0, 100)  # the model stays
    ask(session, store, "second chat")
    begin(session, store)
    stream(session, store, "two")
    second = session.conv_id
    seen = record(session)
    session.open(first)
    assert [m.plain_text() for m in session.messages] == ["first chat", "one"]
    assert seen["changed"] == [(session.messages, [(0, 1), (0, 1)])]
    session.open(second)
    assert [m.plain_text() for m in session.messages] == ["second chat", "two"]
    assert session.conv_id == second
