"""RemoteBackend: the happy path against a real ``transformers serve`` on 127.0.0.1, every transport
fault against a small misbehaving server on 127.0.0.1 (tests/openai_fault_server.py), and the CLI.

Expected replies come from the same weights run locally by transformers (greedy), never from
numbers written down by hand.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from support.openai_fault_server import DROP, FaultServer, Pause, Reply, chat_chunk, error, models, sse
from support.served_model import Served, local_greedy, served_model

from desktop.cli.main import main
from desktop.engine.backend import GenerationStats, LoadOptions, ReplyStart, StreamOptions
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend
from desktop.engine.remote import backend as remote_backend
from desktop.engine.remote.events import STOP_LABEL
from desktop.engine.remote.http import RemoteError, api_root, list_models, transport_error
from desktop.engine.remote.servers import ServerEndpoint, directory, refusals, remote_target

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
STOP_WAIT_S = 3.0  # Stop must end a reply well within this


@pytest.fixture(scope="session")
def served(request, tmp_path_factory) -> Served:
    return served_model(request, tmp_path_factory)


@pytest.fixture
def fault():
    server = FaultServer()
    refusals.forget(api_root(server.url))
    yield server
    server.close()


def chat(text: str) -> list[Message]:
    return [Message.of_text("user", text)]


def run(backend, conversation, params=GREEDY, top: int = 0, cancel=None):
    """(events, stats, error text or None) of one reply, the way the worker drives it."""
    stats = GenerationStats()
    prompt = backend.render(conversation, params.max_tokens)
    events = []
    try:
        for ev in backend.stream(
            prompt, params, cancel or threading.Event(), StreamOptions(logprobs=top), stats
        ):
            events.append(ev)
    except RemoteError as exc:
        return events, stats, str(exc)
    return events, stats, None


def text_of(events) -> str:
    return "".join(ev.text for ev in events)


# ----- a real server ---------------------------------------------------------------------------


def open_served(served: Served, **options):
    return open_backend(
        remote_target("real", served.model), LoadOptions(server_url=served.url, server_name="ts", **options)
    )


def test_real_server_model_info_reflects_what_it_accepts(served):
    backend = open_served(served)
    try:
        info = backend.info()
        assert info.family == "remote" and info.device == "remote" and info.source == "remote"
        assert info.name == f"ts · {served.model}"
        caps = info.capabilities
        # transformers serve answers 422 to top_k, min_p and repetition_penalty, takes a seed,
        # and gives neither log-probabilities nor ids.
        assert {"temperature", "top_p", "max_tokens", "seed"} <= caps.sampling
        assert not caps.sampling & {"top_k", "min_p", "repetition_penalty"}
        assert not caps.logprobs and caps.why_not("logprobs")
        assert not caps.token_ids and not caps.scoring and caps.why_not("scoring")
    finally:
        backend.close()


def test_real_server_greedy_reply_matches_the_same_weights_run_locally(served):
    backend = open_served(served)
    try:
        events, stats, err = run(backend, chat("hello world"), SamplingParams(temperature=0.0, max_tokens=10))
    finally:
        backend.close()
    assert err is None
    assert text_of(events) == local_greedy(served, "hello world", 10)
    assert all(ev.id == -1 for ev in events)
    assert stats.new_tokens == 10 and stats.stopped == "max_tokens"  # counted by the server's usage
    assert stats.prompt_tokens > 0 and stats.ttft_ms > 0


def test_real_server_seed_repeats_a_sampled_reply_and_top_k_is_left_out(served):
    backend = open_served(served)
    sampled = SamplingParams(temperature=1.0, top_k=5, seed=7, max_tokens=8)
    try:
        first = text_of(run(backend, chat("the quick"), sampled)[0])
        again = text_of(run(backend, chat("the quick"), sampled)[0])
    finally:
        backend.close()
    assert first == again and first


def test_real_server_stop_ends_the_reply_at_once(served):
    backend = open_served(served)
    cancel = threading.Event()
    stats = GenerationStats()
    prompt = backend.render(chat("hello"), 200)
    params = SamplingParams(temperature=1.0, max_tokens=200, seed=3)
    try:
        events = []
        started = time.monotonic()
        for ev in backend.stream(prompt, params, cancel, StreamOptions(), stats):
            events.append(ev)
            cancel.set()
        elapsed = time.monotonic() - started
        # The backend stays usable after a stop.
        after, _stats, err = run(backend, chat("hello"), SamplingParams(temperature=0.0, max_tokens=3))
    finally:
        backend.close()
    assert stats.stopped == "cancelled" and 1 <= len(events) < 200
    assert elapsed < 30 and err is None and after


def test_real_server_completion_mode(served):
    backend = open_served(served)
    try:
        stats = GenerationStats()
        prompt = backend.render("the quick brown", 6)
        events = list(
            backend.stream(
                prompt, SamplingParams(temperature=0.0, max_tokens=6), threading.Event(), None, stats
            )
        )
    finally:
        backend.close()
    assert text_of(events) and stats.new_tokens == 6


def test_cli_generate_and_list_against_the_real_server(served, capsys):
    flags = ["--max-tokens", "10", "--temperature", "0", "--json"]
    args = ["generate", "--server", served.url, "--model", served.model, "--chat", "hello world"]
    code = main([*args, *flags])
    out = capsys.readouterr()
    assert code == 0, out.err
    lines = [json.loads(line) for line in out.out.splitlines()]
    tokens, done = lines[:-1], lines[-1]
    assert done["done"] and done["device"] == "remote"
    assert "".join(t["text"] for t in tokens) == local_greedy(served, "hello world", 10)
    assert all(t["id"] == -1 for t in tokens)
    assert main(["list", "--server", served.url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed["models"]] == [served.model]


def test_a_good_served_reply_prints_nothing_else_in_a_process_of_its_own(served, tmp_path):
    """Run as a user runs it: the process exits 0 and its stderr is empty (no "Task was destroyed
    but it is pending!" from a stream left open for the garbage collector at exit)."""
    args = ["generate", "--server", served.url, "--model", served.model, "--chat", "hello world"]
    env = {**os.environ, "NANOSCOPE_HOME": str(tmp_path / "home"), "PYTHONWARNINGS": "default"}
    done = subprocess.run(
        [sys.executable, "-m", "desktop.cli.main", *args, "--max-tokens", "10", "--temperature", "0"],
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert done.stdout.decode().strip()


# ----- faults ------------------------------------------------------------------------------------

PROBE = Reply(
    200, [chat_chunk("a"), chat_chunk(None, "length", usage={"prompt_tokens": 1, "completion_tokens": 1})]
)


def scripted(stream_reply, model: str = "m", probe: Reply = PROBE):
    """Models lists ``model``; the one-token probe at open gets ``probe``; replies get ``stream_reply``."""

    def script(path: str, body: dict) -> Reply:
        if path.endswith("/models"):
            return models(model)
        if body.get("max_tokens") == 1:
            return probe
        return stream_reply(body) if callable(stream_reply) else stream_reply

    return script


def open_fault(server: FaultServer, model: str = "m", key: str | None = None, stall: float | None = None):
    return open_backend(
        remote_target("f", model),
        LoadOptions(server_url=server.url, server_name="fault", api_key=key, stall_timeout=stall),
    )


def vllm_chunk(text: str, token_id: int, logprob: float) -> bytes:
    entry = {"token": text, "logprob": logprob, "top_logprobs": [{"token": text, "logprob": logprob}]}
    return chat_chunk(text, logprobs={"content": [entry]}, token_ids=[token_id])


def test_a_server_that_ignores_max_tokens_is_cut_off_at_the_clients_limit(fault):
    endless = Reply(200, [vllm_chunk("x", 7, -0.5) for _ in range(500)])  # no finish, no [DONE]
    fault.script = scripted(endless, probe=Reply(200, [vllm_chunk("a", 5, -1.0), chat_chunk(None, "length")]))
    backend = open_fault(fault)
    try:
        events, stats, err = run(backend, chat("hi"))
    finally:
        backend.close()
    assert err is None
    assert [e.id for e in events] == [7] * GREEDY.max_tokens
    assert stats.stopped == "max_tokens"


def test_ids_logprobs_usage_and_context_from_a_vllm_like_server(fault):
    reply = Reply(
        200,
        [
            vllm_chunk("Hel", 11, -0.1),
            vllm_chunk("lo", 12, -0.2),
            chat_chunk("", "stop", token_ids=[2]),
            chat_chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 3}),
            sse("[DONE]"),
        ],
    )
    probe = Reply(200, [vllm_chunk("a", 5, -1.0), chat_chunk(None, "length")])
    fault.script = scripted(reply, probe=probe)
    backend = open_fault(fault)
    try:
        info = backend.info()
        events, stats, err = run(backend, chat("hi"), top=3)
    finally:
        backend.close()
    assert err is None and info.context_length == 2048
    assert info.capabilities.logprobs and info.capabilities.token_ids
    assert [(e.id, e.text, e.logprob) for e in events] == [(11, "Hel", -0.1), (12, "lo", -0.2), (2, "", None)]
    assert events[0].top == ((-1, "Hel", -0.1),)
    assert (stats.prompt_tokens, stats.new_tokens, stats.stopped) == (9, 3, "stop_token")
    body = fault.requests[-1][1]
    assert body["logprobs"] is True and body["top_logprobs"] == 3 and body["return_token_ids"] is True
    assert body["stream_options"] == {"include_usage": True} and body["seed"] == GREEDY.seed


