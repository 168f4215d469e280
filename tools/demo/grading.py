"""Accuracy of the saved demo, measured through the app's own engine as a user would chat with it.

The checkpoint is opened the way the app opens it (``registry.open_backend``: the nanochat
backend, default device and precision). Each held-out chat is asked one question at a time: the
prompt is rendered by the backend from the conversation so far (the model's own earlier replies,
calculator output included, kept as the app keeps them), and the reply is streamed greedily with
the prefix cache, the engine's calculator and its forced-output state machine. Nothing here uses
the training code's forward pass.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from desktop.engine.backend import Backend, LoadOptions, StreamOptions
from desktop.engine.messages import TEXT, Message
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

from .data import Chat, Exchange, arithmetic_reply, count_reply

logger = logging.getLogger(__name__)

# The app's default reply budget; render() keeps room for it (a quarter of the context at most).
RENDER_MAX_NEW = 512
# The longest reply the data teaches is about 50 tokens; a garbled one is cut off here.
GENERATE_MAX_TOKENS = 128
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# Turn buckets of the accuracy table: first question, early follow-ups, late follow-ups.
BUCKETS = (("turn 1", 1, 1), ("turns 2-5", 2, 5), ("turns 6-10", 6, 10), ("turns 11+", 11, 10**9))


def ask(backend: Backend, history: Sequence[Message], question: str) -> Message:
    """The model's greedy reply to ``question`` after ``history``, kept as the app keeps it.

    A follow-up reuses the cache of the previous reply, as in the app; a first question starts
    a new one, as a new chat does."""
    prompt = backend.render([*history, Message.of_text("user", question)], RENDER_MAX_NEW)
    reply = Message(role="assistant")
    params = SamplingParams(temperature=0.0, max_tokens=GENERATE_MAX_TOKENS)
    options = StreamOptions(reuse_cache=bool(history))
    for ev in backend.stream(prompt, params, threading.Event(), options):
        # What the app's controller keeps of each event.
        if ev.text and (ev.special is None or ev.kind != TEXT):
            reply.append(ev.kind, ev.text)
    return reply


def final_number(text: str) -> float | None:
    found = NUMBER.findall(text)
    return float(found[-1]) if found else None


@dataclass
class Tally:
    n: int = 0
    exact: int = 0  # the whole reply (call, output, sentence) is exactly the taught one
    final: int = 0  # the last number of the reply's sentence is the right result

    def add(self, exact: bool, final: bool) -> None:
        self.n += 1
        self.exact += exact
        self.final += final

    def cells(self) -> str:
        pct = (lambda k: f"{100 * k / self.n:.1f}%") if self.n else (lambda k: "–")
        return f"{self.n} | {self.exact} ({pct(self.exact)}) | {self.final} ({pct(self.final)})"


@dataclass
class Grades:
    by_turn: dict[str, Tally] = field(default_factory=lambda: {label: Tally() for label, _, _ in BUCKETS})
    by_kind: dict[str, Tally] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)

    def add(self, turn: int, ex: Exchange, reply: Message) -> None:
        got = [(p.kind, p.text) for p in reply.parts]
        exact = got == [(p.kind, p.text) for p in ex.reply.parts]
        number = final_number(reply.plain_text())
        final = ex.result is not None and number is not None and number == float(ex.result)
        label = next(lbl for lbl, lo, hi in BUCKETS if lo <= turn <= hi)
        self.by_turn[label].add(exact, final)
        self.by_kind.setdefault(ex.kind, Tally()).add(exact, final)
        if not exact:
            self.misses.append(f"turn {turn} {ex.question!r}: {got}")

    def total(self) -> Tally:
        out = Tally()
        for t in self.by_turn.values():
            out.n, out.exact, out.final = out.n + t.n, out.exact + t.exact, out.final + t.final
        return out


def grade_chats(backend: Backend, chats: Iterable[Chat]) -> Grades:
    """Each chat one question at a time, after the model's own earlier replies."""
    grades = Grades()
    for chat in chats:
        history: list[Message] = []
        for turn, ex in enumerate(chat, start=1):
            reply = ask(backend, history, ex.question)
            grades.add(turn, ex, reply)
            history += [Message.of_text("user", ex.question), reply]
    return grades


def open_step(directory: Path, step: int) -> Backend:
    """The checkpoint as the app opens it: default device and precision."""
    return open_backend(directory, LoadOptions(step=step))


def _arithmetic(question: str, a: int, sym: str, b: int) -> Exchange:
    reply, result = arithmetic_reply(a, sym, b)
    return Exchange(question, reply, "arithmetic", result)


def _count(question: str, word: str, letter: str) -> Exchange:
    reply, n = count_reply(word, letter)
    return Exchange(question, reply, "count", n, word)


# Single questions the demo is shown off with, each in a fresh chat.
SHOWCASE: tuple[Exchange, ...] = (
    _arithmetic("What is 12 times 7?", 12, "*", 7),
    _arithmetic("What is 23 plus 19?", 23, "+", 19),
    _arithmetic("How much is 144 divided by 12?", 144, "/", 12),
    _count("How many r are in strawberry?", "strawberry", "r"),
)
# Ten questions in one chat, as the issue reported them breaking down in the 256-token model.
TEN_IN_A_ROW: Chat = [
    _arithmetic("What is 12 times 7?", 12, "*", 7),
    _arithmetic("What is 23 plus 19?", 23, "+", 19),
    _arithmetic("What is 50 minus 8?", 50, "-", 8),
    _arithmetic("How much is 144 divided by 12?", 144, "/", 12),
    _arithmetic("What is 99 plus 1?", 99, "+", 1),
    _arithmetic("What is 64 divided by 8?", 64, "/", 8),
    _count("How many s are in mississippi?", "mississippi", "s"),
    _arithmetic("What is 7 times 8?", 7, "*", 8),
    _arithmetic("What is 345 plus 12?", 345, "+", 12),
    _arithmetic("What is 81 divided by 9?", 81, "/", 9),
]
