"""Served replies whose events hold what no real server writes, and a model list that trickles:
each ends in one readable line or the bad field is left out (the reply still reads), never a
crash, and ``GET /v1/models`` keeps one deadline for the whole request, however the server
spreads its bytes."""

from __future__ import annotations

import json
import threading
import time

import pytest
from support.openai_fault_server import Every, Reply, chat_chunk, models, sse
from test_remote_backend import chat, fault, open_fault, run, scripted, text_of  # noqa: F401 (fixture)

from desktop.cli.main import main
from desktop.engine.remote import http
from desktop.engine.remote.http import RemoteError, list_models

DEADLINE_S = 2.0  # the model list's deadline in these tests
MARGIN_S = 4.0  # generous: a loaded machine may be slow to notice the deadline, never 10 s late
TRICKLE_S = 0.1  # between two bytes: far inside any per-read timeout


def reply_of(fault, pieces: list[bytes], top: int = 0):  # noqa: F811
    fault.script = scripted(Reply(200, [*pieces, chat_chunk(None, "stop"), sse("[DONE]")]))
    backend = open_fault(fault)
    try:
        return run(backend, chat("x"), top=top)
    finally:
        backend.close()


def entry(token: str, logprob: object, alternatives: list[dict] | None = None) -> dict:
    return {"token": token, "logprob": logprob, "top_logprobs": alternatives or []}


def test_an_event_nested_past_the_recursion_limit_is_one_line(fault):  # noqa: F811
    deep = sse('{"choices": ' + "[" * 200_000 + "]" * 200_000 + "}")
    events, _stats, err = reply_of(fault, [chat_chunk("Hi"), deep])
    assert err is not None and "\n" not in err
    assert "sent a malformed event (nested deeper than 64 levels)" in err
    assert text_of(events) == "Hi"  # what came before is kept


def test_an_integer_log_probability_too_large_for_a_float_is_left_out(fault):  # noqa: F811
    huge = 10**400  # json.dumps writes it digit by digit; float() of it overflows
    pieces = [
        chat_chunk("A", logprobs={"content": [entry("A", huge)]}),
        chat_chunk("B", logprobs={"content": [entry("B", -0.5, [{"token": "B", "logprob": huge}])]}),
    ]
    events, _stats, err = reply_of(fault, pieces, top=2)
    assert err is None and text_of(events) == "AB"
    shown = [(e.text, e.logprob, e.top) for e in events if e.text]
    assert shown == [("A", None, None), ("B", -0.5, ())]


@pytest.mark.parametrize(
    "ids",
    [["5"], ["x"], [1.5], [True], [-1], [2**40], [float("inf")], [10**400]],
    ids=["digits-as-text", "text", "float", "bool", "negative", "past-any-vocabulary", "Infinity", "huge"],
)
def test_token_ids_that_are_not_integers_are_left_out(fault, ids):  # noqa: F811
    pieces = [chat_chunk("Hi", token_ids=ids), chat_chunk(" there", token_ids=[7])]
    events, _stats, err = reply_of(fault, pieces)
    assert err is None and text_of(events) == "Hi there"
    assert [(e.text, e.id) for e in events if e.text] == [("Hi", -1), (" there", 7)]


def test_prompt_ids_of_infinity_and_usage_past_any_count_are_left_out(fault):  # noqa: F811
    pieces = [
        chat_chunk("Hi", prompt_token_ids=[float("inf"), float("nan")]),
        chat_chunk(None, usage={"prompt_tokens": float("inf"), "completion_tokens": 10**400}),
    ]
    events, stats, err = reply_of(fault, pieces)
    assert err is None and text_of(events) == "Hi"
    assert stats.new_tokens < 10 and stats.prompt_tokens < 10**6  # the client's own counts


def test_text_where_numbers_belong_in_completion_logprobs_is_left_out(fault):  # noqa: F811
    lp = {"tokens": ["A", "B"], "token_logprobs": ["-0.1", -0.2], "top_logprobs": [None, {"B": "x", "C": -1}]}
    events, _stats, err = reply_of(fault, [chat_chunk("AB", logprobs=lp)], top=2)
    assert err is None and text_of(events) == "AB"
    assert [(e.logprob, e.top) for e in events if e.text][-1] == (-0.2, ((-1, "C", -1.0),))


# ----- the model list keeps one deadline for the whole request -----------------------------------


def _takes(call) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        call()
    return str(caught.value), time.monotonic() - started


def test_a_model_list_whose_headers_trickle_is_given_up_at_the_deadline(fault):  # noqa: F811
    # ~130 bytes of status line and headers at one every TRICKLE_S: ~13 s, and never a pause long
    # enough for a per-read timeout. The whole request still ends at its deadline.
    fault.script = lambda path, body: Reply(200, [b"{}"], trickle=TRICKLE_S)
    said, took = _takes(lambda: list_models(fault.url, timeout=DEADLINE_S))
    assert "did not answer /v1/models within 2 s" in said and "\n" not in said
    assert DEADLINE_S - 0.5 <= took <= DEADLINE_S + MARGIN_S


def test_a_model_list_whose_body_trickles_is_given_up_at_the_deadline(fault):  # noqa: F811
    release = threading.Event()
    fault.script = lambda path, body: Reply(200, [b'{"data": [', Every(TRICKLE_S, b" ", release)])
    try:
        said, took = _takes(lambda: list_models(fault.url, timeout=DEADLINE_S))
    finally:
        release.set()
    assert "did not answer /v1/models within 2 s" in said
    assert DEADLINE_S - 0.5 <= took <= DEADLINE_S + MARGIN_S


def test_nanoscope_list_server_keeps_the_documented_deadline(fault, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr(http, "LIST_TIMEOUT_S", DEADLINE_S)  # the documented 15 s, shortened
    fault.script = lambda path, body: Reply(200, [b"{}"], trickle=TRICKLE_S)
    started = time.monotonic()
    code = main(["list", "--server", fault.url])
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "within 2 s" in err
    assert took <= DEADLINE_S + MARGIN_S


def test_a_model_list_that_answers_in_time_is_read_whole(fault):  # noqa: F811
    names = [f"model-{i}" for i in range(50)]
    fault.script = lambda path, body: models(*names)
    assert [m.name for m in list_models(fault.url, timeout=DEADLINE_S)] == names
    doc = json.dumps({"data": [{"id": "slow", "max_model_len": 4096}]}).encode()
    fault.script = lambda path, body: Reply(200, [doc[:10], doc[10:]], content_type="application/json")
    assert [(m.name, m.context_length) for m in list_models(fault.url)] == [("slow", 4096)]
