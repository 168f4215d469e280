"""The HTTP side of ``nanoscope serve``: OpenAI's routes over one :class:`~.host.ModelHost`
(Starlette, Qt-free).

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``,
and vLLM's ``GET /tokenizer_info``, ``POST /tokenize`` and ``POST /detokenize`` (what
lm-evaluation-harness's remote tokenizer asks for, so a checkpoint with no Hugging Face tokenizer can
be evaluated). Every answer that is not a success is one OpenAI-style error.

Bounds: the body (size, and the time it may take to arrive), the queue (429 past it), every
request's deadline (504), and a client that disconnects cancels its generation. With an API key,
every route but ``/health`` asks for it (``Authorization: Bearer``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from desktop.engine.backend import ModelInfo
from desktop.engine.files.bounded import file_sha256
from desktop.engine.messages import Message
from desktop.engine.params import SEED_MAX, SamplingParams
from desktop.engine.serve import shapes
from desktop.engine.serve.defaults import DEADLINE_S
from desktop.engine.serve.host import Job, ModelHost
from desktop.engine.serve.records import RequestRecord
from desktop.engine.serve.replies import ChoiceSpec, Echo, Finish, Piece, TokenOut, choice_work
from desktop.engine.serve.wire import (
    MAX_BODY_BYTES,
    ApiError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    Sampling,
    TokenizeRequest,
    check_ids,
    parse,
)

logger = logging.getLogger(__name__)

COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
BODY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServeSettings:
    model_id: str
    api_key: str | None = field(default=None, repr=False)
    deadline_s: float = DEADLINE_S
    body_timeout_s: float = BODY_TIMEOUT_S


RequestLog = Callable[[RequestRecord], None]


@dataclass
class _Tally:
    """What a request used, filled in as it runs."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    note: str = ""


def served_id(info: ModelInfo) -> str:
    """The model's id in the API: SOURCE/TAG@STEP (``sft/d20@1500``), else the folder's name."""
    name = f"{info.source}/{info.tag}" if info.source and info.tag else Path(info.path).name
    return f"{name}@{info.step}" if info.step is not None else name


def build_app(host: ModelHost, settings: ServeSettings, on_request: RequestLog | None = None) -> Starlette:
    server = _Routes(host, settings, on_request)
    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.guarded(server.models), methods=["GET"]),
        Route("/v1/completions", server.guarded(server.completions), methods=["POST"]),
        Route("/v1/chat/completions", server.guarded(server.chat), methods=["POST"]),
        Route("/tokenizer_info", server.guarded(server.tokenizer_info), methods=["GET"]),
        Route("/tokenize", server.guarded(server.tokenize), methods=["POST"]),
        Route("/detokenize", server.guarded(server.detokenize), methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={
            HTTPException: _http_error,  # type: ignore[dict-item]
            Exception: _unexpected,
        },
    )


