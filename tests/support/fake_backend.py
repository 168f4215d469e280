"""A small, deterministic Backend for controller and window tests (no torch, no weights).

It "tokenizes" by characters and answers ``<reply>`` to any prompt, one character a token, where
the reply is ``echo: <last user text>``. A user text containing ``calc`` gets a calculator call
and its forced result; ``fail`` makes the stream raise after two tokens; ``slow`` makes every
token wait on ``FakeBackend.gate`` (a threading.Event the test sets), so a test can act while a
reply is in flight without sleeping.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from desktop.engine.backend import (
    DEFAULT_STREAM,
    Capabilities,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    Progress,
    Prompt,
    StreamOptions,
)
from desktop.engine.errors import CheckpointError
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, TokenEvent
from desktop.engine.params import SamplingParams

CONTEXT = 200


class FakeBackend:
    gate = threading.Event()

    def __init__(self, path: Path, options: LoadOptions) -> None:
        self._info = ModelInfo(
            family="fake",
            path=str(path),
            name=f"fake/{path.name} · step {options.step}",
            source="folder",
            tag=path.name,
            step=options.step,
            parameters=1234,
            context_length=CONTEXT,
            device="cpu",
            device_name="CPU · fake",
            precision=options.dtype,
            capabilities=Capabilities(),
            era="F1",
            tokenizer="chars",
            vocab_size=256,
        )
        self.closed = False

    def info(self) -> ModelInfo:
        return self._info

    def render(
        self,
        conversation: Sequence[Message] | str,
        max_tokens: int | None,
        chat: bool | None = None,
        cancel: threading.Event | None = None,
    ) -> Prompt:
        turns = [conversation] if isinstance(conversation, str) else [m.plain_text() for m in conversation]
        budget = CONTEXT - min(max_tokens or 0, CONTEXT // 4)
        dropped = 0
        while sum(len(t) + 2 for t in turns[dropped:]) > budget and dropped < len(turns) - 1:
            dropped += 2
        text = "".join(f"[{t}]" for t in turns[dropped:])
        ids = tuple(ord(c) % 256 for c in text)
        last = conversation if isinstance(conversation, str) else tuple(conversation)[-1:]
        return Prompt(tuple(last) if not isinstance(last, str) else (), ids, len(ids), CONTEXT, dropped)

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        cancel: threading.Event,
        options: StreamOptions = DEFAULT_STREAM,
        stats: GenerationStats | None = None,
    ) -> Iterator[TokenEvent]:
        stats = stats if stats is not None else GenerationStats()
        stats.prompt_tokens = prompt.tokens
        user = prompt.messages[-1].plain_text() if prompt.messages else ""
        events = [TokenEvent(ord(c), c, False, TEXT) for c in f"echo: {user}"]
        if "calc" in user:
            events += [
                TokenEvent(1, "", False, PYTHON, "<|python_start|>"),
                *(TokenEvent(ord(c), c, False, PYTHON) for c in "6*7"),
                TokenEvent(2, "", False, PYTHON, "<|python_end|>"),
                TokenEvent(3, "", True, PYTHON_OUTPUT, "<|output_start|>"),
                TokenEvent(52, "42", True, PYTHON_OUTPUT),
                TokenEvent(4, "", True, PYTHON_OUTPUT, "<|output_end|>"),
            ]
        stats.stopped = "stop_token"
        for i, ev in enumerate(events):
            if params.max_tokens is not None and i >= params.max_tokens:
                stats.stopped = "max_tokens"
                break
            if "slow" in user:
                FakeBackend.gate.wait(30)
            if cancel.is_set():
                stats.stopped = "cancelled"
                break
            if "fail" in user and i == 2:
                raise RuntimeError("the fake model broke down")
            stats.new_tokens += 1
            yield replace(ev, logprob=-0.5, top=((ev.id, ev.text, -0.5),)) if options.logprobs else ev

    def score(
        self,
        prompt: Prompt,
        reply_ids: Sequence[int],
        top: int = 0,
        skip: Sequence[bool] | None = None,
        choices: Sequence[int] = (),
    ) -> dict[str, Any]:
        return {
            "mean_logprob": -0.5,
            "bits_per_byte": 1.0,
            "tokens": len(reply_ids),
            "token_logprobs": [-0.5] * len(reply_ids),
            **({"choice_logprobs": [-0.5] * len(choices)} if choices else {}),
        }

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 256 for c in text]

    def token_label(self, token_id: int) -> str:
        return chr(token_id) if token_id >= 32 else f"<{token_id}>"

    def close(self) -> None:
        self.closed = True


def open_fake(target: Path, options: LoadOptions, progress: Progress) -> FakeBackend:
    """An opener for ModelSlot/ModelWorker: a folder named ``broken`` fails like a corrupt file."""
    progress(50, "reading the fake")
    if target.name == "broken":
        raise CheckpointError(f"{target}: truncated or corrupt (fake)")
    return FakeBackend(target, options)
