"""Choices and chunks in OpenAI's wire format, built with the ``openai`` package's own types
(Qt-free).

Beyond OpenAI's fields, as vLLM does, a choice asked with ``return_token_ids`` carries
``token_ids``; Nanoscope adds ``forced`` beside them, true where the calculator forced the token.
A completion's ``top_logprobs`` include the chosen token, as vLLM's do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob
from openai.types.completion_choice import Logprobs

from desktop.engine.serve.replies import TokenOut


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def completion_logprobs(tokens: Sequence[TokenOut], offset: int) -> Logprobs:
    """``tokens`` as a completion's logprobs, their text offsets counted from ``offset``."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.label)
    tops: list[dict[str, float] | None] = []
    for t in tokens:
        if t.logprob is None:
            tops.append(None)
            continue
        top = {t.label: t.logprob}
        top.update({label: lp for label, lp in t.top if label not in top})
        tops.append(top)
    # Constructed unvalidated: the SDK's type has no None in its lists, but the API itself (and
    # lm-evaluation-harness after it) gives the first echoed token no log-probability.
    return Logprobs.model_construct(
        tokens=[t.label for t in tokens],
        token_logprobs=[t.logprob for t in tokens],
        top_logprobs=tops,
        text_offset=offsets,
    )


def _ids_fields(tokens: Sequence[TokenOut], with_ids: bool) -> dict[str, Any]:
    if not with_ids:
        return {}
    return {"token_ids": [t.id for t in tokens], "forced": [t.forced for t in tokens]}


def completion_choice(
    index: int,
    text: str,
    tokens: Sequence[TokenOut],
    finish: str | None,
    *,
    logprobs: bool,
    with_ids: bool,
    offset: int = 0,
) -> CompletionChoice:
    # Unvalidated, as Logprobs: a streamed chunk's choice has no finish_reason yet.
    return CompletionChoice.model_construct(
        index=index,
        text=text,
        finish_reason=finish,  # type: ignore[arg-type]
        logprobs=completion_logprobs(tokens, offset) if logprobs else None,
        **_ids_fields(tokens, with_ids),
    )


def completion(
    request_id: str, model: str, choices: list[CompletionChoice], used: CompletionUsage | None
) -> Completion:
    return Completion(
        id=request_id,
        object="text_completion",
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=used,
    )


def chat_logprobs(tokens: Sequence[TokenOut]) -> list[ChatCompletionTokenLogprob]:
    return [
        ChatCompletionTokenLogprob(
            token=t.label,
            bytes=list(t.label.encode("utf-8")),
            logprob=t.logprob if t.logprob is not None else 0.0,
            top_logprobs=[
                TopLogprob(token=label, bytes=list(label.encode("utf-8")), logprob=lp) for label, lp in t.top
            ],
        )
        for t in tokens
    ]


def chat_choice(
    index: int, text: str, tokens: Sequence[TokenOut], finish: str, *, logprobs: bool, with_ids: bool
) -> ChatChoice:
    return ChatChoice(
        index=index,
        message=ChatCompletionMessage(role="assistant", content=text),
        finish_reason=finish,  # type: ignore[arg-type]
        logprobs=ChoiceLogprobs(content=chat_logprobs(tokens)) if logprobs else None,
        **_ids_fields(tokens, with_ids),
    )


def chat_completion(
    request_id: str, model: str, choices: list[ChatChoice], used: CompletionUsage
) -> ChatCompletion:
    return ChatCompletion(
        id=request_id,
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=used,
    )


def chat_chunk(
    request_id: str,
    model: str,
    index: int,
    text: str | None,
    tokens: Sequence[TokenOut],
    finish: str | None,
    *,
    logprobs: bool,
    with_ids: bool,
    first: bool = False,
) -> ChatCompletionChunk:
    choice = ChunkChoice(
        index=index,
        delta=ChoiceDelta(role="assistant" if first else None, content=text),
        finish_reason=finish,  # type: ignore[arg-type]
        logprobs=ChunkLogprobs(content=chat_logprobs(tokens)) if logprobs and tokens else None,
        **_ids_fields(tokens, with_ids),
    )
    return ChatCompletionChunk(
        id=request_id, object="chat.completion.chunk", created=int(time.time()), model=model, choices=[choice]
    )


def usage_chunk(request_id: str, model: str, used: CompletionUsage, chat: bool) -> dict[str, Any]:
    """The last chunk of a stream asked with ``include_usage``: no choices, the request's usage."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {
        "id": request_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": used.model_dump(),
    }


def dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump(mode="json")
