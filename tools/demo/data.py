"""Synthetic multi-turn chats the demo model learns from, drawn from a seed alone.

Each chat is a run of exchanges: arithmetic and letter counting answered with nanochat's
calculator tool (``<|python_start|>expr<|python_end|><|output_start|>result<|output_end|>`` then a
sentence), follow-ups that refer to the previous result ("Add 5 to that.") or the previous word
("And how many e?"), and a few canned replies (greetings, "who are you", thanks, off-topic). The
calculator output is Python's own ``str(result)``, exactly what the engine's calculator prints.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass

from desktop.engine.calculator import calculate
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, Part

# Calculator symbol -> (the word replies use, Python's operator).
OPERATIONS: dict[str, tuple[str, Callable[[float, int], float]]] = {
    "+": ("plus", lambda a, b: a + b),
    "-": ("minus", lambda a, b: a - b),
    "*": ("times", lambda a, b: a * b),
    "/": ("divided by", lambda a, b: a / b),
}
QUESTIONS: dict[str, tuple[str, ...]] = {
    "+": (
        "What is {a} plus {b}?",
        "What's {a}+{b}?",
        "what is {a} + {b}",
        "Compute {a} + {b}",
        "Calculate {a}+{b}.",
        "How much is {a} plus {b}?",
        "What is the sum of {a} and {b}?",
        "Add {a} and {b}.",
        "{a} + {b} = ?",
        "what's {a} plus {b}",
        "Please add {a} to {b}.",
        "{a} plus {b}",
    ),
    "-": (
        "What is {a} minus {b}?",
        "What's {a}-{b}?",
        "what is {a} - {b}",
        "Compute {a} - {b}",
        "Calculate {a}-{b}.",
        "How much is {a} minus {b}?",
        "Subtract {b} from {a}.",
        "What is the difference between {a} and {b}?",
        "{a} - {b} = ?",
        "what's {a} minus {b}",
        "Take {b} away from {a}.",
        "{a} minus {b}",
    ),
    "*": (
        "What is {a} times {b}?",
        "What's {a}*{b}?",
        "what's {a} * {b}",
        "Compute {a} * {b}",
        "Calculate {a}*{b}.",
        "How much is {a} times {b}?",
        "What is {a} multiplied by {b}?",
        "Multiply {a} by {b}.",
        "What is the product of {a} and {b}?",
        "{a} * {b} = ?",
        "what is {a} times {b}",
        "{a} times {b}",
    ),
    "/": (
        "What is {a} divided by {b}?",
        "What's {a}/{b}?",
        "what is {a} / {b}",
        "Compute {a} / {b}",
        "Calculate {a}/{b}.",
        "How much is {a} divided by {b}?",
        "Divide {a} by {b}.",
        "What do you get if you divide {a} by {b}?",
        "{a} / {b} = ?",
        "what's {a} divided by {b}",
        "{a} divided by {b}",
    ),
}
# Only after a first exchange: the same question, phrased as a follow-up.
FOLLOW_UP_PREFIXES = ("And ", "Now ", "What about ", "Next: ", "OK, and ")
# "That" is the previous calculator result.
ON_PREVIOUS: dict[str, tuple[str, ...]] = {
    "+": ("Add {b} to that.", "What is that plus {b}?", "Now add {b}.", "And plus {b}?", "Plus {b}?"),
    "-": ("Subtract {b} from that.", "What is that minus {b}?", "Now take away {b}.", "And minus {b}?"),
    "*": ("Multiply that by {b}.", "What is that times {b}?", "Now times {b}.", "And times {b}?"),
    "/": ("Divide that by {b}.", "What is that divided by {b}?", "Now divide by {b}.", "And divided by {b}?"),
}
DOUBLE_OR_HALVE = (("Double that.", "*"), ("Double it.", "*"), ("Halve that.", "/"), ("Half of that?", "/"))
COUNTING = (
    "How many {l} are in {w}?",
    "How many times does the letter {l} appear in {w}?",
    "Count the letter {l} in {w}.",
    "how many {l} in {w}",
    "How many {l}'s are in the word {w}?",
    "In the word {w}, how many {l} are there?",
    "Count how many {l} are in {w}",
)
# The word of the previous counting question, another letter.
COUNTING_ON_PREVIOUS = ("And how many {l}?", "What about the letter {l}?", "And the letter {l}?")
FAVOURITE_WORDS = (
    "strawberry",
    "banana",
    "mississippi",
    "nanoscope",
    "python",
    "calculator",
    "bookkeeper",
    "committee",
    "balloon",
    "letter",
    "apple",
    "tomorrow",
    "coffee",
    "pepper",
    "assessment",
)

INTRO = "I am a tiny demo model bundled with Nanoscope."
SKILLS = (
    'I can do arithmetic and count letters with my calculator tool, for example "What is 12 times 7?" '
    'or "How many r are in strawberry?".'
)
GREETINGS = ("Hi", "Hello", "hello!", "Hey there", "Good morning", "hi there", "Hello, who are you?", "Howdy")
GREETING_REPLY = f"Hello! {INTRO} {SKILLS}"
CANNED: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        (
            "Who are you?",
            "who are you",
            "What are you?",
            "What is your name?",
            "Introduce yourself.",
            "Are you a real model?",
            "what model is this",
        ),
        f"{INTRO} I have about a million parameters and was trained for half an hour on two CPU cores. "
        "Open a nanochat checkpoint of your own to chat with a real model.",
    ),
    (("What can you do?", "Help", "help me", "What should I ask you?", "How do I use you?"), SKILLS),
)
THANKS = ("Thanks!", "thank you", "Thank you very much.", "thanks a lot", "Great, thanks.")
THANKS_REPLY = "You are welcome! Ask me another sum whenever you like."
FALLBACK = f"{INTRO} I only know arithmetic and letter counting, so I cannot answer that. {SKILLS}"
OFF_TOPIC = (
    "Tell me a joke.",
    "What is the capital of France?",
    "Write a poem about the sea.",
    "What is the meaning of life?",
    "Can you explain quantum physics?",
    "What's the weather like?",
    "Translate hello into French.",
    "Who won the world cup?",
    "Write some Python code.",
    "What is a neural network?",
    "Tell me a story.",
    "Why is the sky blue?",
)
# Previous results beyond this stay out of follow-ups: the numbers would only grow.
MAX_FOLLOW_UP_OPERAND = 100_000

ARITHMETIC, COUNT, ON_RESULT, ON_WORD, CANNED_KIND = "arithmetic", "count", "on result", "on word", "canned"


@dataclass(frozen=True)
class Exchange:
    """One user question and the reply the data teaches for it."""

    question: str
    reply: Message
    kind: str  # ARITHMETIC, COUNT, ON_RESULT, ON_WORD or CANNED_KIND
    result: int | float | None = None  # the calculator's output, for tool replies
    word: str = ""  # the word counted in, for follow-ups on it


Chat = list[Exchange]


def messages(chat: Sequence[Exchange]) -> list[Message]:
    out: list[Message] = []
    for ex in chat:
        out += [Message.of_text("user", ex.question), ex.reply]
    return out


def tool_reply(expr: str, result: object, text: str) -> Message:
    """nanochat's SFT reply shape: a calculator call, its forced output, then a sentence."""
    parts = [Part(PYTHON, expr), Part(PYTHON_OUTPUT, str(result)), Part(TEXT, text)]
    return Message(role="assistant", parts=parts)


