"""One choice of a served request, run on the model thread: its prompt, its optional echo, and its
reply as pieces of text with the tokens behind them (Qt-free).

The pieces are what a client receives. A token's text is what it added to the reply; a special
token the model wrote inside its reply (nanochat's calculator delimiters, the fork's tool tokens)
reads as its name there, as the model's own format writes it, while the token that ends the reply
adds nothing. Tokens the calculator forced are marked ``forced``. Stop strings end the reply
where they begin; text that might be the start of one is held back until the next token shows
whether it is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from desktop.engine.backend import Backend, GenerationStats, Prompt, ReplyStart, StreamOptions
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SamplingParams
from desktop.engine.serve.wire import ApiError, check_ids


@dataclass(frozen=True)
class TokenOut:
    """One token as a client sees it."""

    id: int
    label: str  # how it reads on its own (a special token by name)
    logprob: float | None
    top: tuple[tuple[str, float], ...]  # (label, log-probability), most likely first
    forced: bool = False


@dataclass
class Piece:
    """What the reply gained since the last piece: released text and the tokens that came."""

    text: str
    tokens: list[TokenOut] = field(default_factory=list)


@dataclass(frozen=True)
class Echo:
    """The prompt itself, for ``echo``: its text and tokens (the first has no log-probability)."""

    text: str
    tokens: list[TokenOut]


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ChoiceSpec:
    """What one choice asks of the model."""

    prompt: str | tuple[int, ...] | tuple[Message, ...]  # completion text, token ids, or a chat
    params: SamplingParams  # its max_tokens is not used: see max_tokens
    max_tokens: int | None = None  # None: the rest of the context; 0: no reply (an echo alone)
    top: int = 0  # alternatives per token
    logprobs: bool = False  # each token's own log-probability
    echo: bool = False
    stops: tuple[str, ...] = ()
    given: str = ""  # a chat reply that begins with this text (continue_final_message)

    def positions(self, context: int) -> int:
        """The cache positions this choice may take, estimated before its prompt is tokenized (a
        token is rarely under two characters): what the host admits side by side by."""
        p = self.prompt
        if isinstance(p, str):
            prompt = len(p) // 2 + 1
        elif p and isinstance(p[0], Message):
            prompt = sum(len(m.plain_text()) // 2 + 8 for m in p)  # type: ignore[union-attr]
        else:
            prompt = len(p)
        reply = context if self.max_tokens is None else self.max_tokens
        return min(context, prompt + len(self.given) // 2 + reply)


class ReplyText:
    """Token events in, pieces out, stop strings applied (see the module docstring)."""

    def __init__(self, stops: Sequence[str], stop_ids: frozenset[int]) -> None:
        self.stops = tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.stop_ids = stop_ids
        self.pending = ""
        self.stopped = False  # a stop string ended the reply
        self.tokens = 0

    def push(self, ev: TokenEvent, token: TokenOut | None) -> Piece | None:
        if ev.given:
            return None
        text = ev.text
        if ev.special is not None and ev.id not in self.stop_ids and not ev.continues:
            text += ev.special
        tokens = [] if token is None or ev.continues else [token]
        self.tokens += len(tokens)
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            released, self.pending = self.pending[:cut], ""
            return Piece(released, tokens)
        keep = min(self.hold, len(self.pending))
        released = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(released) :]
        return Piece(released, tokens) if released or tokens else None

    def finish(self) -> str:
        rest, self.pending = self.pending, ""
        return rest


def choice_work(spec: ChoiceSpec):
    """The job for one choice (see host.Work): yields an Echo (when asked), Pieces, then a Finish."""

    def work(backend: Backend, cancel: threading.Event, reuse_cache: bool) -> Iterator[object]:
        prompt = _prompt(backend, spec)
        context = prompt.context_length or prompt.tokens
        if prompt.tokens > context:
            raise ApiError(
                400,
                f"the prompt has {prompt.tokens} tokens; this model's context is {context}",
                param="prompt",
            )
        if spec.echo:
            yield _echo(backend, prompt, spec.top, spec.logprobs)
        asked = spec.max_tokens
        if asked == 0:
            yield Finish("length", prompt.tokens, 0)
            return
        room = context - prompt.tokens
        if room <= 0:
            raise ApiError(
                400, f"the prompt fills this model's context of {context} tokens; no room for a reply"
            )
        params = spec.params.with_values(max_tokens=min(asked or room, room))
        yield from _reply(backend, prompt, params, spec, cancel, reuse_cache)

    return work


def _reply(
    backend: Backend,
    prompt: Prompt,
    params: SamplingParams,
    spec: ChoiceSpec,
    cancel: threading.Event,
    reuse_cache: bool,
) -> Iterator[object]:
    stats = GenerationStats()
    computed = max(spec.top, 1) if spec.logprobs else 0
    start = ReplyStart(given_text=spec.given) if spec.given else None
    options = StreamOptions(logprobs=computed, start=start, reuse_cache=reuse_cache)
    text = ReplyText(spec.stops, backend.tokenizer().stop_ids)
    events = backend.stream(prompt, params, cancel, options, stats)
    try:
        for ev in events:
            token = None if ev.continues or ev.given else _token(backend, ev, spec.top)
            piece = text.push(ev, token)
            if piece is not None:
                yield piece
            if text.stopped:
                break
    finally:
        events.close()  # type: ignore[attr-defined]
    rest = text.finish()
    if rest:
        yield Piece(rest)
    stopped = text.stopped or stats.stopped == "stop_token"
    yield Finish("stop" if stopped else "length", prompt.tokens, text.tokens)


def _token(backend: Backend, ev: TokenEvent, top: int) -> TokenOut:
    alternatives = tuple((label, lp) for _id, label, lp in (ev.top or ())[:top])
    return TokenOut(ev.id, backend.token_label(ev.id), ev.logprob, alternatives, ev.forced)


def _prompt(backend: Backend, spec: ChoiceSpec) -> Prompt:
    info = backend.info()
    p = spec.prompt
    if isinstance(p, str):
        return backend.render(p, None, chat=False)
    if p and isinstance(p[0], Message):
        try:
            return backend.render(list(p), None, chat=True)  # type: ignore[arg-type]
        except ValueError as exc:  # the conversation's shape (no user message, roles not alternating)
            raise ApiError(400, str(exc), param="messages") from None
    ids = [int(i) for i in p]  # type: ignore[arg-type]
    check_ids(ids, info.vocab_size)
    return Prompt((), tuple(ids), len(ids), info.context_length)


def _echo(backend: Backend, prompt: Prompt, top: int, logprobs: bool) -> Echo:
    """The prompt's own tokens, with their log-probabilities when asked (teacher forcing: each
    token scored after the ones before it)."""
    ids = prompt.require_ids()
    text = backend.tokenizer().decode(ids)
    labels = [backend.token_label(i) for i in ids]
    if not logprobs or len(ids) < 2:
        return Echo(text, [TokenOut(i, label, None, ()) for i, label in zip(ids, labels, strict=True)])
    first = Prompt((), tuple(ids[:1]), 1, prompt.context_length)
    scored = backend.score(first, ids[1:], top=top)
    tops = scored.get("top") or [[] for _ in ids[1:]]
    tokens = [TokenOut(ids[0], labels[0], None, ())]
    for i, label, lp, alternatives in zip(ids[1:], labels[1:], scored["token_logprobs"], tops, strict=True):
        tokens.append(TokenOut(i, label, lp, tuple((str(a[1]), float(a[2])) for a in alternatives)))
    return Echo(text, tokens)