async def _http_error(request: Request, exc: HTTPException) -> Response:
    message = {
        404: f"no route {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }
    return _error(ApiError(exc.status_code, message.get(exc.status_code, str(exc.detail))))


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.error("serving %s failed", request.url.path, exc_info=exc)
    return _error(ApiError(500, f"the server failed: {type(exc).__name__}", kind="server_error"))


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


class _Routes:
    def __init__(self, host: ModelHost, settings: ServeSettings, on_request: RequestLog | None) -> None:
        self.host = host
        self.settings = settings
        self.on_request = on_request
        self._tokenizer_lock = threading.Lock()
        self._digest: str | None = None

    # ----- plumbing ------------------------------------------------------------------------------

    def guarded(
        self, handler: Callable[[Request, _Tally], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` behind the key check, its ApiErrors answered, and the request recorded."""

        async def endpoint(request: Request) -> Response:
            started = time.monotonic()
            tally = _Tally()
            try:
                self._check_key(request)
                response = await handler(request, tally)
            except ApiError as exc:
                tally.note = exc.message
                response = _error(exc)
            if isinstance(response, StreamingResponse):  # recorded once the stream has ended
                response.background = BackgroundTask(
                    self._record, request, response.status_code, tally, started
                )
            else:
                self._record(request, response.status_code, tally, started)
            return response

        return endpoint

    def _check_key(self, request: Request) -> None:
        key = self.settings.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(
                401, "a valid API key is required (Authorization: Bearer …)", kind="authentication_error"
            )

    def _record(self, request: Request, status: int, tally: _Tally, started: float) -> None:
        client = f"{request.client.host}:{request.client.port}" if request.client else "?"
        record = RequestRecord(
            client,
            request.method,
            request.url.path,
            status,
            tally.prompt_tokens,
            tally.completion_tokens,
            round(time.monotonic() - started, 3),
            tally.note,
        )
        logger.info("%s %s %s -> %d (%.2f s)", client, record.method, record.path, status, record.seconds)
        if self.on_request is not None:
            try:
                self.on_request(record)
            except Exception:  # a view's failure must not fail the request
                logger.warning("the request log failed", exc_info=True)

    async def _body(self, request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            raise ApiError(413, f"the body may have at most {MAX_BODY_BYTES} bytes")
        body = bytearray()

        async def read() -> None:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > MAX_BODY_BYTES:
                    raise ApiError(413, f"the body may have at most {MAX_BODY_BYTES} bytes")

        try:
            await asyncio.wait_for(read(), self.settings.body_timeout_s)
        except TimeoutError:
            raise ApiError(
                408, f"the body did not arrive within {self.settings.body_timeout_s:g} s"
            ) from None
        return bytes(body)

    def _info(self) -> ModelInfo:
        info = self.host.info
        if info is None:
            raise ApiError(503, self.host.error or "the model is still loading", kind="server_error")
        return info

    def _check_model(self, name: str) -> None:
        if name and name != self.settings.model_id:
            raise ApiError(
                404,
                f"model {name!r} is not served here; this server serves {self.settings.model_id!r}",
                kind="not_found_error",
                param="model",
            )

    def _tokenizer(self) -> Any:
        self._info()
        backend = self.host.backend
        assert backend is not None
        return backend.tokenizer()

    def _tokenizer_digest(self, info: ModelInfo) -> str | None:
        if self._digest is None:
            path = Path(info.tokenizer)
            if path.is_dir():  # a Hugging Face tokenizer folder
                path = path / "tokenizer.json"
            self._digest = (file_sha256(path) or "") if info.tokenizer else ""
        return self._digest or None

    # ----- simple routes -------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if self.host.info is None:
            status = "failed" if self.host.error else "loading"
            return JSONResponse({"status": status, "error": self.host.error}, status_code=503)
        return JSONResponse({"status": "ok", "waiting": self.host.waiting()})

    async def models(self, request: Request, tally: _Tally) -> Response:
        info = self._info()
        entry = {
            "id": self.settings.model_id,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "nanoscope",
            "max_model_len": info.context_length,
            "context_length": info.context_length,
            "family": info.family,
            "era": info.era,
            "precision": info.precision,
            # The tokenizer's digest: Nanoscope's remote backend compares ids with a local copy's.
            "tokenizer_sha256": self._tokenizer_digest(info),
            "vocab_size": info.vocab_size,
        }
        return JSONResponse({"object": "list", "data": [entry]})

    async def tokenizer_info(self, request: Request, tally: _Tally) -> Response:
        tok = self._tokenizer()
        label = self.host.backend.token_label  # type: ignore[union-attr]
        stops = sorted(tok.stop_ids)
        info = self._info()
        return JSONResponse(
            {
                "eos_token": label(stops[0]) if stops else None,
                "bos_token": label(tok.bos_id) if tok.bos_id is not None and tok.bos_id >= 0 else None,
                "pad_token": None,
                "model_max_length": info.context_length,
                "vocab_size": info.vocab_size,
            }
        )

    async def tokenize(self, request: Request, tally: _Tally) -> Response:
        req = parse(TokenizeRequest, await self._body(request))
        tok = self._tokenizer()

        def encode() -> list[int]:
            with self._tokenizer_lock:
                special = tok.special_id(req.prompt)  # a special token written out by name
                if special is not None:
                    return [special]
                ids = tok.encode(req.prompt)
                bos = tok.bos_id
                return [bos, *ids] if req.add_special_tokens and bos is not None and bos >= 0 else ids

        ids = await run_in_threadpool(encode)
        info = self._info()
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": info.context_length})

    async def detokenize(self, request: Request, tally: _Tally) -> Response:
        req = parse(DetokenizeRequest, await self._body(request))
        tok = self._tokenizer()
        check_ids(req.tokens, self._info().vocab_size, param="tokens")

        def decode() -> str:
            with self._tokenizer_lock:
                return tok.decode(req.tokens)

        return JSONResponse({"prompt": await run_in_threadpool(decode)})

    # ----- generation ----------------------------------------------------------------------------

    async def completions(self, request: Request, tally: _Tally) -> Response:
        req = parse(CompletionRequest, await self._body(request))
        self._check_model(req.model)
        info = self._info()
        prompts = req.prompts()
        # Every prompt of ids checked before any runs: a stream never starts only to be refused.
        for p in prompts:
            if not isinstance(p, str):
                check_ids(p, info.vocab_size)
        limit = req.max_tokens if req.max_tokens is not None else COMPLETION_DEFAULT_TOKENS
        top = req.logprobs or 0
        specs = [
            ChoiceSpec(
                prompt=p if isinstance(p, str) else tuple(p),
                params=_params(req, seed),
                max_tokens=limit,
                top=top,
                logprobs=req.logprobs is not None,
                echo=req.echo,
                stops=req.stops(),
            )
            for p in prompts
            for seed in _seeds(req)
        ]
        return await self._answer(request, tally, specs, req, chat=False)

    async def chat(self, request: Request, tally: _Tally) -> Response:
        req = parse(ChatRequest, await self._body(request))
        self._check_model(req.model)
        self._info()
        messages, given = _conversation(req)
        top = req.top_logprobs or 0
        specs = [
            ChoiceSpec(
                prompt=messages,
                params=_params(req, seed),
                max_tokens=req.reply_limit(),
                top=top,
                logprobs=req.logprobs,
                stops=req.stops(),
                given=given,
            )
            for seed in _seeds(req)
        ]
        return await self._answer(request, tally, specs, req, chat=True)

    async def _answer(
        self, request: Request, tally: _Tally, specs: list[ChoiceSpec], req: Sampling, chat: bool
    ) -> Response:
        """Run ``specs`` and answer: a stream of chunks, or the whole completion (chat or text)."""
        run = _Run(self.host, specs, self.settings.deadline_s, tally)
        await run.start(request)
        model = self.settings.model_id
        request_id = shapes.new_id("chatcmpl" if chat else "cmpl")
        logprobs, with_ids = specs[0].logprobs, req.return_token_ids
        if req.stream:
            chunks = run.chat_chunks if chat else run.completion_chunks
            return _sse(chunks(request_id, model, logprobs, with_ids, req.include_usage()), run)
        make_choice = shapes.chat_choice if chat else shapes.completion_choice
        choices = [
            make_choice(i, o.text, o.tokens, o.finish.reason, logprobs=logprobs, with_ids=with_ids)
            async for i, o in run.outcomes()
        ]
        used = shapes.usage(tally.prompt_tokens, tally.completion_tokens)
        whole = shapes.chat_completion if chat else shapes.completion
        return JSONResponse(shapes.dump(whole(request_id, model, choices, used)))  # type: ignore[arg-type]


def _seeds(req: Sampling) -> list[int]:
    """Each choice's seed: the request's plus the choice's index (one drawn at random when none is
    given), so choice 0 with a seed is what ``nanoscope generate`` gives for it."""
    seed = req.seed if req.seed is not None else secrets.randbelow(2**31)
    return [(seed + k) % (SEED_MAX + 1) for k in range(req.n)]


def _params(req: Sampling, seed: int) -> SamplingParams:
    """The request's sampling, with ``seed``."""
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_k=max(0, req.top_k or 0),
            top_p=1.0 if req.top_p is None else req.top_p,
            min_p=req.min_p or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            seed=seed,
        )
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


def _conversation(req: ChatRequest) -> tuple[tuple[Message, ...], str]:
    """The messages as Nanoscope's, and the text a continued last assistant message gives."""
    messages = [
        Message.of_text("system" if m.role == "developer" else m.role, m.text()) for m in req.messages
    ]
    given = ""
    if req.continue_final_message:
        if messages[-1].role != "assistant":
            raise ApiError(
                400, "continue_final_message needs a last message from the assistant", param="messages"
            )
        given = messages.pop().plain_text()
        if not messages:
            raise ApiError(400, "continue_final_message needs a conversation before the assistant's message")
    elif not req.add_generation_prompt:
        raise ApiError(400, "add_generation_prompt false is supported with continue_final_message only")
    if messages[-1].role == "assistant":
        raise ApiError(400, "the last message is the assistant's: set continue_final_message to continue it")
    return tuple(messages), given


@dataclass
class _Outcome:
    text: str = ""
    tokens: list[TokenOut] = field(default_factory=list)
    finish: Finish = field(default_factory=lambda: Finish("length", 0, 0))


class _Run:
    """One request's jobs on the host: started (its first item awaited, so that a prompt the model
    refuses is a 4xx before any byte of a stream), then read within the request's deadline."""

    def __init__(self, host: ModelHost, specs: list[ChoiceSpec], deadline_s: float, tally: _Tally) -> None:
        self.host = host
        self.specs = specs
        self.deadline = time.monotonic() + deadline_s
        self.deadline_s = deadline_s
        self.tally = tally
        self.jobs: list[Job] = []
        self.cancel = threading.Event()
        self._first: Any = None
        self._streams: list[AsyncIterator[Any]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        self._watcher: asyncio.Future[None] | None = None
        self._client_left = False

    async def start(self, request: Request) -> None:
        loop = asyncio.get_running_loop()
        context = self.host.info.context_length if self.host.info else 0
        self.jobs, self.cancel = self.host.submit(
            [choice_work(s) for s in self.specs], loop, [s.positions(context) for s in self.specs]
        )
        # The deadline ends the jobs even while no one reads them: a stream whose client stopped
        # reading waits in its send, and never reaches the deadline of _next.
        self._timer = loop.call_later(max(self.deadline - time.monotonic(), 0.0), self._expire)
        # One watcher for the whole request: a client that leaves cancels its jobs, which then end
        # (a streamed reply's generator is also closed by Starlette when its send fails).
        self._watcher = asyncio.ensure_future(self._watch_client(request))
        self._streams = [job.results().__aiter__() for job in self.jobs]
        try:
            self._first = await self._next(0)
            if self._first is None:
                raise self._ended_early()
        except BaseException:
            self._close()
            raise

    def _expire(self) -> None:
        self._expired = True
        self.cancel.set()

    async def _watch_client(self, request: Request) -> None:
        await _disconnected(request)
        self._client_left = True
        self.cancel.set()

    def _ended_early(self) -> ApiError:
        """Why a job's items stopped before its Finish: its client left, its deadline passed, or
        the server is stopping."""
        if self._client_left:
            return ApiError(499, "the client disconnected")
        if self._expired:
            return self._late()
        return ApiError(503, "the server stopped before the reply was complete", kind="server_error")

    def _close(self) -> None:
        """Nothing more is read: whatever still runs or waits ends."""
        self.cancel.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()

    def _late(self) -> ApiError:
        return ApiError(504, f"the request's deadline of {self.deadline_s:g} s passed", kind="timeout")

    async def _next(self, index: int) -> Any:
        remaining = self.deadline - time.monotonic()
        try:
            return await asyncio.wait_for(self._streams[index].__anext__(), max(remaining, 0.001))
        except TimeoutError:
            self.cancel.set()
            raise self._late() from None
        except StopAsyncIteration:
            return None

    async def items(self) -> AsyncIterator[tuple[int, Any]]:
        """(choice index, item) for every item of every choice, in order; a Finish ends each."""
        try:
            for index in range(len(self.jobs)):
                while True:
                    if index == 0 and self._first is not None:
                        item, self._first = self._first, None
                    else:
                        item = await self._next(index)
                    if item is None:
                        raise self._ended_early()
                    if isinstance(item, Finish):
                        self.tally.prompt_tokens += item.prompt_tokens
                        self.tally.completion_tokens += item.completion_tokens
                    yield index, item
                    if isinstance(item, Finish):
                        break
        finally:
            self._close()

    async def outcomes(self) -> AsyncIterator[tuple[int, _Outcome]]:
        outcome = _Outcome()
        async for index, item in self.items():
            if isinstance(item, (Echo, Piece)):
                outcome.text += item.text
                outcome.tokens.extend(item.tokens)
            elif isinstance(item, Finish):
                outcome.finish = item
                yield index, outcome
                outcome = _Outcome()

    async def completion_chunks(
        self, request_id: str, model: str, logprobs: bool, with_ids: bool, include_usage: bool
    ) -> AsyncIterator[dict[str, Any]]:
        offsets: dict[int, int] = {}
        async for index, item in self.items():
            finish, text, tokens = _parts(item)
            offset = offsets.get(index, 0)
            offsets[index] = offset + sum(len(t.label) for t in tokens)
            choice = shapes.completion_choice(
                index,
                text or "",
                tokens,
                finish,
                logprobs=logprobs and not finish,
                with_ids=with_ids and not finish,
                offset=offset,
            )
            yield shapes.dump(shapes.completion(request_id, model, [choice], None))
        if include_usage:
            yield shapes.usage_chunk(
                request_id,
                model,
                shapes.usage(self.tally.prompt_tokens, self.tally.completion_tokens),
                chat=False,
            )

    async def chat_chunks(
        self, request_id: str, model: str, logprobs: bool, with_ids: bool, include_usage: bool
    ) -> AsyncIterator[dict[str, Any]]:
        started: set[int] = set()
        async for index, item in self.items():
            finish, text, tokens = _parts(item)
            chunk = shapes.chat_chunk(
                request_id,
                model,
                index,
                text,
                tokens,
                finish,
                logprobs=logprobs and not finish,
                with_ids=with_ids and not finish,
                first=index not in started,
            )
            started.add(index)
            yield shapes.dump(chunk)
        if include_usage:
            yield shapes.usage_chunk(
                request_id,
                model,
                shapes.usage(self.tally.prompt_tokens, self.tally.completion_tokens),
                chat=True,
            )


def _parts(item: Any) -> tuple[str | None, str | None, list[TokenOut]]:
    """A streamed item as (finish reason, text, tokens): a Finish has only its reason."""
    if isinstance(item, Finish):
        return item.reason, None, []
    return None, item.text, item.tokens


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body was read already, so only http.disconnect is left)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _sse(chunks: AsyncIterator[dict[str, Any]], run: _Run) -> StreamingResponse:
    """The chunks as server-sent events, then ``[DONE]``; an error mid-stream is one error event.
    A client that leaves closes the generator, and with it the request's jobs."""

    async def events() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield b"data: " + json.dumps(chunk, ensure_ascii=False).encode("utf-8") + b"\n\n"
        except ApiError as exc:
            run.tally.note = exc.message
            yield b"data: " + json.dumps(exc.body()).encode("utf-8") + b"\n\n"
        except Exception as exc:  # the stream ends with one error event, the server keeps serving
            logger.error("a streamed reply failed", exc_info=True)
            failed = ApiError(500, f"the server failed: {type(exc).__name__}", kind="server_error")
            run.tally.note = failed.message
            yield b"data: " + json.dumps(failed.body()).encode("utf-8") + b"\n\n"
        finally:
            run.cancel.set()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