def test_a_422_naming_top_k_is_learnt_once_per_server(fault):
    def reply(body):
        if "top_k" in body:
            return error(422, "Unexpected fields in the request: {'top_k'}")
        return Reply(200, [chat_chunk("ok"), chat_chunk(None, "stop")])

    fault.script = _probe_like(reply)
    backend = open_fault(fault)
    try:
        assert "top_k" not in backend.info().capabilities.sampling
        sent_before = len(fault.requests)
        events, _stats, err = run(
            backend, chat("hi"), SamplingParams(temperature=0.5, top_k=40, max_tokens=4)
        )
        assert err is None and text_of(events) == "ok"
        assert len(fault.requests) == sent_before + 1  # already known: not sent, not refused again
        assert "top_k" not in fault.requests[-1][1]
    finally:
        backend.close()
    # Another model on the same server knows it too.
    second = open_fault(fault)
    try:
        assert "top_k" not in second.info().capabilities.sampling
    finally:
        second.close()


def _probe_like(reply):
    """The probe goes through the same rules as a reply (it carries top_k)."""

    def script(path, body):
        if path.endswith("/models"):
            return models("m")
        return reply(body)

    return script


def test_a_stream_without_done_ends_cleanly_and_adds_the_end_token(fault):
    fault.script = scripted(Reply(200, [chat_chunk("Hi"), chat_chunk("!", "stop")]))
    backend = open_fault(fault)
    try:
        events, stats, err = run(backend, chat("x"))
    finally:
        backend.close()
    assert err is None and text_of(events) == "Hi!" and stats.stopped == "stop_token"
    assert events[-1].special == STOP_LABEL and events[-1].text == ""


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        ([chat_chunk("a"), chat_chunk("\ufffd"), chat_chunk("日本"), chat_chunk(None, "stop")], "a日本"),
        ([chat_chunk("a\ufffd"), chat_chunk("K"), chat_chunk(None, "stop")], "a\ufffdK"),
        ([chat_chunk("a"), chat_chunk("\ufffd"), chat_chunk(None, "length")], "a\ufffd"),
    ],
    ids=["completed-by-next", "really-invalid", "invalid-at-the-end"],
)
def test_a_token_that_splits_a_character_is_held_back(fault, pieces, expected):
    fault.script = scripted(Reply(200, pieces))
    backend = open_fault(fault)
    try:
        events, _stats, err = run(backend, chat("x"))
    finally:
        backend.close()
    assert err is None and text_of(events) == expected
    reply = Message("assistant")
    for ev in events:
        reply.add_event(ev)
    assert reply.plain_text() == expected


