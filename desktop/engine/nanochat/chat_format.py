"""Conversation → token ids, exactly as nanochat's ``render_conversation`` / ``render_for_completion``.

Layout (docs/ARCHITECTURE.md, Eras: Chat format)::

    <|bos|> <|user_start|> text <|user_end|> <|assistant_start|> parts <|assistant_end|> ...

A leading system message is merged into the first user message as ``system + "\\n\\n" + user``
(nanochat has no system role). Assistant parts render as: text → its tokens; python →
``<|python_start|> expr <|python_end|>``; python_output → ``<|output_start|> text <|output_end|>``.
Each part is encoded on its own, as nanochat does for list content.

Prompts that are too long lose their oldest user/assistant pairs first, so the model always sees
the system prompt and the question it must answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from desktop.engine.errors import TokenizerError
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message
from desktop.engine.nanochat.special_tokens import (
    ASSISTANT_END,
    ASSISTANT_START,
    CHAT_TOKENS,
    OUTPUT_END,
    OUTPUT_START,
    PYTHON_END,
    PYTHON_START,
    USER_END,
    USER_START,
)
from desktop.engine.nanochat.tokenizer import Tokenizer

_FRAME_TOKENS = 4  # <|bos|> <|user_start|> <|user_end|> <|assistant_start|>


@dataclass
class Rendered:
    """Prompt ids, plus what had to go to make them fit."""

    ids: list[int]
    dropped_turns: int = 0  # messages left out from the start of the conversation (always pairs)
    truncated: bool = False  # the last user message itself lost text from its front


# Calculator parts of an assistant message and the tokens around them.
_PART_DELIMS = {PYTHON: (PYTHON_START, PYTHON_END), PYTHON_OUTPUT: (OUTPUT_START, OUTPUT_END)}


class _Ids:
    """The special ids chat rendering needs, looked up once."""

    def __init__(self, tok: Tokenizer) -> None:
        if not tok.has_chat_tokens:
            names = ", ".join(CHAT_TOKENS)
            raise TokenizerError(
                f"{tok.path}: this tokenizer has no chat tokens ({names}); use completion mode"
            )
        self._tok = tok
        self.bos = tok.bos_id
        self.user_start, self.user_end = self.need(USER_START), self.need(USER_END)
        self.assistant_start, self.assistant_end = self.need(ASSISTANT_START), self.need(ASSISTANT_END)

    def need(self, name: str) -> int:
        found = self._tok.special_id(name)
        if found is None:
            raise TokenizerError(f"{self._tok.path}: chat rendering needs the {name} token, which is missing")
        return found


def _split_system(messages: Sequence[Message]) -> tuple[str | None, list[Message]]:
    """Separate a leading system message and check the rest alternates user/assistant."""
    system: str | None = None
    turns = list(messages)
    if turns and turns[0].role == "system":
        # An empty system prompt is treated as none, instead of rendering a bare "\n\n" prefix.
        system = turns.pop(0).plain_text() or None
    if not turns:
        raise ValueError("a conversation needs at least one user message")
    for i, m in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if m.role != expected:
            raise ValueError(
                f"message {i} is from {m.role!r} but should be from {expected!r} (roles must alternate)"
            )
    return system, turns


def _user_text(message: Message, system: str | None) -> str:
    text = message.plain_text()
    return text if system is None else system + "\n\n" + text


def _user_ids(tok: Tokenizer, sp: _Ids, text: str) -> list[int]:
    return [sp.user_start, *tok.encode(text), sp.user_end]


def _assistant_ids(tok: Tokenizer, sp: _Ids, message: Message) -> list[int]:
    ids = [sp.assistant_start]
    for part in message.parts:
        if part.kind == TEXT:
            ids += tok.encode(part.text)
        elif part.kind in (PYTHON, PYTHON_OUTPUT):
            start, end = _PART_DELIMS[part.kind]
            ids += [sp.need(start), *tok.encode(part.text), sp.need(end)]
        else:
            raise ValueError(f"an assistant part of kind {part.kind!r} has no nanochat chat rendering")
    ids.append(sp.assistant_end)
    return ids


def _turn_ids(tok: Tokenizer, sp: _Ids, message: Message, system: str | None) -> list[int]:
    if message.role == "user":
        return _user_ids(tok, sp, _user_text(message, system))
    return _assistant_ids(tok, sp, message)


def render_conversation(tok: Tokenizer, messages: Sequence[Message]) -> list[int]:
    """The whole conversation, without a generation prompt and without truncation."""
    sp = _Ids(tok)
    system, turns = _split_system(messages)
    ids = [sp.bos]
    for i, message in enumerate(turns):
        ids += _turn_ids(tok, sp, message, system if i == 0 else None)
    return ids


def render_for_completion(tok: Tokenizer, messages: Sequence[Message], max_tokens: int | None) -> Rendered:
    """The conversation (ending with a user message) followed by ``<|assistant_start|>``.

    If it is longer than ``max_tokens``, the oldest user/assistant pairs are dropped (the system
    prompt is kept, merged into the first remaining user message). If the last user message alone
    still does not fit, its tokens are cut from the front. Never raises for length; with
    ``max_tokens`` below 4 the 4-token frame around an empty message is the best it can return.
    """
    sp = _Ids(tok)
    system, turns = _split_system(messages)
    if turns[-1].role != "user":
        raise ValueError("the conversation must end with a user message to prompt a reply")
    # Every turn but the first kept one renders the same whatever is dropped before it.
    plain = [_turn_ids(tok, sp, m, None) for m in turns]
    tail_len = [0] * (len(turns) + 1)
    for i in range(len(turns) - 1, -1, -1):
        tail_len[i] = tail_len[i + 1] + len(plain[i])
    for first in range(0, len(turns), 2):
        head = plain[first] if system is None else _turn_ids(tok, sp, turns[first], system)
        total = 1 + len(head) + tail_len[first + 1] + 1
        if max_tokens is None or total <= max_tokens:
            ids = [sp.bos, *head]
            for turn in plain[first + 1 :]:
                ids += turn
            ids.append(sp.assistant_start)
            return Rendered(ids, dropped_turns=first)
    content = tok.encode(_user_text(turns[-1], system))
    assert max_tokens is not None  # with no limit the first attempt above always fits
    keep = max(0, max_tokens - _FRAME_TOKENS)
    ids = [sp.bos, sp.user_start, *content[len(content) - keep :], sp.user_end, sp.assistant_start]
    return Rendered(ids, dropped_turns=len(turns) - 1, truncated=True)


def render_completion_prompt(tok: Tokenizer, text: str, max_tokens: int | None) -> Rendered:
    """``<bos>`` + ``text`` for base models and the C++ tokenizer; keeps the end of ``text`` if too long."""
    content = tok.encode(text)
    if max_tokens is None or 1 + len(content) <= max_tokens:
        return Rendered([tok.bos_id, *content])
    keep = max(0, max_tokens - 1)
    return Rendered([tok.bos_id, *content[len(content) - keep :]], truncated=True)