def text_reply(text: str) -> Message:
    return Message.of_text("assistant", text)


def arithmetic_reply(a: int | float, sym: str, b: int) -> tuple[Message, int | float]:
    word, fn = OPERATIONS[sym]
    result = fn(a, b)
    return tool_reply(f"{a}{sym}{b}", result, f"{a} {word} {b} is {result}."), result


def count_reply(word: str, letter: str) -> tuple[Message, int]:
    n = word.count(letter)
    text = f"There is 1 {letter} in {word}." if n == 1 else f"There are {n} {letter} in {word}."
    return tool_reply(f"'{word}'.count('{letter}')", n, text), n


def calculator_accepts(word: str) -> bool:
    """nanochat's calculator refuses strings holding e.g. "exec", "open" or "dir": no data about those."""
    return calculate(f"'{word}'.count('a')") is not None


def vocabulary(paragraphs: Iterable[str]) -> list[str]:
    """Plain lower-case words of the prose, to count letters in."""
    found = {w for p in paragraphs for w in re.findall(r"\b[a-z]{4,10}\b", p)}
    return sorted(w for w in found if calculator_accepts(w))


def prose_paragraphs() -> list[str]:
    """Plain wrapped paragraphs of the Python reference that every Python ships (``pydoc_data``)."""
    import pydoc_data.topics

    out = []
    for key in sorted(pydoc_data.topics.topics):
        for para in pydoc_data.topics.topics[key].split("\n\n"):
            lines = para.splitlines()
            # Headings, grammar rules and code examples are left out.
            if len(lines) < 2 or any(ln.startswith((" ", "*", "=", "-", ">")) or "::=" in ln for ln in lines):
                continue
            out.append(" ".join(ln.strip() for ln in lines))
    return out