def partial_then(*tail) -> Reply:
    return Reply(200, [chat_chunk("Once"), chat_chunk(" upon"), *tail])


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (partial_then(sse("{not json")), "malformed event"),
        (
            partial_then(sse({"error": {"message": "CUDA error: device-side assert", "code": 500}})),
            "failed mid-reply",
        ),
        (partial_then(DROP), "closed the connection mid-reply"),
        (partial_then(), "ended the stream before the reply was complete"),
    ],
    ids=["malformed-sse", "5xx-mid-stream", "server-dies", "ends-without-finish"],
)
def test_a_failure_mid_reply_keeps_the_partial_reply(fault, reply, message):
    fault.script = scripted(reply)
    backend = open_fault(fault)
    try:
        events, _stats, err = run(backend, chat("x"))
        # The backend still works afterwards.
        fault.script = scripted(Reply(200, [chat_chunk("fine"), chat_chunk(None, "stop")]))
        again, _stats, err2 = run(backend, chat("x"))
    finally:
        backend.close()
    assert err is not None and message in err and "\n" not in err
    assert text_of(events) == "Once upon"
    assert err2 is None and text_of(again) == "fine"


def test_a_stall_mid_stream_times_out_with_the_partial_reply(fault):
    release = threading.Event()
    fault.script = scripted(partial_then(Pause(release), chat_chunk(None, "stop")))
    backend = open_fault(fault, stall=0.4)
    try:
        started = time.monotonic()
        events, _stats, err = run(backend, chat("x"))
        elapsed = time.monotonic() - started
    finally:
        release.set()
        backend.close()
    assert err is not None and "stall timeout" in err and "0.4 s" in err
    assert text_of(events) == "Once upon" and elapsed < STOP_WAIT_S


