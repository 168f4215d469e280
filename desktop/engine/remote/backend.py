"""A model served over the OpenAI-compatible HTTP API (vLLM, SGLang, llama-server, ``transformers
serve``) behind the :class:`~desktop.engine.backend.Backend` seam (Qt-free, torch-free).

Opening a model lists the server's models (context length, a missing model named at once) and
sends one streamed one-token request carrying every optional field. The answer tells what the
server accepts: a 400/422 naming ``top_k`` (``transformers serve``) means it is left out from
then on, remembered per server for the session; whether log-probabilities and token ids come
back sets ``capabilities``. Later requests relearn the same way if a server changes its mind.

Replies stream over SSE on the worker thread (see ``remote_sse``); Stop closes the stream. The
server tokenizes, so a prompt has no ids and its length is an estimate until ``usage`` says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx

from desktop.engine.backend import (
    SHA256_PREFIX,
    Capabilities,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    Progress,
    Prompt,
    StreamOptions,
)
from desktop.engine.messages import TEXT, Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.engine.remote.events import ChunkReader
from desktop.engine.remote.http import (
    CONNECT_TIMEOUT_S,
    RemoteError,
    ServedModel,
    api_root,
    headers,
    list_models,
    named_fields,
    where,
)
from desktop.engine.remote.servers import ServerEndpoint, directory, parse_target, refusals
from desktop.engine.remote.sse import EventStream
from desktop.engine.remote.steps import Cancelled, StepRunner

logger = logging.getLogger(__name__)

FIRST_BYTE_TIMEOUT_S = 120.0  # a server may load the model or prefill a long prompt first
STALL_TIMEOUT_S = 30.0  # the default pause allowed between two events of a reply
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
CHARS_PER_TOKEN = 4  # a prompt's length before the server has counted it
# Fields a server may refuse; the rest (model, messages/prompt, stream, max_tokens, temperature,
# top_p) every OpenAI-compatible server takes.
OPTIONAL_FIELDS = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "logprobs",
    "top_logprobs",
    "return_token_ids",
    "stream_options",
    "continue_final_message",
    "add_generation_prompt",
)
# A chat reply that begins already (a fork, a continuation) goes as a last assistant message the
# server continues: vLLM and SGLang take these fields; llama-server continues a trailing assistant
# message by itself.
CONTINUE_FIELDS = {"continue_final_message": True, "add_generation_prompt": False}
CONTINUE_REASON = "the server refuses continue_final_message: it cannot continue a reply"
ALWAYS_KNOBS = frozenset({"temperature", "top_p", "max_tokens"})
OPTIONAL_KNOBS = ("top_k", "min_p", "repetition_penalty", "seed")
SCORING_REASON = "the server gives no prompt log-probabilities to score a given reply with"
LOGPROBS_REASON = (
    "the server returns no token probabilities (vLLM and SGLang do; transformers serve does not)"
)
DRAFT_REASON = "speculative decoding runs on the server (vLLM's and SGLang's own), not here"
IDS_REASON = "the server gives text only, no token ids (vLLM does with return_token_ids)"


@dataclass(frozen=True)
class RemotePrompt(Prompt):
    """A prompt for a server: the messages (chat) or ``text`` (completion); the server tokenizes."""

    text: str | None = None


class RemoteBackend:
    """One model on one server. Every method runs on the thread that opened it (its loop's)."""

    def __init__(
        self,
        endpoint: ServerEndpoint,
        model: str,
        target: str,
        served: ServedModel | None,
        stall_timeout: float,
    ) -> None:
        self.endpoint = endpoint
        self.model = model
        self.target = target
        self.root = api_root(endpoint.url)
        self.served = served
        self.stall_timeout = stall_timeout
        self.chat_mode = True
        self.gives_logprobs = False
        self.gives_ids = False
        self._refused_seen: frozenset[str] = frozenset()  # what the last request left out
        self._runner = StepRunner()
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(
                None, connect=CONNECT_TIMEOUT_S, write=CONNECT_TIMEOUT_S, pool=CONNECT_TIMEOUT_S
            ),
            trust_env=False,
        )
        self._info = self._describe()

    # ----- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, target: str, options: LoadOptions | None = None, progress: Progress | None = None
    ) -> RemoteBackend:
        opts = options or LoadOptions()
        server_id, model = parse_target(target)
        endpoint = _endpoint(server_id, opts)
        report = progress or (lambda _p, _m: None)
        report(10, f"asking {where(endpoint.url)} for its models")
        served = _find_model(endpoint, model)
        stall = opts.stall_timeout or endpoint.stall_timeout or STALL_TIMEOUT_S
        backend = cls(endpoint, model, target, served, stall)
        report(50, f"checking what {where(endpoint.url)} accepts")
        try:
            backend.probe()
        except BaseException:
            backend.close()
            raise
        report(100, "ready")
        return backend

    def probe(self, cancel: threading.Event | None = None) -> None:
        """One streamed one-token request with every optional field: learns what the server
        refuses, whether it gives log-probabilities and ids, and whether it has a chat format."""
        cancel = cancel or threading.Event()
        hello = RemotePrompt((Message.of_text("user", "Hi"),), None, 1, self._info.context_length)
        params = SamplingParams(temperature=0.0, top_k=1, min_p=0.05, repetition_penalty=1.05, max_tokens=1)
        try:
            reader = self._consume(hello, params, cancel, top=1)
        except RemoteError as exc:
            if exc.status not in (400, 422) or "template" not in exc.detail.lower():
                raise
            logger.info("%s: no chat template, completing text instead", self._info.name)
            self.chat_mode = False
            reader = self._consume(RemotePrompt((), None, 1, 0, text="Hi"), params, cancel, top=1)
        self.gives_logprobs = reader.saw_logprobs
        self.gives_ids = reader.saw_ids
        self._info = self._describe()

    def _consume(
        self, prompt: RemotePrompt, params: SamplingParams, cancel: threading.Event, top: int
    ) -> ChunkReader:
        reader = ChunkReader(chat=prompt.text is None, top=top)
        for _ev in self._events(prompt, params, cancel, top, GenerationStats(), reader):
            pass
        return reader

    def _describe(self) -> ModelInfo:
        refused = refusals.get(self.root)
        knobs = ALWAYS_KNOBS | {k for k in OPTIONAL_KNOBS if k not in refused}
        unavailable = [("scoring", SCORING_REASON), ("draft", DRAFT_REASON)]
        if not self.gives_logprobs:
            unavailable.append(("logprobs", LOGPROBS_REASON))
        if not self.gives_ids:
            unavailable.append(("token_ids", IDS_REASON))
        if "seed" in refused:
            unavailable.append(("seed", "the server refuses a seed: sampled replies do not repeat"))
        ignored = sorted(k for k in OPTIONAL_KNOBS if k in refused and k != "seed")
        if ignored:
            unavailable.append(("sampling", f"the server refuses {', '.join(ignored)}"))
        return ModelInfo(
            family="remote",
            path=self.target,
            name=f"{self.endpoint.name or where(self.root)} · {self.model}",
            source="remote",
            tag=self.model,
            step=None,
            parameters=0,
            context_length=self.served.context_length if self.served else 0,
            device="remote",
            device_name=f"{self.endpoint.name or 'server'} at {where(self.root)}",
            precision="served",
            capabilities=Capabilities(
                token_ids=self.gives_ids,
                logprobs=self.gives_logprobs,
                seed="seed" not in refused,
                sampling=frozenset(knobs),
                scoring=False,
                chat=self.chat_mode,
                unavailable=tuple(unavailable),
            ),
            era="served",
            tokenizer=self._tokenizer_identity(),
            tokenizer_kind="server",
            vocab_size=self.served.vocab_size if self.served else 0,
        )

    def _tokenizer_identity(self) -> str:
        """The digest a server states of its tokenizer file (``nanoscope serve``), else the model on
        this server (equal only for the same model on the same server)."""
        if self.served is not None and self.served.tokenizer_sha256:
            return SHA256_PREFIX + self.served.tokenizer_sha256
        return f"{self.root}#{self.model}"

    def info(self) -> ModelInfo:
        return self._info

    # ----- prompts -------------------------------------------------------------------------------

    def render(
        self,
        conversation: Sequence[Message] | str,
        max_tokens: int | None,
        chat: bool | None = None,
        cancel: threading.Event | None = None,
    ) -> Prompt:
        """The messages as they go to the server (it applies its own chat template); nothing is
        dropped here: a server answers a prompt that does not fit with a readable 400."""
        ctx = self._info.context_length
        if chat and not self.chat_mode:
            raise RemoteError(f"{self._info.name} has no chat format on the server; it completes text")
        if isinstance(conversation, str):
            return RemotePrompt((), None, _estimate(conversation), ctx, text=conversation)
        messages = tuple(conversation)
        if chat or (chat is None and self.chat_mode):
            return RemotePrompt(messages, None, _estimate("".join(m.plain_text() for m in messages)), ctx)
        text = "".join(m.plain_text() for m in messages if m.role != "system")
        return RemotePrompt(messages, None, _estimate(text), ctx, text=text)

    # ----- generation ----------------------------------------------------------------------------

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        cancel: threading.Event,
        options: StreamOptions | None = None,
        stats: GenerationStats | None = None,
    ) -> Iterator[TokenEvent]:
        """Stream the reply; Stop closes the connection (the server ends the generation)."""
        options = options or StreamOptions()
        if not isinstance(prompt, RemotePrompt):
            raise RemoteError(f"{self._info.name} is served: it takes text, not token ids")
        start = options.start
        if start is not None:
            prompt = _continued(prompt, start.said_text, start.given_text)
            if start.given_text:
                # The user's words, as the first piece of the reply (the server will not echo them).
                yield TokenEvent(-1, start.given_text, False, TEXT, given=True)
        stats = stats if stats is not None else GenerationStats()
        top = min(max(0, options.logprobs), MAX_TOP_LOGPROBS)
        reader = ChunkReader(chat=prompt.text is None, top=top)
        yield from self._events(prompt, params, cancel, top, stats, reader)
        if refusals.get(self.root) != self._refused_seen:
            self._info = self._describe()

    def _events(
        self,
        prompt: RemotePrompt,
        params: SamplingParams,
        cancel: threading.Event,
        top: int,
        stats: GenerationStats,
        reader: ChunkReader,
    ) -> Iterator[TokenEvent]:
        stats.prompt_tokens = prompt.tokens
        stats.prefilled_tokens = prompt.tokens
        t0 = time.perf_counter()
        stats.stopped = ""
        try:
            stream = self._open_stream(prompt, params, cancel, top)
        except Cancelled:
            stats.stopped = "cancelled"
            return
        t_first = t_last = None
        # The client's own limit: a server that ignores max_tokens is cut off there.
        limit = params.max_tokens
        payloads = stream.payloads()
        try:
            for payload in payloads:
                events = reader.read(payload)
                if events:
                    stream.progressed()
                for ev in events:
                    now = time.perf_counter()
                    if t_first is None:
                        t_first = now
                        stats.ttft_ms = (now - t0) * 1000
                    t_last = now
                    stats.new_tokens = reader.tokens
                    yield ev
                if cancel.is_set():
                    raise Cancelled
                if limit is not None and reader.tokens >= limit and reader.finish_reason is None:
                    reader.finish_reason = "length"
                    break
        except Cancelled:
            stats.stopped = "cancelled"
        else:
            if not stream.done and reader.finish_reason is None:
                raise RemoteError(f"{where(self.root)} ended the stream before the reply was complete")
        finally:
            # Closed here, on every path: its own finally closes the event source and the
            # response now, instead of leaving an async generator for the garbage collector
            # ("Task was destroyed but it is pending!").
            payloads.close()
        yield from reader.finish()
        usage = reader.usage
        if isinstance(usage.get("prompt_tokens"), int):
            stats.prompt_tokens = stats.prefilled_tokens = usage["prompt_tokens"]
        completion = usage.get("completion_tokens")
        count = completion if isinstance(completion, int) else reader.tokens
        stats.new_tokens = count
        if t_first is not None and t_last is not None and count > 1 and t_last > t_first:
            stats.decode_tok_s = (count - 1) / (t_last - t_first)
        if stats.stopped != "cancelled":
            stats.stopped = {"stop": "stop_token", "length": "max_tokens"}.get(
                reader.finish_reason or "", reader.finish_reason or ""
            )

    def _open_stream(
        self, prompt: RemotePrompt, params: SamplingParams, cancel: threading.Event, top: int
    ) -> EventStream:
        """The open stream; a 400/422 naming fields we may leave out is learnt and retried."""
        chat = prompt.text is None
        for _attempt in range(len(OPTIONAL_FIELDS) + 1):
            self._refused_seen = refusals.get(self.root)
            body = self._body(prompt, params, top, self._refused_seen)
            stream = EventStream(
                self._runner,
                self._client,
                f"{self.root}/{'chat/completions' if chat else 'completions'}",
                body,
                headers(self.endpoint.api_key),
                first_byte_timeout=FIRST_BYTE_TIMEOUT_S,
                stall_timeout=self.stall_timeout,
                cancel=cancel,
                model=self.model,
                api_key=self.endpoint.api_key,
            )
            try:
                stream.open()
                return stream
            except RemoteError as exc:
                optional = tuple(k for k in OPTIONAL_FIELDS if k in body)
                named = named_fields(exc.detail, optional) if exc.status in (400, 422) else set()
                if not named:
                    raise
                logger.info("%s refuses %s; leaving them out from now on", where(self.root), sorted(named))
                refusals.add(self.root, named)
        raise RemoteError(f"{where(self.root)} keeps refusing the request's fields")

    def _body(
        self, prompt: RemotePrompt, params: SamplingParams, top: int, refused: frozenset[str]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if prompt.text is None:
            body["messages"] = [{"role": m.role, "content": m.plain_text()} for m in prompt.messages]
            if prompt.messages and prompt.messages[-1].role == "assistant":
                if refused & CONTINUE_FIELDS.keys():
                    raise RemoteError(f"{where(self.root)}: {CONTINUE_REASON}")
                body.update(CONTINUE_FIELDS)
        else:
            body["prompt"] = prompt.text
        if params.max_tokens is not None:
            body["max_tokens"] = params.max_tokens
        optional: dict[str, Any] = {
            "seed": params.seed,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if params.top_k > 0:
            optional["top_k"] = params.top_k
        if params.min_p > 0:
            optional["min_p"] = params.min_p
        if params.repetition_penalty != 1.0:
            optional["repetition_penalty"] = params.repetition_penalty
        if prompt.text is None and (top > 0 or self.gives_logprobs):
            # Asked for on every chat reply of a server that gives them: their bytes let a
            # reply that ends inside a character end as the tokenizer decodes it.
            optional["logprobs"] = True
            if top > 0:
                optional["top_logprobs"] = top
        elif top > 0:
            optional["logprobs"] = top
        body.update({k: v for k, v in optional.items() if k not in refused})
        return body

    # ----- the rest of the seam ------------------------------------------------------------------

    def score(
        self,
        prompt: Prompt,
        reply_ids: Sequence[int],
        top: int = 0,
        skip: Sequence[bool] | None = None,
        choices: Sequence[int] = (),
    ) -> dict[str, Any]:
        raise RemoteError(f"{self._info.name}: {SCORING_REASON}")

    def token_label(self, token_id: int) -> str:
        return f"[{token_id}]" if token_id >= 0 else ""

    def encode(self, text: str) -> list[int]:
        raise RemoteError(f"{self._info.name}: {IDS_REASON}")

    def tokenizer(self) -> NoReturn:
        raise RemoteError(f"{self._info.name}: {IDS_REASON}")

    def close(self) -> None:
        """Close the connection pool and the private loop (on the thread that opened them)."""
        if self._runner.loop.is_closed():
            return
        try:
            self._runner.run(self._client.aclose(), CONNECT_TIMEOUT_S)
        except Exception:  # closing must not fail an unload; the loop goes either way
            logger.debug("closing the client of %s failed", where(self.root), exc_info=True)
        self._runner.close()


def _continued(prompt: RemotePrompt, said: str, given: str) -> RemotePrompt:
    """``prompt`` with the reply's start: appended to a completion's text, or as a last
    assistant message of a chat for the server to continue."""
    start = said + given
    if prompt.text is not None:
        text = prompt.text + start
        return RemotePrompt((), None, _estimate(text), prompt.context_length, text=text)
    messages = (*prompt.messages, Message.of_text("assistant", start))
    return RemotePrompt(messages, None, prompt.tokens + _estimate(start), prompt.context_length)


def _estimate(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


def _endpoint(server_id: str, opts: LoadOptions) -> ServerEndpoint:
    if opts.server_url:
        return ServerEndpoint(server_id, opts.server_name, opts.server_url, opts.api_key, opts.stall_timeout)
    endpoint = directory.lookup(server_id)
    if endpoint is None:
        raise RemoteError(f"no server {server_id!r} is set up: add it in Settings › Servers")
    return endpoint


def _find_model(endpoint: ServerEndpoint, model: str) -> ServedModel | None:
    """The model's entry in the server's list. A server that lists nothing, or whose list fails
    (``transformers serve`` without a hub cache answers 500), may still serve it: the probe tells."""
    try:
        models = list_models(endpoint.url, endpoint.api_key)
    except RemoteError as exc:
        if exc.status is None or exc.status in (401, 403):
            raise
        logger.info("model list of %s unavailable: %s", where(endpoint.url), exc)
        return None
    found = next((m for m in models if m.name == model), None)
    if found is None and models:
        names = ", ".join(m.name for m in models[:5]) + (" …" if len(models) > 5 else "")
        raise RemoteError(f"{where(endpoint.url)} has no model named {model!r}; it serves {names}")
    return found