def vary_case(text: str, rng: random.Random) -> str:
    """People type sloppily: lower-case starts and missing final punctuation."""
    if rng.random() < 0.2:
        text = text[0].lower() + text[1:]
    if rng.random() < 0.15 and text[-1] in "?.":
        text = text[:-1]
    return text


class ChatMaker:
    """Draws exchanges and chats from one ``random.Random``.

    ``avoid`` holds questions that must not be drawn (the training questions, when drawing
    held-out chats); ``tools_only`` leaves canned replies out (every exchange has a result).
    """

    def __init__(
        self, rng: random.Random, words: Sequence[str], avoid: Container[str] = (), tools_only: bool = False
    ) -> None:
        self.rng = rng
        self.words = words
        self.avoid = avoid
        self.tools_only = tools_only

    def operand(self) -> int:
        """Mostly small numbers (what people try first), sometimes up to three digits."""
        r = self.rng.random()
        if r < 0.5:
            return self.rng.randint(1, 20)
        if r < 0.8:
            return self.rng.randint(1, 99)
        return self.rng.randint(100, 999)

    def pseudo_word(self) -> str:
        """A pronounceable made-up word: copying it letter by letter cannot be memorised."""
        rng = self.rng
        while True:
            word = "".join(
                rng.choice("bcdfghjklmnprstvwz")
                + rng.choice("aeiou")
                + rng.choice(("", "", "n", "r", "s", "l"))
                for _ in range(rng.randint(2, 4))
            )
            if calculator_accepts(word):
                return word

    def word(self) -> str:
        r = self.rng.random()
        if r < 0.15:
            return self.rng.choice(FAVOURITE_WORDS)
        if r < 0.5:
            return self.pseudo_word()
        return self.rng.choice(self.words)

    def letter(self, word: str) -> str:
        return (
            self.rng.choice(word)
            if self.rng.random() < 0.85
            else self.rng.choice("abcdefghijklmnopqrstuvwxyz")
        )

    def fresh(self, draw: Callable[[], Exchange]) -> Exchange:
        while True:
            ex = draw()
            if ex.question not in self.avoid:
                return ex

    def arithmetic(self, follow_up: bool) -> Exchange:
        rng = self.rng
        sym = rng.choice(tuple(OPERATIONS))
        a, b = self.operand(), self.operand()
        if sym == "/":
            b = rng.randint(1, 20)  # whole quotients keep the answers short: 100/4 -> 25.0
            a = b * self.operand()
        question = rng.choice(QUESTIONS[sym]).format(a=a, b=b)
        if follow_up and rng.random() < 0.3:
            question = rng.choice(FOLLOW_UP_PREFIXES) + question[0].lower() + question[1:]
        reply, result = arithmetic_reply(a, sym, b)
        return Exchange(vary_case(question, rng), reply, ARITHMETIC, result)

    def count(self) -> Exchange:
        word = self.word()
        letter = self.letter(word)
        question = self.rng.choice(COUNTING).format(l=letter, w=word)
        reply, n = count_reply(word, letter)
        return Exchange(vary_case(question, self.rng), reply, COUNT, n, word)

    def on_result(self, previous: int | float) -> Exchange:
        """Arithmetic on the previous result; divisions only where the quotient is whole."""
        rng = self.rng
        if rng.random() < 0.15:
            question, sym = rng.choice(DOUBLE_OR_HALVE)
            b = 2
            if sym == "/" and previous % 2:
                question, sym = "Double that.", "*"
        else:
            sym = rng.choice(tuple(OPERATIONS))
            b = self.operand()
            if sym == "/":
                divisors = [d for d in range(2, 21) if previous % d == 0]
                sym, b = ("/", rng.choice(divisors)) if divisors else ("*", rng.randint(2, 9))
            question = rng.choice(ON_PREVIOUS[sym]).format(b=b)
        reply, result = arithmetic_reply(previous, sym, b)
        return Exchange(vary_case(question, rng), reply, ON_RESULT, result)

    def on_word(self, word: str) -> Exchange:
        letter = self.letter(word)
        question = self.rng.choice(COUNTING_ON_PREVIOUS).format(l=letter)
        reply, n = count_reply(word, letter)
        return Exchange(vary_case(question, self.rng), reply, ON_WORD, n, word)

    def canned(self, first: bool) -> Exchange:
        rng = self.rng
        if rng.random() < (0.5 if first else 0.15):
            question, reply = rng.choice(GREETINGS), GREETING_REPLY
        elif not first and rng.random() < 0.4:
            question, reply = rng.choice(THANKS), THANKS_REPLY
        elif rng.random() < 0.4:
            question, reply = rng.choice(OFF_TOPIC), FALLBACK
        else:
            prompts, reply = rng.choice(CANNED)
            question = rng.choice(prompts)
        return Exchange(vary_case(question, rng), text_reply(reply), CANNED_KIND)

    def exchange(self, previous: Exchange | None) -> Exchange:
        """The next exchange of a chat, given the one before it (None at the start)."""
        r = self.rng.random()
        if not self.tools_only and r < 0.07:
            return self.canned(first=previous is None)
        if previous is not None and previous.result is not None:
            if previous.kind in (COUNT, ON_WORD) and r > 0.9:
                return self.on_word(previous.word)
            if (
                previous.kind in (ARITHMETIC, ON_RESULT)
                and abs(previous.result) <= MAX_FOLLOW_UP_OPERAND
                and r > 0.82
            ):
                return self.on_result(previous.result)
        if r < 0.65:
            return self.fresh(lambda: self.arithmetic(follow_up=previous is not None))
        return self.fresh(self.count)

    def chat(self, exchanges: int) -> Chat:
        out: Chat = []
        for _ in range(exchanges):
            out.append(self.exchange(out[-1] if out else None))
        return out

    def training_chat(self, max_exchanges: int) -> Chat:
        """A fifth of the chats are single questions; the others have 2 to ``max_exchanges``."""
        n = 1 if self.rng.random() < 0.2 else self.rng.randint(2, max(2, max_exchanges))
        return self.chat(n)


def chat_strings(chat: Sequence[Exchange]) -> Iterable[str]:
    """Every text of a chat (questions, calls, outputs, sentences), for learning the tokenizer."""
    for m in messages(chat):
        yield from (p.text for p in m.parts)