def test_no_answer_before_the_first_byte_times_out(fault, monkeypatch):
    release = threading.Event()
    fault.script = scripted(Reply(200, [chat_chunk("late")], before=Pause(release)))
    backend = open_fault(fault)
    monkeypatch.setattr(remote_backend, "FIRST_BYTE_TIMEOUT_S", 0.4)
    try:
        events, _stats, err = run(backend, chat("x"))
    finally:
        release.set()
        backend.close()
    assert err is not None and "before the first byte" in err and not events


def test_stop_closes_a_stream_that_waits_on_the_server(fault):
    release = threading.Event()
    fault.script = scripted(Reply(200, [chat_chunk("one"), Pause(release)] + [chat_chunk("x")] * 50))
    backend = open_fault(fault)
    cancel = threading.Event()
    stats = GenerationStats()
    try:
        prompt = backend.render(chat("x"), 10)
        events = []
        stream = backend.stream(prompt, SamplingParams(max_tokens=100), cancel, StreamOptions(), stats)
        events.append(next(stream))
        timer = threading.Timer(0.2, cancel.set)  # Stop pressed while the server says nothing
        timer.start()
        started = time.monotonic()
        events.extend(stream)
        elapsed = time.monotonic() - started
        timer.join()
    finally:
        release.set()
        backend.close()
    assert text_of(events) == "one" and stats.stopped == "cancelled" and elapsed < STOP_WAIT_S
    assert fault.disconnected.wait(5)  # the server saw the client leave


@pytest.mark.parametrize(
    ("status", "detail", "message"),
    [
        (401, "Invalid API key", "no API key or a wrong one"),
        (403, "forbidden", "HTTP 403"),
        (404, "The model `m` does not exist.", "has no model named 'm'"),
        (400, "This model's maximum context length is 2048 tokens", "HTTP 400"),
        (429, "Too many requests", "HTTP 429"),
        (503, "overloaded", "failed (HTTP 503): overloaded"),
    ],
)
def test_error_answers_give_one_readable_line(fault, status, detail, message):
    fault.script = scripted(error(status, detail, **({"Retry-After": "3"} if status == 429 else {})))
    backend = open_fault(fault)
    try:
        events, _stats, err = run(backend, chat("x"))
    finally:
        backend.close()
    assert err is not None and message in err and "\n" not in err and not events


def test_the_api_key_is_sent_and_never_shown(fault):
    key = "sk-test-0123456789abcdef"

    def script(path, body):
        if path.endswith("/models"):
            return models("m")
        auth = fault.requests[-1][2].get("Authorization", "")
        return error(401, f"bad key {auth.removeprefix('Bearer ')}")

    fault.script = script
    with pytest.raises(RemoteError) as caught:
        open_fault(fault, key=key)
    assert fault.requests[0][2]["Authorization"] == f"Bearer {key}"
    assert key not in str(caught.value) and "***" in str(caught.value)
    assert key not in repr(LoadOptions(api_key=key)) and key not in repr(ServerEndpoint("a", "b", "c", key))


def test_a_model_the_server_does_not_list_fails_at_open(fault):
    fault.script = scripted(PROBE, model="other")
    with pytest.raises(RemoteError, match="has no model named 'm'; it serves other"):
        open_fault(fault, "m")


def test_connection_refused_tls_and_dns_each_give_one_line(fault):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    with pytest.raises(RemoteError, match="connection refused"):
        open_backend(remote_target("x", "m"), LoadOptions(server_url=f"http://127.0.0.1:{closed_port}"))
    fault.script = scripted(PROBE)
    with pytest.raises(RemoteError, match="TLS"):
        open_backend(remote_target("x", "m"), LoadOptions(server_url=fault.url.replace("http:", "https:")))
    # No test sends a DNS query off this machine: the classification is checked on the error
    # httpx raises for a name that does not resolve.
    dns = httpx.ConnectError("[Errno -2] Name or service not known")
    assert "does not resolve (DNS)" in str(transport_error(dns, "http://gpu-box.invalid:8000/v1"))


