"""A served reply cannot outlast or outgrow its budgets, whatever the server sends: keep-alives do
not hold a stalled reply open, an endless line or a compressed body is refused, the body and the
whole reply have a ceiling, and an error answer is read only in part. Each ends in one line, with
the reply so far kept."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.openai_fault_server import Every, Reply, chat_chunk, error, sse
from test_remote_backend import chat, fault, open_fault, run, scripted, text_of  # noqa: F401 (fixture)

from desktop.engine.remote import sse as sse_module

WITHIN_S = 5.0  # every refusal here comes well within this


def reply_of(fault, reply: Reply, **options):  # noqa: F811
    fault.script = scripted(reply)
    backend = open_fault(fault, **options)
    try:
        started = time.monotonic()
        events, _stats, err = run(backend, chat("x"))
        return events, err, time.monotonic() - started
    finally:
        backend.close()


def test_keep_alives_do_not_reset_the_stall_timeout(fault):  # noqa: F811
    release = threading.Event()
    keep_alive = Every(0.05, sse("{}") + b": ping\n\n" + chat_chunk(None), release)
    try:
        events, err, elapsed = reply_of(fault, Reply(200, [chat_chunk("Once"), keep_alive]), stall=0.4)
    finally:
        release.set()
    assert err is not None and "no token for 0.4 s (stall timeout)" in err
    assert text_of(events) == "Once" and elapsed < WITHIN_S


def test_an_endless_line_is_refused(fault):  # noqa: F811
    endless = b"data: " + b"x" * (sse_module.MAX_LINE_BYTES + 1)
    events, err, elapsed = reply_of(fault, Reply(200, [chat_chunk("Once"), endless]))
    assert err is not None and err.endswith("sent a line longer than 1 MB")
    assert text_of(events) == "Once" and elapsed < WITHIN_S


def test_an_event_of_endless_data_lines_is_refused(fault):  # noqa: F811
    lines = b"data: " + b"y" * 1000 + b"\n"
    events, err, _ = reply_of(fault, Reply(200, [chat_chunk("Once"), lines * 1100]))
    assert err is not None and err.endswith("sent an event longer than 1 MB")
    assert text_of(events) == "Once"


def test_a_compressed_reply_is_refused_unread(fault):  # noqa: F811
    bomb = gzip.compress(chat_chunk("a") * 10_000)
    events, err, _ = reply_of(fault, Reply(200, [bomb], headers={"Content-Encoding": "gzip"}))
    assert err is not None and err.endswith("sent its reply compressed (gzip), unasked") and not events
    assert fault.requests[-1][2]["Accept-Encoding"] == "identity"


def test_the_body_has_a_ceiling(fault, monkeypatch):  # noqa: F811
    monkeypatch.setattr(sse_module, "MAX_BODY_BYTES", 1 << 20)
    padding = b": " + b"z" * 60_000 + b"\n\n"  # comments: not tokens, but bytes
    events, err, _ = reply_of(fault, Reply(200, [chat_chunk("Once"), *[padding] * 20]))
    assert err is not None and err.endswith("sent more than 1 MB for one reply")
    assert text_of(events) == "Once"


def test_the_whole_reply_has_a_deadline(fault, monkeypatch):  # noqa: F811
    monkeypatch.setattr(sse_module, "REPLY_DEADLINE_S", 0.5)
    release = threading.Event()
    trickle = Every(0.05, chat_chunk("x"), release)  # a token each time: never a stall
    try:
        events, err, elapsed = reply_of(fault, Reply(200, [trickle]))
    finally:
        release.set()
    assert err is not None and err.endswith("took longer than 0.5 s for one reply (reply deadline)")
    assert set(text_of(events)) == {"x"} and elapsed < WITHIN_S


@pytest.mark.parametrize("size", [10 << 20])
def test_an_error_answer_is_read_only_in_part(fault, size):  # noqa: F811
    def reply(body):
        return error(500, "boom " * (size // 5))

    fault.script = scripted(reply)
    backend = open_fault(fault)
    try:
        _events, _stats, err = run(backend, chat("x"))
    finally:
        backend.close()
    assert err is not None and "\n" not in err and len(err) < 1000 and "500" in err


def events_of(body: bytes, cuts: list[int]) -> list[str]:
    """event_data over ``body`` delivered in pieces cut at ``cuts``."""

    async def chunks():
        edges = [0, *sorted(c % (len(body) + 1) for c in cuts), len(body)]
        for a, b in itertools.pairwise(edges):
            yield body[a:b]

    async def collect():
        return [data async for data in sse_module.event_data(chunks())]

    return asyncio.run(collect())


BODY = (
    b'data: {"a": 1}\n\n'
    b": a comment\r\n\r\n"
    b"event: message\r\nid: 7\r\ndata: first line\r\ndata:second\r\n\r\n"
    b"data: \xe6\x97\xa5\n\n"
    b"retry: 10\n\n"
    b"data: cut before its blank line"
)


@given(st.lists(st.integers(0, len(BODY)), max_size=12))
def test_events_are_the_same_however_the_body_is_cut(cuts):
    assert events_of(BODY, cuts) == ['{"a": 1}', "first line\nsecond", "日"]
