"""Hostile requests to ``nanoscope serve``, over raw HTTP (httpx, and plain sockets where a client
misbehaves below HTTP's level): oversized bodies, bad JSON, huge or negative or non-finite values,
stop lists of 10,000 strings, prompts outside the vocabulary or past the context, other models,
unknown routes, missing keys, slow clients, deadlines, disconnects mid-reply and 100 connections
at once. Each gets one OpenAI-style error (a 4xx, or 429/504 where that is the rule) whose message
is one readable line, never a traceback or a 500, and the server serves the next request.

The server is nanochat's golden E7 SFT checkpoint (context 128, vocabulary 300), one per test.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.golden import GOLDEN
from support.serving import Serving, serving

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.serve import wire
from desktop.engine.serve.app import ServeSettings
from desktop.engine.serve.host import ModelHost
from desktop.engine.serve.server import Server

E7 = GOLDEN / "nanochat" / "E7"
CHECKPOINT = E7 / "chatsft_checkpoints" / "d2"
CONTEXT = 128  # E7's sequence length
VOCAB = 300
HTTP_TIMEOUT_S = 60.0  # an answer this late is a hang
SETTLE_S = 20.0  # time for a cancelled generation to end (LONG would take minutes)
USER = [{"role": "user", "content": "hi"}]
# 128 choices of up to 125 tokens each at a temperature that rarely stops: a minute or more of
# generation on this machine, so a deadline or a disconnect ends it long before it would end.
LONG = {"prompt": ["hi"] * 64, "n": 2, "max_tokens": 1000, "temperature": 100.0, "seed": 1}


def options() -> LoadOptions:
    return LoadOptions(device="cpu", base_dir=E7)


@pytest.fixture
def served() -> Iterator[Serving]:
    with serving(CHECKPOINT, options()) as s:
        yield s


# ----- helpers -------------------------------------------------------------------------------------


def client() -> httpx.Client:
    """A client of its own for each request (no connection kept between servers), with no
    certificates to load (plain HTTP): a few hundred of these cost milliseconds, not seconds."""
    return httpx.Client(verify=False, timeout=HTTP_TIMEOUT_S)


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    with client() as c:
        return c.request(method, url, **kwargs)


def post(s: Serving, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    """``body`` (bytes as they are, anything else as JSON) to ``path`` under the server's root."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"content-type": "application/json", **(headers or {})}
    return request("POST", s.root + path, content=content, headers=sent)