def test_an_unknown_server_id_and_a_published_one(fault):
    fault.script = scripted(PROBE)
    with pytest.raises(RemoteError, match="Settings › Servers"):
        open_backend(remote_target("nobody", "m"), LoadOptions())
    directory.publish([ServerEndpoint("box", "GPU box", fault.url)])
    try:
        backend = open_backend(remote_target("box", "m"), LoadOptions())
        assert backend.info().name == "GPU box · m"
        backend.close()
    finally:
        directory.publish([])


def test_cli_errors_are_one_line_and_exit_2(fault, capsys):
    fault.script = scripted(error(429, "slow down"))
    code = main(["generate", "--server", fault.url, "--model", "m", "--chat", "hi", "--json"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "HTTP 429" in err
    assert main(["generate", "--server", "ftp://x", "--model", "m", "--chat", "hi"]) == 2
    assert "http://" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (
            Reply(200, [b'{"data": [' + b" " * (9 << 20) + b"]}"], content_type="application/json"),
            "more than 8 MB",
        ),
        (Reply(200, [b"\x1f\x8b"], {"Content-Encoding": "gzip"}, "application/json"), "compressed (gzip)"),
        (Reply(200, [b'{"data": ' + b"[" * 100_000], content_type="application/json"), "not JSON"),
    ],
    ids=["oversized", "gzip", "deep"],
)
def test_a_hostile_model_list_is_refused_in_one_line(fault, reply, says):
    fault.script = lambda path, body: reply
    with pytest.raises(RemoteError) as info:
        list_models(fault.url)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_the_model_list_is_asked_for_uncompressed(fault):
    fault.script = lambda path, body: models("m")
    assert [m.name for m in list_models(fault.url)] == ["m"]
    assert fault.requests[-1][2].get("Accept-Encoding") == "identity"


def test_real_server_fork_in_completion_mode_continues_the_text_it_was_given(served):
    """A served fork is text: the reply said " fox", the user gives " jumps", and the server
    goes on exactly as it goes on from the whole text."""
    backend = open_served(served)
    params = SamplingParams(temperature=0.0, max_tokens=6)
    start = StreamOptions(start=ReplyStart(said_text=" fox", given_text=" jumps"))
    try:
        forked = list(backend.stream(backend.render("the quick brown", 6), params, threading.Event(), start))
        whole = list(
            backend.stream(backend.render("the quick brown fox jumps", 6), params, threading.Event())
        )
    finally:
        backend.close()
    assert forked[0].given and forked[0].text == " jumps" and not any(e.given for e in forked[1:])
    assert text_of(forked[1:]) == text_of(whole) and text_of(whole)


def test_real_server_that_cannot_continue_a_chat_reply_says_so_in_one_line(served):
    """transformers serve refuses continue_final_message: a chat fork is one readable line,
    never a new reply passed off as the fork's, and the backend goes on serving."""
    backend = open_served(served)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    start = StreamOptions(start=ReplyStart(said_text="hello", given_text=" world"))
    try:
        with pytest.raises(RemoteError, match="cannot continue a reply"):
            list(backend.stream(backend.render(chat("hello world"), 4), params, threading.Event(), start))
        after, _stats, err = run(backend, chat("hello"), params)
    finally:
        backend.close()
    assert err is None and after


def test_a_chat_fork_asks_a_vllm_like_server_to_continue_the_assistant_message(fault):
    reply = Reply(200, [chat_chunk(" there"), chat_chunk(None, "stop"), sse("[DONE]")])
    fault.script = scripted(reply, probe=Reply(200, [chat_chunk("a"), chat_chunk(None, "length")]))
    backend = open_fault(fault)
    start = StreamOptions(start=ReplyStart(said_text="Hello", given_text=" you"))
    try:
        events = list(backend.stream(backend.render(chat("hi"), 8), GREEDY, threading.Event(), start))
    finally:
        backend.close()
    assert [(e.text, e.given) for e in events if e.text] == [(" you", True), (" there", False)]
    body = fault.requests[-1][1]
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello you"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
