"""Chats and prose as token ids with nanochat's loss mask, and batches of them."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from desktop.engine.messages import PYTHON, TEXT, Message
from desktop.engine.nanochat.special_tokens import (
    ASSISTANT_END,
    ASSISTANT_START,
    OUTPUT_END,
    OUTPUT_START,
    PYTHON_END,
    PYTHON_START,
    USER_END,
    USER_START,
)
from desktop.engine.nanochat.tokenizer import TiktokenTokenizer

from .data import Exchange, messages


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 where the token is a training target


def render_chat(tok: TiktokenTokenizer, chat: Sequence[Message]) -> Example:
    """nanochat's ``render_conversation``: ids plus the mask of the assistant tokens to train on.

    The calculator's output span (``<|output_start|>`` … ``<|output_end|>``) is not trained on:
    at inference the engine forces those tokens from the calculator.
    """
    ids, mask = [tok.bos_id], [0]

    def sid(name: str) -> int:
        found = tok.special_id(name)
        if found is None:
            raise ValueError(f"{tok.path}: the tokenizer has no {name}")
        return found

    def add(tokens: Sequence[int], supervised: int) -> None:
        ids.extend(tokens)
        mask.extend([supervised] * len(tokens))

    for m in chat:
        if m.role == "user":
            add([sid(USER_START), *tok.encode(m.plain_text()), sid(USER_END)], 0)
            continue
        add([sid(ASSISTANT_START)], 0)
        for part in m.parts:
            body = tok.encode(part.text)
            if part.kind == TEXT:
                add(body, 1)
            elif part.kind == PYTHON:
                add([sid(PYTHON_START), *body, sid(PYTHON_END)], 1)
            else:
                add([sid(OUTPUT_START), *body, sid(OUTPUT_END)], 0)
        add([sid(ASSISTANT_END)], 1)
    return Example(ids, mask)


def render_fitting(tok: TiktokenTokenizer, chat: Sequence[Exchange], limit: int) -> Example | None:
    """The chat rendered with as many exchanges as fit in ``limit`` tokens (None if not even one)."""
    for n in range(len(chat), 0, -1):
        example = render_chat(tok, messages(chat[:n]))
        if len(example.ids) <= limit:
            return example
    return None


def render_document(tok: TiktokenTokenizer, text: str, limit: int) -> Example:
    ids = [tok.bos_id, *tok.encode(text)][:limit]
    return Example(ids, [0] + [1] * (len(ids) - 1))


def collate(examples: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (-1 where not trained on), right-padded to the longest example."""
    T = max(len(e.ids) for e in examples) - 1
    x = torch.full((len(examples), T), pad_id, dtype=torch.long)
    y = torch.full((len(examples), T), -1, dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.ids) - 1
        x[i, :n] = torch.tensor(e.ids[:-1])
        y[i, :n] = torch.tensor([t if m else -1 for t, m in zip(e.ids[1:], e.mask[1:], strict=True)])
    return x, y


def batch_order(examples: Sequence[Example], batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of batches of similar length (little padding), in a shuffled order."""
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    batches = []
    pool = batch_size * 16
    for start in range(0, len(idx), pool):
        chunk = sorted(idx[start : start + pool], key=lambda i: len(examples[i].ids))
        batches += [chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return [b for b in batches if len(b) == batch_size]