def check_error_body(body: Any, status: int) -> None:
    """``body`` is one OpenAI-style error for ``status``, its message one readable line."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    message = error["message"]
    assert isinstance(message, str) and message.strip(), error
    assert "\n" not in message and "Traceback" not in message, message
    assert len(message) <= wire.ERROR_CHARS, message
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] == status, error


def assert_one_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    check_error_body(body, status)
    return body["error"]


def assert_still_serves(s: Serving, headers: dict[str, str] | None = None) -> None:
    """Healthy, and a small real completion is answered."""
    assert health(s)["status"] == "ok"
    r = post(
        s, "/v1/completions", {"model": s.model, "prompt": "The cat", "max_tokens": 2, "seed": 0}, headers
    )
    assert r.status_code == 200, r.text[:500]
    body = r.json()
    assert len(body["choices"]) == 1 and body["usage"]["completion_tokens"] <= 2, body


def health(s: Serving) -> dict[str, Any]:
    return request("GET", s.root + "/health").json()


def wait_until(check: Callable[[], bool], within_s: float, what: str) -> None:
    """Polls ``check`` (each call a request to the server, no sleep) until it holds."""
    end = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < end, f"{what} did not happen within {within_s:g} s"


def port_of(s: Serving) -> int:
    return int(s.root.rsplit(":", 1)[1])


def connect(s: Serving, timeout_s: float = HTTP_TIMEOUT_S) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port_of(s)), timeout=timeout_s)


def request_head(path: str, length: int | None) -> bytes:
    """A POST's head: with a Content-Length of ``length``, or chunked when it is None."""
    sized = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n{sized}\r\n".encode()


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of one HTTP response with a Content-Length (what every error has)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {name.strip().lower(): value.strip() for name, _, value in (x.partition(":") for x in lines[1:])}
    length = int(fields["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection in the middle of its answer"
        body += chunk
    return int(lines[0].split()[1]), body[:length]


def dechunk(body: bytes) -> bytes:
    """A body in HTTP's chunked transfer coding, decoded."""
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return out
        out, body = out + body[:size], body[size + 2 :]


def sse_events(response: httpx.Response) -> list[Any]:
    """A stream's events: each data line's JSON, and "[DONE]" as it is."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# ----- request bodies that the server refuses -------------------------------------------------------

C, CHAT, TOKENIZE, DETOKENIZE = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
TOO_LONG_IDS = [104, 105, 32] * 60  # 180 ids of the vocabulary: past the context of 128

REFUSED: dict[str, list[tuple[str, str, Any, int]]] = {
    "bad JSON": [
        ("invalid JSON", C, b'{"prompt": "hi", "max_tokens": ', 400),
        ("empty body", C, b"", 400),
        ("bytes that are not UTF-8", C, b'{"prompt": "\xff\xfe"}', 400),
        ("a lone surrogate", C, b'{"prompt": "hi \\ud800"}', 400),
        ("a list, not an object", C, b"[1, 2, 3]", 400),
        ("null", CHAT, b"null", 400),
        ("no prompt", C, {"max_tokens": 2}, 400),
        ("no messages", CHAT, {"max_tokens": 2}, 400),
        ("a nested prompt", C, {"prompt": [[["hi"]]]}, 400),
        (
            "JSON nested past any parser's depth",
            C,
            b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            400,
        ),
    ],
    "NaN and Infinity": [
        ("NaN temperature", C, b'{"prompt": "hi", "temperature": NaN}', 400),
        ("Infinity top_p", C, b'{"prompt": "hi", "top_p": Infinity}', 400),
        ("-Infinity seed", C, b'{"prompt": "hi", "seed": -Infinity}', 400),
        ("NaN in chat", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "min_p": NaN}', 400),
        ("a float that overflows", C, b'{"prompt": "hi", "temperature": 1e400}', 400),
    ],
    "huge values": [
        ("n over MAX_N", C, {"prompt": "hi", "n": wire.MAX_N + 1}, 400),
        ("n of 10**30", CHAT, {"messages": USER, "n": 10**30}, 400),
        ("prompts × n over MAX_CHOICES", C, {"prompt": ["hi"] * wire.MAX_PROMPTS, "n": wire.MAX_N}, 400),
        ("prompts over MAX_PROMPTS", C, {"prompt": ["hi"] * (wire.MAX_PROMPTS + 1)}, 400),
        ("max_tokens over MAX_TOKENS", C, {"prompt": "hi", "max_tokens": wire.MAX_TOKENS + 1}, 400),
        ("max_tokens of 10**100", C, {"prompt": "hi", "max_tokens": 10**100}, 400),
        (
            "max_completion_tokens over MAX_TOKENS",
            CHAT,
            {"messages": USER, "max_completion_tokens": 2**40},
            400,
        ),
        ("logprobs over 20", C, {"prompt": "hi", "logprobs": wire.MAX_TOP_LOGPROBS + 1}, 400),
        ("logprobs of 10**9", C, {"prompt": "hi", "logprobs": 10**9}, 400),
        ("top_logprobs over 20", CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 21}, 400),
        ("seed past SEED_MAX", C, {"prompt": "hi", "seed": 2**70}, 400),
        ("1025 messages", CHAT, {"messages": USER * (wire.MAX_MESSAGES + 1)}, 400),
        ("a model name of 100 KB", C, {"prompt": "hi", "model": "m" * 100_000}, 400),
    ],
    "negative and out-of-range values": [
        ("negative max_tokens", C, {"prompt": "hi", "max_tokens": -1}, 400),
        ("negative max_completion_tokens", CHAT, {"messages": USER, "max_completion_tokens": -5}, 400),
        ("negative temperature", C, {"prompt": "hi", "temperature": -0.5}, 400),
        ("negative seed", C, {"prompt": "hi", "seed": -1}, 400),
        ("negative n", C, {"prompt": "hi", "n": -1}, 400),
        ("n of 0", CHAT, {"messages": USER, "n": 0}, 400),
        ("negative logprobs", C, {"prompt": "hi", "logprobs": -1}, 400),
        ("top_p 0", C, {"prompt": "hi", "top_p": 0}, 400),
        ("top_p over 1", CHAT, {"messages": USER, "top_p": 1.5}, 400),
        ("top_k under -1", C, {"prompt": "hi", "top_k": -2}, 400),
        ("min_p of 1", C, {"prompt": "hi", "min_p": 1.0}, 400),
        ("repetition_penalty 0", C, {"prompt": "hi", "repetition_penalty": 0}, 400),
        ("a fractional max_tokens", C, {"prompt": "hi", "max_tokens": 2.5}, 400),
    ],
    "stop strings": [
        ("a stop list of 10,000 strings", C, {"prompt": "hi", "stop": ["x"] * 10_000}, 400),
        ("a stop string of 100 KB", C, {"prompt": "hi", "stop": "x" * 100_000}, 400),
        ("a stop list holding 100 KB", CHAT, {"messages": USER, "stop": ["x" * 100_000]}, 400),
        ("a stop list of numbers", C, {"prompt": "hi", "stop": [1, 2]}, 400),
    ],
    "prompts the model cannot take": [
        ("token ids past the vocabulary", C, {"prompt": [1, VOCAB, 5000]}, 400),
        ("a negative token id", C, {"prompt": [1, -1]}, 400),
        ("a token id past 2**31", C, {"prompt": [[1, 2**40]]}, 400),
        ("an empty list of prompts", C, {"prompt": []}, 400),
        ("an empty list of token ids", C, {"prompt": [[]]}, 400),
        ("token ids past the context", C, {"prompt": TOO_LONG_IDS}, 400),
        ("token ids that fill the context", C, {"prompt": TOO_LONG_IDS[:CONTEXT]}, 400),
        ("text past the context", C, {"prompt": "hi " * 300}, 400),
        (
            "a conversation past the context",
            CHAT,
            {"messages": [{"role": "user", "content": "x" * 2000}]},
            400,
        ),
    ],
    "conversations the chat format cannot take": [
        ("an empty conversation", CHAT, {"messages": []}, 400),
        ("a system message alone", CHAT, {"messages": [{"role": "system", "content": "be brief"}]}, 400),
        ("two user messages in a row", CHAT, {"messages": [*USER, *USER]}, 400),
        ("a tool message", CHAT, {"messages": [{"role": "tool", "content": "42"}]}, 400),
        ("an image", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
        ("tools", CHAT, {"messages": USER, "tools": [{"type": "function"}]}, 400),
        (
            "the assistant's turn last",
            CHAT,
            {"messages": [*USER, {"role": "assistant", "content": "a"}]},
            400,
        ),
        ("continuing no assistant", CHAT, {"messages": USER, "continue_final_message": True}, 400),
    ],
    "unsupported fields": [
        ("logit_bias", C, {"prompt": "hi", "logit_bias": {"5": 100}}, 400),
        ("best_of", C, {"prompt": "hi", "best_of": 3}, 400),
        ("suffix", C, {"prompt": "hi", "suffix": "end"}, 400),
        ("presence_penalty", CHAT, {"messages": USER, "presence_penalty": 1.0}, 400),
    ],
    # paths named as models too: nothing but the served model is reachable
    "other models": [
        ("another model", C, {"prompt": "hi", "model": "gpt-4o"}, 404),
        ("another model in chat", CHAT, {"messages": USER, "model": "gpt-4o"}, 404),
        ("a relative path as the model", C, {"prompt": "hi", "model": "../base_checkpoints/d2"}, 404),
        (
            "another checkpoint's folder",
            C,
            {"prompt": "hi", "model": str(E7 / "base_checkpoints" / "d2")},
            404,
        ),
        ("the served folder itself", C, {"prompt": "hi", "model": str(CHECKPOINT)}, 404),
        ("a system file", CHAT, {"messages": USER, "model": "/etc/passwd"}, 404),
    ],
    "the tokenizer routes": [
        ("tokenize a number", TOKENIZE, {"prompt": 5}, 400),
        ("detokenize ids past the vocabulary", DETOKENIZE, {"tokens": [1, VOCAB]}, 400),
        ("detokenize a negative id", DETOKENIZE, {"tokens": [-1]}, 400),
        ("tokenize invalid JSON", TOKENIZE, b"{", 400),
    ],
}


@pytest.mark.parametrize("group", list(REFUSED))
def test_a_refused_request_is_one_error_and_the_server_serves_on(served, group):
    problems = []
    for name, path, body, status in REFUSED[group]:  # every case, each followed by a real request
        try:
            assert_one_error(post(served, path, body), status)
            assert_still_serves(served)
            refused = served.records[-2]
            assert refused.status == status and refused.note, refused  # recorded with why
        except AssertionError as exc:
            problems.append(f"{name}: {exc}")
    assert not problems, "\n".join(problems)


def test_the_named_model_is_refused_by_name_and_the_served_one_answers(served):
    error = assert_one_error(post(served, C, {"prompt": "hi", "model": "gpt-4o"}), 404)
    assert error["type"] == "not_found_error" and error["param"] == "model"
    assert served.model in error["message"]
    assert str(E7) not in error["message"]  # no folder of this machine named back
    r = post(served, CHAT, {"messages": USER, "model": served.model, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_a_field_error_names_the_field(served):
    error = assert_one_error(post(served, C, {"prompt": "hi", "n": wire.MAX_N + 1}), 400)
    assert error["param"] == "n" and str(wire.MAX_N) in error["message"]
    error = assert_one_error(post(served, C, {"prompt": "hi", "stop": ["x"] * 10_000}), 400)
    assert error["param"] == "stop" and "10000" in error["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_later_prompt_that_the_model_refuses_is_one_error(served, stream):
    body = {"prompt": [[104, 105], [1, VOCAB]], "max_tokens": 2, "stream": stream}
    with client() as c, c.stream("POST", served.root + C, content=json.dumps(body).encode()) as response:
        if not stream or response.status_code != 200:
            response.read()
            assert_one_error(response, 400)
        else:  # the first choice streamed already: the refusal is the stream's one error event
            events = sse_events(response)
            assert events[-1] == "[DONE]" and all("choices" in e for e in events[:-2])
            check_error_body(events[-2], 400)
    assert_still_serves(served)


# ----- requests within the bounds that reach past the context --------------------------------------


def test_max_tokens_past_the_context_ends_at_the_context(served):
    prompt = [104, 105, 32] * 33  # "hi hi hi …": 99 ids, room for 29 more
    r = post(served, C, {"prompt": prompt, "max_tokens": wire.MAX_TOKENS, "seed": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    used = body["usage"]
    assert used["prompt_tokens"] == len(prompt)
    assert used["prompt_tokens"] + used["completion_tokens"] <= CONTEXT
    assert body["choices"][0]["finish_reason"] == "length"
    assert used["prompt_tokens"] + used["completion_tokens"] == CONTEXT
    assert_still_serves(served)


def test_a_chat_reply_without_a_limit_ends_within_the_context(served):
    r = post(served, CHAT, {"messages": USER, "max_tokens": wire.MAX_TOKENS, "temperature": 100.0, "seed": 3})
    assert r.status_code == 200, r.text
    used = r.json()["usage"]
    assert used["prompt_tokens"] + used["completion_tokens"] <= CONTEXT
    assert_still_serves(served)


# ----- bodies too large, and slow to arrive ---------------------------------------------------------


def test_a_body_over_the_limit_is_413(served):
    big = b'{"prompt": "' + b"a" * wire.MAX_BODY_BYTES + b'"}'
    assert_one_error(post(served, C, big), 413)
    assert_still_serves(served)


def test_a_content_length_over_the_limit_is_413_before_the_body_is_sent(served):
    with connect(served, timeout_s=10) as sock:  # the body never comes: the answer cannot wait on it
        sock.sendall(request_head(C, wire.MAX_BODY_BYTES + 1))
        status, body = read_response(sock)
    assert status == 413
    check_error_body(json.loads(body), 413)
    assert_still_serves(served)


def test_a_content_length_of_2_to_the_63_is_413(served):
    with connect(served, timeout_s=10) as sock:
        sock.sendall(request_head(C, 2**63))
        status, body = read_response(sock)
    assert status == 413
    check_error_body(json.loads(body), 413)
    assert_still_serves(served)


def test_a_chunked_body_over_the_limit_is_413(served):
    def chunks() -> Iterator[bytes]:  # no Content-Length: the size is known only as it arrives
        yield b'{"prompt": "'
        for _ in range(wire.MAX_BODY_BYTES // 65536 + 2):
            yield b"a" * 65536
        yield b'"}'

    r = request("POST", served.root + C, content=chunks())
    assert "content-length" not in r.request.headers
    assert_one_error(r, 413)
    assert_still_serves(served)


def test_a_chunked_body_within_the_limit_is_served(served):
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "The cat", '
        yield b'"max_tokens": 2}'

    r = request("POST", served.root + C, content=chunks())
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_client_that_sends_half_a_body_and_stalls_is_408(chunked):
    with serving(CHECKPOINT, options(), body_timeout_s=0.5) as s:
        with connect(s, timeout_s=10) as sock:  # far past the body timeout: the 408 comes first
            body = b'{"prompt": "hi", "max_tokens": 2}'
            if chunked:
                sock.sendall(request_head(C, None) + f"{len(body):x}\r\n".encode() + body[:10])
            else:
                sock.sendall(request_head(C, len(body)) + body[:10])
            started = time.monotonic()
            status, answer = read_response(sock)
            waited = time.monotonic() - started
        assert status == 408
        check_error_body(json.loads(answer), 408)
        assert waited < 5.0
        assert s.records[-1].status == 408
        assert_still_serves(s)


def test_a_client_that_stalls_in_its_headers_holds_up_no_one(served):
    with connect(served), connect(served) as stalled:  # one says nothing, one stops mid-header
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: te")
        assert_still_serves(served)


MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    request_head(C, 2**100),  # past what h11 reads as a length
    request_head(C, None).replace(b"chunked", b"gzip, chunked, x"),
]


def test_malformed_http_is_refused_and_the_server_serves_on(served):
    # Below the app: uvicorn's own 400 (plain text, not an OpenAI error), then it closes the
    # connection. The app never sees such a request.
    for garbage in MALFORMED:
        with connect(served, timeout_s=10) as sock:
            sock.sendall(garbage)
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400 "), (garbage, answer)
    assert served.records == []
    assert_still_serves(served)


# ----- routes, methods and keys ---------------------------------------------------------------------


UNKNOWN_ROUTES = ["/v1/nothing", "/nothing", "/v1/engines/x/completions", "/etc/passwd", "/v1/models/x"]
WRONG_METHODS = [("GET", C), ("GET", CHAT), ("PUT", C), ("DELETE", "/v1/models"), ("POST", "/health")]


def test_an_unknown_route_is_a_404_error(served):
    for path in UNKNOWN_ROUTES:
        assert_one_error(request("GET", served.root + path), 404)
        assert_one_error(post(served, path, {"prompt": "hi"}), 404)
        assert_still_serves(served)


def test_a_wrong_method_is_a_405_error(served):
    for method, path in WRONG_METHODS:
        assert_one_error(request(method, served.root + path), 405)
        assert_still_serves(served)


KEY = "k"
GUARDED = [
    ("POST", C, {"prompt": "hi", "max_tokens": 2}),
    ("POST", CHAT, {"messages": USER, "max_tokens": 2}),
    ("GET", "/v1/models", None),
    ("GET", "/tokenizer_info", None),
    ("POST", TOKENIZE, {"prompt": "hi"}),
    ("POST", DETOKENIZE, {"tokens": [104, 105]}),
]


def keyed(s: Serving, method: str, path: str, body: Any, authorization: str | None) -> httpx.Response:
    headers = {} if authorization is None else {"authorization": authorization.encode("utf-8")}
    content = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    return request(method, s.root + path, content=content, headers=headers)


WRONG_KEYS = [None, "", "Bearer", "Bearer wrong", "Bearer kk", "Basic k", "k", "Bearer K", "Bearer k\u00e9"]


def test_a_missing_or_wrong_key_is_401_on_every_guarded_route():
    with serving(CHECKPOINT, options(), api_key=KEY) as s:
        for authorization in WRONG_KEYS:
            for method, path, body in GUARDED:
                r = keyed(s, method, path, body, authorization)
                assert assert_one_error(r, 401)["type"] == "authentication_error", (authorization, path)
            assert_still_serves(s, {"authorization": f"Bearer {KEY}"})


def test_without_a_key_a_body_is_not_even_read():
    with serving(CHECKPOINT, options(), api_key=KEY) as s:
        assert_one_error(keyed(s, "POST", C, b"{not json", None), 401)
        assert_one_error(
            keyed(s, "POST", C, b'{"prompt": "' + b"a" * (wire.MAX_BODY_BYTES + 1) + b'"}', None), 401
        )
        assert_one_error(keyed(s, "POST", C, {"prompt": "hi", "model": "other"}, None), 401)


def test_the_right_key_is_served_and_health_needs_none():
    with serving(CHECKPOINT, options(), api_key=KEY) as s:
        r = request("GET", s.root + "/health")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        for method, path, body in GUARDED:
            r = keyed(s, method, path, body, f"Bearer {KEY}")
            assert r.status_code == 200, (path, r.text)
        r = keyed(s, "POST", C, {"prompt": "hi", "model": "other"}, f"Bearer {KEY}")
        assert_one_error(r, 404)  # past the key, the request itself is judged


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.0.2.7"])
@pytest.mark.parametrize("key", [None, ""])
def test_a_server_beyond_loopback_needs_a_key(address, key):
    host = ModelHost(lambda: pytest.fail("nothing is opened for a server that does not start"), 4)
    try:
        with pytest.raises(NanoscopeError, match="needs an API key"):
            Server(host, ServeSettings("m", api_key=key), address, 0)
    finally:
        host.stop()


# ----- deadlines and disconnects --------------------------------------------------------------------


def test_a_deadline_shorter_than_the_generation_is_504():
    with serving(CHECKPOINT, options(), deadline_s=2.0) as s:
        started = time.monotonic()
        r = post(s, C, LONG)
        assert time.monotonic() - started < SETTLE_S
        error = assert_one_error(r, 504)
        assert "deadline" in error["message"]
        wait_until(lambda: health(s)["waiting"] == 0, SETTLE_S, "the cancelled generation's end")
        assert s.records[-1].status == 504
        assert_still_serves(s)


@pytest.mark.parametrize("path", [C, CHAT])
def test_a_deadline_that_passes_mid_stream_is_one_error_event(path):
    body = {**LONG, "stream": True}
    if path == CHAT:
        body = {
            "messages": USER,
            "n": wire.MAX_N,
            "max_tokens": 1000,
            "temperature": 100.0,
            "seed": 1,
            "stream": True,
        }
    with serving(CHECKPOINT, options(), deadline_s=2.0) as s:
        with (
            client() as c,
            c.stream(
                "POST", s.root + path, content=json.dumps(body).encode(), timeout=HTTP_TIMEOUT_S
            ) as response,
        ):
            assert response.status_code == 200
            events = sse_events(response)
        assert events[-1] == "[DONE]"
        errors = [e for e in events[:-1] if "error" in e]
        assert len(errors) == 1 and errors[0] is events[-2]  # the one error ends the stream
        check_error_body(errors[0], 504)
        assert all("choices" in e for e in events[:-2]) and len(events) > 2  # chunks came first
        wait_until(lambda: health(s)["waiting"] == 0, SETTLE_S, "the cancelled generation's end")
        assert_still_serves(s)


def test_a_stream_whose_client_stops_reading_still_ends_at_its_deadline():
    # Each choice echoes 40 prompt tokens with 20 alternatives each: the stream outruns the small
    # buffers below within a second, and the server's send waits on a client that never reads.
    prompt = " ".join(["hi"] * 40)
    body = {**LONG, "prompt": [prompt] * 64, "echo": True, "logprobs": 20, "stream": True}
    with serving(CHECKPOINT, options(), deadline_s=3.0) as s:
        # Small kernel buffers both ways (the accepted socket takes the listener's send buffer).
        s.server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(HTTP_TIMEOUT_S)
            sock.connect(("127.0.0.1", port_of(s)))
            data = json.dumps(body).encode()
            sock.sendall(request_head(C, len(data)) + data)
            wait_until(lambda: health(s)["waiting"] == 1, SETTLE_S, "the stream's start")
            # Not reading: the model's work still ends at the deadline, not minutes later.
            wait_until(lambda: health(s)["waiting"] == 0, SETTLE_S, "the end of the stalled stream's jobs")
            answer = b""
            while not answer.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
                chunk = sock.recv(1 << 20)
                assert chunk, answer[-300:]
                answer += chunk
        head, _, chunked = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        events = [e.removeprefix("data: ") for e in dechunk(chunked).decode().split("\n\n") if e]
        assert events[-1] == "[DONE]"
        check_error_body(json.loads(events[-2]), 504)  # what the client reads once it reads
        assert_still_serves(s)


def test_a_client_that_disconnects_mid_stream_stops_its_generation():
    with serving(CHECKPOINT, options(), max_waiting=1) as s:
        body = json.dumps({**LONG, "stream": True}).encode()
        with connect(s) as sock:
            sock.sendall(request_head(C, len(body)) + body)
            seen = b""
            while seen.count(b"data: ") < 3:  # the stream is under way
                chunk = sock.recv(65536)
                assert chunk, seen
                seen += chunk
            assert seen.startswith(b"HTTP/1.1 200 ")
            assert health(s)["waiting"] == 1  # the rest of its choices wait
        # Gone: its generation ends (the whole of it would take minutes) and its slot frees.
        wait_until(lambda: health(s)["waiting"] == 0, SETTLE_S, "the generation's end")
        wait_until(lambda: len(s.records) == 1, SETTLE_S, "the disconnected request's record")
        assert s.records[0].path == C and s.records[0].status == 200
        assert_still_serves(s)  # with max_waiting 1, a 429 had the disconnected request lived on
        assert [r.status for r in s.records] == [200, 200]


def test_a_client_that_disconnects_while_waiting_for_a_whole_reply_stops_its_generation():
    with serving(CHECKPOINT, options(), max_waiting=1) as s:
        body = json.dumps(LONG).encode()
        with connect(s) as sock:
            sock.sendall(request_head(C, len(body)) + body)
            wait_until(lambda: health(s)["waiting"] == 1, SETTLE_S, "the request's start")
        wait_until(lambda: health(s)["waiting"] == 0, SETTLE_S, "the generation's end")
        wait_until(lambda: len(s.records) == 1, SETTLE_S, "the disconnected request's record")
        assert s.records[0].status == 499 and "disconnected" in s.records[0].note
        assert_still_serves(s)


def test_a_full_queue_is_429_and_frees_when_the_request_ends():
    with serving(CHECKPOINT, options(), max_waiting=1, deadline_s=2.0) as s:
        body = json.dumps({**LONG, "stream": True}).encode()
        with connect(s) as sock:
            sock.sendall(request_head(C, len(body)) + body)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")  # under way, and holding the one slot
            error = assert_one_error(post(s, C, {"prompt": "hi", "max_tokens": 2}), 429)
            assert error["type"] == "rate_limit_error"
        wait_until(lambda: health(s)["waiting"] == 0, SETTLE_S, "the generation's end")
        assert_still_serves(s)


# ----- many at once ---------------------------------------------------------------------------------


def test_100_concurrent_connections_get_200_or_429_each():
    async def all_at_once(url: str) -> list[httpx.Response | BaseException]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(verify=False, timeout=HTTP_TIMEOUT_S, limits=limits) as many:
            sends = [many.post(url, json={"prompt": "hi", "max_tokens": 16, "seed": i}) for i in range(100)]
            return await asyncio.gather(*sends, return_exceptions=True)

    with serving(CHECKPOINT, options(), max_waiting=4) as s:
        answers = asyncio.run(all_at_once(s.url + "/completions"))
        dropped = [a for a in answers if isinstance(a, BaseException)]
        assert not dropped, dropped[:3]
        statuses = [a.status_code for a in answers]  # type: ignore[union-attr]
        assert set(statuses) <= {200, 429}, statuses
        assert 200 in statuses and 429 in statuses, statuses
        for answer in answers:
            assert isinstance(answer, httpx.Response)
            if answer.status_code == 429:
                assert assert_one_error(answer, 429)["type"] == "rate_limit_error"
            else:
                assert len(answer.json()["choices"]) == 1
        assert sorted(r.status for r in s.records) == sorted(statuses)
        wait_until(lambda: health(s)["waiting"] == 0, SETTLE_S, "the queue's end")
        assert_still_serves(s)


# ----- anything at all in any field -----------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and ±Infinity included: json.dumps writes them as the non-JSON literals
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)
# Mostly roles and contents a conversation may have, so that the conversation's shape is what varies.
ROLES = st.sampled_from(["system", "developer", "user", "assistant"] * 3 + ["tool", "", None, 3])
CONTENTS = st.one_of(
    st.text(max_size=8),
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "text", "image_url"]), "text": st.text(max_size=4)}
        ),
        max_size=2,
    ),
    JSON_VALUES,
)
PLAUSIBLE = {
    "prompt": st.text(max_size=12)
    | st.lists(st.integers(-2, VOCAB + 2), max_size=6)
    | st.lists(st.lists(st.integers(-1, VOCAB), max_size=4), max_size=3)
    | st.lists(st.text(max_size=6), max_size=3),
    "messages": st.lists(st.fixed_dictionaries({"role": ROLES, "content": CONTENTS}), max_size=4),
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=20),
    "n": st.integers(-2, wire.MAX_N + 2),
    "logprobs": st.integers(-1, 22) | st.booleans(),
    "top_logprobs": st.integers(-1, 22),
    "echo": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | JSON_VALUES}),
    "temperature": st.floats(-1, 101),
    "top_p": st.floats(-0.5, 1.5),
    "top_k": st.integers(-3, 400),
    "min_p": st.floats(-0.5, 1.5),
    "seed": st.integers(-(2**65), 2**65),
}
SHARED_FIELDS = [
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "n",
    "stop", "stream", "stream_options", "return_token_ids", "presence_penalty", "frequency_penalty",
    "logit_bias", "user", "unknown_field",
]  # fmt: skip
FIELDS = {
    C: [*SHARED_FIELDS, "prompt", "logprobs", "echo", "best_of", "suffix"],
    CHAT: [
        *SHARED_FIELDS, "messages", "max_completion_tokens", "logprobs", "top_logprobs",
        "continue_final_message", "add_generation_prompt", "tools",
    ],
}  # fmt: skip
BASE = {C: {"prompt": "hi", "max_tokens": 2}, CHAT: {"messages": USER, "max_tokens": 2}}
FEW_TOKENS = 4


def few_tokens(value: Any) -> bool:
    """A max_tokens that the server takes as at most a few tokens (or refuses): long replies
    times many choices are the explicit tests' business, not the fuzzer's."""
    if value is None:  # the rest of the context, in chat
        return False
    try:
        return not float(value) > FEW_TOKENS  # "1000", 1000.0 and True are read as numbers
    except (TypeError, ValueError, OverflowError):
        return True


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A request to either route: its prompt or conversation anything (plausible most often),
    and up to three other fields anything."""
    path = draw(st.sampled_from([C, CHAT]))
    body = dict(BASE[path])
    main = "prompt" if path == C else "messages"
    body[main] = draw(st.one_of(st.just(body[main]), PLAUSIBLE[main], PLAUSIBLE[main], JSON_VALUES))
    others = [name for name in FIELDS[path] if name != main]
    names = draw(st.lists(st.sampled_from(others), max_size=3, unique=True))
    for name in names:
        value = draw(PLAUSIBLE.get(name, JSON_VALUES) | JSON_VALUES)
        if name in ("max_tokens", "max_completion_tokens") and not few_tokens(value):
            value = FEW_TOKENS
        body[name] = value
    return path, body


def check_answer(response: httpx.Response) -> None:
    """Never a 5xx; an error is one OpenAI error, a success has its choices. Streamed, each event
    has its choices, but the last may be one error (a later prompt the model refuses, for one)."""
    assert response.status_code < 500, response.text[:500]
    if response.status_code != 200:
        check_error_body(response.json(), response.status_code)
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [
            line.removeprefix("data: ") for line in response.text.split("\n\n") if line.startswith("data: ")
        ]
        assert events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        if chunks and "error" in chunks[-1]:
            check_error_body(chunks[-1], chunks[-1]["error"]["code"])
            assert chunks[-1]["error"]["code"] < 500, chunks[-1]
            chunks.pop()
        for chunk in chunks:
            assert "choices" in chunk, chunk
        return
    assert "choices" in response.json()


def test_arbitrary_json_in_any_field_is_never_a_server_error():
    with serving(CHECKPOINT, options()) as s, client() as http:

        @settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
        @given(requests())
        def check(drawn: tuple[str, dict[str, Any]]) -> None:
            path, body = drawn
            content = json.dumps(body).encode()  # NaN and Infinity as their literals
            check_answer(
                http.post(s.root + path, content=content, headers={"content-type": "application/json"})
            )

        check()
        assert all(r.status < 500 for r in s.records)
        assert_still_serves(s)
