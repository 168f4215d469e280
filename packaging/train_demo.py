"""Train the tiny chat model bundled with Nanoscope, so a newcomer without checkpoints sees it work.

    python packaging/train_demo.py --out resources/demo [--steps N] [--minutes M]

Everything is produced here, offline and seeded: synthetic chats that use nanochat's calculator tool
(arithmetic and letter counting), a few canned replies (greetings, "who are you", off-topic), and a
little prose from the Python docs (``pydoc_data.topics``) for completion flavour. A small BPE
tokenizer is learned from that text, then an E7-era nanochat model (the project's own
``desktop.engine.model.GPT``) is trained on it on the CPU. The result is written in nanochat's
own layout, so the app loads it exactly like a user's checkpoint::

    <out>/chatsft_checkpoints/demo/model_<step>.pt + meta_<step>.json
    <out>/tokenizer/tokenizer.pkl

Finally the saved files are loaded back through the real engine (``ChatSession``) and asked
held-out questions greedily; the script fails if "What is 12 times 7?" does not produce a
calculator call whose result is 84.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import pickle
import random
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import regex
import tiktoken
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from desktop.engine.calculator import calculate
from desktop.engine.classify import classify, expected_shapes
from desktop.engine.config import ModelConfig, e7_config
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, Part
from desktop.engine.model import GPT
from desktop.engine.tokenizer import (
    ASSISTANT_END,
    ASSISTANT_START,
    OUTPUT_END,
    OUTPUT_START,
    PYTHON_END,
    PYTHON_START,
    SPECIAL_TOKENS,
    USER_END,
    USER_START,
    TiktokenTokenizer,
)

if TYPE_CHECKING:
    from desktop.engine.session import ChatSession

# nanochat's split pattern: GPT-4's, with numbers split into groups of at most two digits.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
VOCAB_SIZE = 1024  # 256 bytes + 759 merges + 9 specials; a multiple of 64, so no padding rows
TAG = "demo"
DEMO_QUESTION = "What is 12 times 7?"

# --------------------------------------------------------------------------------------------
# Synthetic conversations
# --------------------------------------------------------------------------------------------

# Calculator symbol -> (the words the answer uses, Python's operator).
OPERATIONS: dict[str, tuple[str, Callable[[int, int], int | float]]] = {
    "+": ("plus", lambda a, b: a + b),
    "-": ("minus", lambda a, b: a - b),
    "*": ("times", lambda a, b: a * b),
    "/": ("divided by", lambda a, b: a / b),
}
QUESTION_TEMPLATES: dict[str, tuple[str, ...]] = {
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
    ),
}
COUNT_TEMPLATES = (
    "How many {l} are in {w}?",
    "How many times does the letter {l} appear in {w}?",
    "Count the letter {l} in {w}.",
    "how many {l} in {w}",
    "How many {l}'s are in the word {w}?",
    "In the word {w}, how many {l} are there?",
    "Count how many {l} are in {w}",
)
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
CANNED: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("Hi", "Hello", "hello!", "Hey there", "Good morning", "hi there", "Hello, who are you?", "Howdy"),
        f"Hello! {INTRO} {SKILLS}",
    ),
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
        f"{INTRO} I have about a million parameters and was trained for a few minutes on two CPU cores. "
        "Open a nanochat checkpoint of your own to chat with a real model.",
    ),
    (("What can you do?", "Help", "help me", "What should I ask you?", "How do I use you?"), SKILLS),
    (
        ("Thanks!", "thank you", "Thank you very much.", "thanks a lot", "Great, thanks."),
        "You are welcome! Ask me another sum whenever you like.",
    ),
)
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


def operand(rng: random.Random) -> int:
    """Mostly small numbers (what people try first), sometimes up to three digits."""
    r = rng.random()
    if r < 0.5:
        return rng.randint(1, 20)
    if r < 0.8:
        return rng.randint(1, 99)
    return rng.randint(100, 999)


def vary_case(text: str, rng: random.Random) -> str:
    """People type sloppily: lower-case starts and missing final punctuation."""
    if rng.random() < 0.2:
        text = text[0].lower() + text[1:]
    if rng.random() < 0.15 and text[-1] in "?.":
        text = text[:-1]
    return text


def assistant(*parts: tuple[str, str]) -> Message:
    return Message(role="assistant", parts=[Part(kind, text) for kind, text in parts])


def tool_answer(expr: str, result: object, text: str) -> Message:
    """The reply shape nanochat's SFT data uses: a calculator call, its forced output, then text."""
    return assistant((PYTHON, expr), (PYTHON_OUTPUT, str(result)), (TEXT, text))


def arithmetic_reply(a: int, sym: str, b: int) -> Message:
    """Python's own arithmetic gives the output exactly as the calculator prints it (100/4 -> 25.0)."""
    word, fn = OPERATIONS[sym]
    result = fn(a, b)
    return tool_answer(f"{a}{sym}{b}", result, f"{a} {word} {b} is {result}.")


def count_reply(word: str, letter: str) -> Message:
    n = word.count(letter)
    text = f"There is 1 {letter} in {word}." if n == 1 else f"There are {n} {letter} in {word}."
    return tool_answer(f"'{word}'.count('{letter}')", n, text)


def arithmetic_operands(rng: random.Random) -> tuple[int, str, int]:
    sym = rng.choice(tuple(OPERATIONS))
    a, b = operand(rng), operand(rng)
    if sym == "/":
        b = rng.randint(1, 20)  # whole quotients keep the answers short: 100/4 -> 25.0
        a = b * operand(rng)
    return a, sym, b


def calculator_accepts(word: str) -> bool:
    """nanochat's calculator refuses strings holding e.g. "exec", "open" or "dir": no data about those."""
    return calculate(f"'{word}'.count('a')") is not None


def pseudo_word(rng: random.Random) -> str:
    """A pronounceable made-up word: copying it letter by letter cannot be memorised."""
    while True:
        word = "".join(
            rng.choice("bcdfghjklmnprstvwz") + rng.choice("aeiou") + rng.choice(("", "", "n", "r", "s", "l"))
            for _ in range(rng.randint(2, 4))
        )
        if calculator_accepts(word):
            return word


def count_operands(rng: random.Random, words: Sequence[str]) -> tuple[str, str]:
    r = rng.random()
    if r < 0.15:
        word = rng.choice(FAVOURITE_WORDS)
    elif r < 0.5:
        word = pseudo_word(rng)
    else:
        word = rng.choice(words)
    letter = rng.choice(word) if rng.random() < 0.85 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    return word, letter


def arithmetic_chat(rng: random.Random) -> list[Message]:
    a, sym, b = arithmetic_operands(rng)
    question = vary_case(rng.choice(QUESTION_TEMPLATES[sym]).format(a=a, b=b), rng)
    return [Message.of_text("user", question), arithmetic_reply(a, sym, b)]


def counting_chat(rng: random.Random, words: Sequence[str]) -> list[Message]:
    word, letter = count_operands(rng, words)
    question = vary_case(rng.choice(COUNT_TEMPLATES).format(l=letter, w=word), rng)
    return [Message.of_text("user", question), count_reply(word, letter)]


def canned_chat(rng: random.Random) -> list[Message]:
    if rng.random() < 0.3:
        question, reply = rng.choice(OFF_TOPIC), FALLBACK
    else:
        prompts, reply = rng.choice(CANNED)
        question = rng.choice(prompts)
    return [Message.of_text("user", vary_case(question, rng)), assistant((TEXT, reply))]


def one_turn(rng: random.Random, words: Sequence[str]) -> list[Message]:
    r = rng.random()
    if r < 0.6:
        return arithmetic_chat(rng)
    if r < 0.9:
        return counting_chat(rng, words)
    return canned_chat(rng)


def conversation(rng: random.Random, words: Sequence[str]) -> list[Message]:
    """Mostly one exchange; some two, so follow-up questions in the app work too."""
    turns = one_turn(rng, words)
    if rng.random() < 0.15:
        turns += one_turn(rng, words)
    return turns


def prose_paragraphs() -> list[str]:
    """Prose paragraphs of the Python reference (public domain text every Python ships)."""
    import pydoc_data.topics

    out = []
    for key in sorted(pydoc_data.topics.topics):
        for para in pydoc_data.topics.topics[key].split("\n\n"):
            lines = para.splitlines()
            # Skip headings, grammar rules and code examples: keep plain wrapped sentences.
            if len(lines) < 2 or any(ln.startswith((" ", "*", "=", "-", ">")) or "::=" in ln for ln in lines):
                continue
            out.append(" ".join(ln.strip() for ln in lines))
    return out


def vocabulary(paragraphs: Iterable[str]) -> list[str]:
    """Plain lower-case words from the prose, for the letter-counting questions."""
    found = {w for p in paragraphs for w in re.findall(r"\b[a-z]{4,10}\b", p)}
    return sorted(w for w in found if calculator_accepts(w))


def message_strings(messages: Sequence[Message]) -> Iterable[str]:
    for m in messages:
        yield from (p.text for p in m.parts)


# --------------------------------------------------------------------------------------------
# Tokenizer: a small deterministic byte-level BPE, saved as nanochat's tiktoken pickle
# --------------------------------------------------------------------------------------------


def train_bpe(texts: Iterable[str], n_ranks: int) -> dict[bytes, int]:
    """Learn ``mergeable_ranks`` (256 bytes + merges) from ``texts`` split by nanochat's pattern.

    Each step merges the most frequent adjacent pair (ties: the smallest pair of ids), as rustbpe
    does; pair counts are updated incrementally and kept in a lazily invalidated heap.
    """
    split = regex.compile(SPLIT_PATTERN)
    chunks = Counter(c for t in texts for c in split.findall(t))
    words = [list(c.encode("utf-8")) for c in sorted(chunks)]
    freqs = [chunks[c] for c in sorted(chunks)]
    vocab = [bytes([i]) for i in range(256)]
    ranks = {b: i for i, b in enumerate(vocab)}
    counts: Counter[tuple[int, int]] = Counter()
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
    for wi, w in enumerate(words):
        for pair in itertools.pairwise(w):
            counts[pair] += freqs[wi]
            where[pair].add(wi)
    heap = [(-n, pair) for pair, n in counts.items()]
    heapq.heapify(heap)
    while len(ranks) < n_ranks and heap:
        neg, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg or -neg == 0:
            continue  # stale entry
        merged = vocab[pair[0]] + vocab[pair[1]]
        if merged not in ranks:  # the same bytes can arise from two different pairs
            ranks[merged] = len(vocab)
            vocab.append(merged)
        new_id = ranks[merged]
        touched: set[tuple[int, int]] = set()
        for wi in sorted(where.pop(pair)):
            w, f = words[wi], freqs[wi]
            if not any(p == pair for p in itertools.pairwise(w)):
                continue
            for p in itertools.pairwise(w):
                counts[p] -= f
                touched.add(p)
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == pair:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for p in itertools.pairwise(out):
                counts[p] += f
                where[p].add(wi)
                touched.add(p)
        for p in touched:
            if counts[p] <= 0:
                del counts[p]
            else:
                heapq.heappush(heap, (-counts[p], p))
    return ranks


def build_encoding(ranks: dict[bytes, int]) -> tiktoken.Encoding:
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(
        name="rustbpe", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )


# --------------------------------------------------------------------------------------------
# Rendering with nanochat's loss mask
# --------------------------------------------------------------------------------------------


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 where the token is a training target


def render_chat(tok: TiktokenTokenizer, messages: Sequence[Message]) -> Example:
    """nanochat's ``render_conversation``: ids plus a mask of the assistant tokens to train on.

    The calculator's output span (``<|output_start|>`` … ``<|output_end|>``) is not trained on:
    at inference those tokens are forced from the calculator, not sampled.
    """
    sid = tok.special_id
    ids, mask = [tok.bos_id], [0]

    def add(tokens: Sequence[int], supervised: int) -> None:
        ids.extend(tokens)
        mask.extend([supervised] * len(tokens))

    for m in messages:
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


def render_document(tok: TiktokenTokenizer, text: str) -> Example:
    ids = [tok.bos_id, *tok.encode(text)]
    return Example(ids, [0] + [1] * (len(ids) - 1))


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


def demo_config(
    sequence_len: int, n_layer: int, n_embd: int, n_head: int, window_pattern: str
) -> ModelConfig:
    """The E7 configuration ``classify`` infers for such a checkpoint (asserted after building)."""
    return e7_config(sequence_len, VOCAB_SIZE, n_layer, n_head, n_embd, window_pattern)


def model_config_meta(cfg: ModelConfig) -> dict:
    """The ``model_config`` block nanochat's chat_sft writes (GPTConfig's fields)."""
    return {
        "sequence_len": cfg.sequence_len,
        "vocab_size": cfg.vocab_size,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_kv_head": cfg.n_kv_head,
        "n_embd": cfg.n_embd,
        "window_pattern": cfg.window_pattern,
    }


@torch.no_grad()
def init_weights(model: GPT) -> None:
    """nanochat-style init: unit embeddings, tiny head, zero output projections, neutral scalars."""
    C = model.config.n_embd
    bound = math.sqrt(3.0 / C)  # uniform with std 1/sqrt(C)
    torch.nn.init.normal_(model.transformer.wte.weight, std=1.0)
    torch.nn.init.normal_(model.lm_head.weight, std=0.001)
    for block in model.transformer.h:
        for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
            torch.nn.init.uniform_(lin.weight, -bound, bound)
        torch.nn.init.zeros_(block.attn.c_proj.weight)
        torch.nn.init.zeros_(block.mlp.c_proj.weight)
        if hasattr(block.attn, "ve_gate"):
            torch.nn.init.zeros_(block.attn.ve_gate.weight)  # gate 3*sigmoid(0): a neutral start
    for emb in model.value_embeds.values():
        torch.nn.init.uniform_(emb.weight, -bound, bound)
    model.resid_lambdas.fill_(1.0)
    model.x0_lambdas.fill_(0.1)
    torch.nn.init.zeros_(model.smear_gate.weight)
    model.smear_lambda.fill_(0.05)
    model.backout_lambda.fill_(0.05)


def make_optimizer(model: GPT, lr: float) -> torch.optim.AdamW:
    """Adam with nanochat's spirit: faster embeddings, slower head, scalars on their own."""
    groups: dict[str, list[torch.nn.Parameter]] = {"embed": [], "head": [], "matrix": [], "scalar": []}
    for name, p in model.named_parameters():
        if name.startswith(("transformer.wte", "value_embeds")):
            groups["embed"].append(p)
        elif name == "lm_head.weight":
            groups["head"].append(p)
        elif p.ndim == 2 and not name.endswith(("ve_gate.weight", "smear_gate.weight")):
            groups["matrix"].append(p)
        else:
            groups["scalar"].append(p)
    scale = {"embed": 5.0, "head": 1.0, "matrix": 1.0, "scalar": 1.0}
    return torch.optim.AdamW(
        [{"params": ps, "lr": lr * scale[g], "base_lr": lr * scale[g]} for g, ps in groups.items()],
        betas=(0.9, 0.95),
        eps=1e-10,
        weight_decay=0.0,
    )


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warmup, flat, then a linear decay to 5% over the last 40% of training."""
    if step < warmup:
        return (step + 1) / warmup
    decay_from = int(0.6 * steps)
    if step < decay_from:
        return 1.0
    return 1.0 - 0.95 * (step - decay_from) / max(1, steps - decay_from)


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------


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


@torch.no_grad()
def evaluate_loss(
    model: GPT, examples: Sequence[Example], pad_id: int, token_bytes: torch.Tensor, batch_size: int = 64
) -> tuple[float, float]:
    """Mean loss per supervised token, and bits per byte over supervised non-special tokens."""
    model.eval()
    total_loss = total_tokens = 0.0
    nats = n_bytes = 0.0
    for start in range(0, len(examples), batch_size):
        x, y = collate(examples[start : start + batch_size], pad_id)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="none")
        valid = y.flatten() >= 0
        total_loss += float(loss[valid].sum())
        total_tokens += int(valid.sum())
        nb = token_bytes[y.flatten().clamp_min(0)] * valid
        nats += float((loss * (nb > 0)).sum())
        n_bytes += float(nb.sum())
    model.train()
    return total_loss / max(1.0, total_tokens), nats / math.log(2) / max(1.0, n_bytes)


# --------------------------------------------------------------------------------------------
# Check through the real engine
# --------------------------------------------------------------------------------------------


@dataclass
class Reply:
    expr: str = ""
    output: str = ""
    text: str = ""
    forced_ok: bool = True  # output tokens, and only they, were forced


def ask(session: ChatSession, question: str, max_tokens: int = 64) -> Reply:
    """Greedy reply to one question, split into its calculator call, forced output and text."""
    from desktop.engine.sampling import SamplingParams

    rendered = session.render([Message.of_text("user", question)], max_tokens)
    reply = Reply()
    for ev in session.generate(
        rendered.ids, SamplingParams(temperature=0.0, max_tokens=max_tokens), reuse_cache=False
    ):
        if ev.forced != (ev.kind == PYTHON_OUTPUT):
            reply.forced_ok = False
        if ev.special is not None:
            continue
        if ev.kind == PYTHON:
            reply.expr += ev.text
        elif ev.kind == PYTHON_OUTPUT:
            reply.output += ev.text
        elif ev.kind == TEXT:
            reply.text += ev.text
    return reply


@dataclass(frozen=True)
class Case:
    """A graded question and the reply the data teaches: call, calculator output, closing text."""

    question: str
    call: str
    output: str
    text: str

    @classmethod
    def of(cls, question: str, reply: Message) -> Case:
        return cls(question, *(p.text for p in reply.parts))


# The questions the demo is shown off with; each must work.
SHOWCASE = (
    Case.of(DEMO_QUESTION, arithmetic_reply(12, "*", 7)),
    Case.of("What is 23 plus 19?", arithmetic_reply(23, "+", 19)),
    Case.of("what's 9*8", arithmetic_reply(9, "*", 8)),
    Case.of("How much is 144 divided by 12?", arithmetic_reply(144, "/", 12)),
    Case.of("How much is 100 divided by 4?", arithmetic_reply(100, "/", 4)),
    Case.of("Compute 345 + 12", arithmetic_reply(345, "+", 12)),
    Case.of("What is 50 minus 8?", arithmetic_reply(50, "-", 8)),
    Case.of("How many r are in strawberry?", count_reply("strawberry", "r")),
    Case.of("How many s are in mississippi?", count_reply("mississippi", "s")),
)
# Phrasings and words the training data never uses, to see how far the model generalises.
NOVEL_ARITHMETIC = (
    "Please work out {a} {w} {b}.",
    "Tell me {a} {w} {b}.",
    "Can you calculate {a} {w} {b}?",
    "Quick question: what is {a} {w} {b}?",
    "I need {a} {w} {b}",
    "{a} {w} {b}?",
)
NOVEL_COUNTING = (
    "How often does {l} occur in {w}?",
    "What is the number of {l} in {w}?",
    "Tell me how many {l} are in {w}.",
    "{w}: how many {l}?",
)
NOVEL_WORDS = (
    "elephant",
    "giraffe",
    "umbrella",
    "chocolate",
    "kangaroo",
    "pineapple",
    "volcano",
    "lantern",
    "hammock",
    "butterfly",
    "dolphin",
    "avocado",
    "penguin",
    "blueberry",
    "cinnamon",
    "octopus",
)


def held_out_cases(seed: int, seen: set[str], words: Sequence[str], n: int) -> list[Case]:
    """Questions drawn like the training data whose text never occurs in it (2/3 arithmetic)."""
    rng = random.Random(seed)
    out: list[Case] = []
    while len(out) < n:
        user, reply = arithmetic_chat(rng) if len(out) % 3 else counting_chat(rng, words)
        case = Case.of(user.plain_text(), reply)
        if case.question not in seen and case.question != DEMO_QUESTION and case not in out:
            out.append(case)
    return out


def novel_cases(seed: int, words: Sequence[str], n: int) -> dict[str, list[Case]]:
    """Three harder sets: unseen arithmetic phrasings, unseen counting phrasings, unseen words."""
    rng = random.Random(seed)
    unseen_words = [w for w in NOVEL_WORDS if w not in words and w not in FAVOURITE_WORDS]
    sets: dict[str, list[Case]] = {
        "novel arithmetic phrasing": [],
        "novel counting phrasing": [],
        "novel words": [],
    }
    for _ in range(n):
        a, sym, b = arithmetic_operands(rng)
        q = rng.choice(NOVEL_ARITHMETIC).format(a=a, w=OPERATIONS[sym][0], b=b)
        sets["novel arithmetic phrasing"].append(Case.of(q, arithmetic_reply(a, sym, b)))
        word, letter = count_operands(rng, words)
        q = rng.choice(NOVEL_COUNTING).format(l=letter, w=word)
        sets["novel counting phrasing"].append(Case.of(q, count_reply(word, letter)))
        word = rng.choice(unseen_words)
        letter = rng.choice(word)
        q = rng.choice(COUNT_TEMPLATES).format(l=letter, w=word)
        sets["novel words"].append(Case.of(q, count_reply(word, letter)))
    return sets


@dataclass
class Score:
    n: int = 0
    call: int = 0  # the model wrote exactly the expected calculator call
    tool: int = 0  # the forced calculator output is the right one (a wrong word can still count right)
    reply: int = 0  # call, output and the text after it are all exactly as taught


def grade(session: ChatSession, cases: Sequence[Case], label: str) -> Score:
    score = Score()
    for case in cases:
        got = ask(session, case.question)
        tool_ok = got.output == case.output and got.forced_ok
        reply_ok = tool_ok and got.expr == case.call and got.text == case.text
        score.n += 1
        score.call += got.expr == case.call
        score.tool += tool_ok
        score.reply += reply_ok
        mark = "ok " if reply_ok else ("~  " if tool_ok else "BAD")
        print(f"  [{label}] {mark} {case.question!r} -> {got.expr!r} = {got.output!r}; {got.text!r}")
    return score


def check_with_engine(out_dir: Path, sets: dict[str, Sequence[Case]]) -> dict[str, Score]:
    """Load the saved files like the app does and grade greedy replies; exits if 12*7 fails."""
    from desktop.engine.session import ChatSession

    session = ChatSession.open(out_dir / "chatsft_checkpoints" / TAG)
    demo = ask(session, DEMO_QUESTION)
    if demo.output != str(12 * 7) or not demo.forced_ok:
        raise SystemExit(f"demo check failed: {DEMO_QUESTION!r} gave call {demo.expr!r} -> {demo.output!r}")
    scores = {label: grade(session, cases, label) for label, cases in sets.items()}
    for q in ("Hello", "Who are you?", "Tell me a joke."):
        print(f"  {q!r} -> {ask(session, q).text!r}")
    return scores


# --------------------------------------------------------------------------------------------
# Loss curve picture (Qt is a dependency of the app anyway; drawn offscreen)
# --------------------------------------------------------------------------------------------


def draw_loss_curve(path: Path, series: dict[str, Sequence[tuple[int, float]]]) -> None:
    """Line chart of ``series`` (label -> (step, loss) points) on a log scale, saved as PNG."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter, QPainterPath, QPen

    app = QGuiApplication.instance() or QGuiApplication([])  # noqa: F841 - text drawing needs one
    W, H, left, right, top, bottom = 800, 450, 60, 20, 40, 50
    colors = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
    points = [v for pts in series.values() for _, v in pts if v > 0]
    lo, hi = math.log10(min(points)) - 0.05, math.log10(max(points)) + 0.05
    max_step = max(s for pts in series.values() for s, _ in pts)
    plot = QRectF(left, top, W - left - right, H - top - bottom)

    def pt(step: float, value: float) -> QPointF:
        frac = (math.log10(max(value, 10**lo)) - lo) / (hi - lo)
        return QPointF(plot.left() + plot.width() * step / max_step, plot.bottom() - plot.height() * frac)

    img = QImage(W, H, QImage.Format.Format_ARGB32)
    img.fill(QColor("white"))
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    grid, ink = QPen(QColor("#dddddd"), 1), QPen(QColor("#333333"), 1)
    ticks = [m * 10**e for e in range(math.floor(lo), math.ceil(hi) + 1) for m in (1, 2, 5)]
    for v in (t for t in ticks if lo <= math.log10(t) <= hi):
        p.setPen(grid)
        p.drawLine(pt(0, v), pt(max_step, v))
        p.setPen(ink)
        p.drawText(QRectF(0, pt(0, v).y() - 8, left - 8, 16), Qt.AlignmentFlag.AlignRight, f"{v:g}")
    for i in range(6):
        x = pt(max_step * i / 5, 10**lo).x()
        p.drawText(
            QRectF(x - 30, plot.bottom() + 6, 60, 16),
            Qt.AlignmentFlag.AlignHCenter,
            f"{max_step * i / 5:.0f}",
        )
    for i, (label, pts) in enumerate(series.items()):
        curve = QPainterPath(pt(*pts[0]))
        for s_, v in pts[1:]:
            curve.lineTo(pt(s_, v))
        p.setPen(QPen(QColor(colors[i % len(colors)]), 2))
        p.drawPath(curve)
        # Bottom left stays empty: every curve starts high and falls to the right.
        p.drawText(QPointF(plot.left() + 16, plot.bottom() - 12 - 18 * (len(series) - 1 - i)), label)
    p.setPen(ink)
    p.drawRect(plot)
    p.drawText(
        QRectF(0, 8, W, 20),
        Qt.AlignmentFlag.AlignHCenter,
        "Nanoscope demo model: cross-entropy per trained token (nats, log scale)",
    )
    p.drawText(QRectF(0, H - 22, W, 20), Qt.AlignmentFlag.AlignHCenter, "optimizer step")
    p.end()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not img.save(str(path)):
        raise OSError(f"{path}: could not write the loss curve")


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("resources/demo"), help="output base dir")
    ap.add_argument("--plot", type=Path, default=Path("docs/demo_loss.png"), help="loss curve PNG")
    ap.add_argument("--steps", type=int, default=1500, help="optimizer steps (the LR schedule spans them)")
    ap.add_argument("--minutes", type=float, default=12.0, help="stop training early after this long")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--sequence-len", type=int, default=256)
    ap.add_argument("--window-pattern", default="SSSL")
    ap.add_argument("--conversations", type=int, default=40000, help="synthetic training conversations")
    ap.add_argument(
        "--documents", type=int, default=450, help="prose paragraphs to train on (200 more validate)"
    )
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--held-out", type=int, default=60, help="questions graded through the engine")
    ap.add_argument("--check-only", action="store_true", help="only grade the demo already in --out")
    return ap.parse_args(argv)


@dataclass
class Data:
    train: list[Example]
    val: dict[str, list[Example]]  # "chat" (the SFT-like data) and "prose"
    tok: TiktokenTokenizer
    token_bytes: torch.Tensor  # UTF-8 length of each token, 0 for specials (for bits per byte)


@dataclass
class Text:
    chats: list[list[Message]]
    val_chats: list[list[Message]]
    docs: list[str]  # the first 200 validate
    words: list[str]


def generate_text(args: argparse.Namespace) -> Text:
    """All the synthetic conversations and the prose, from the seed alone."""
    rng = random.Random(args.seed)
    paragraphs = prose_paragraphs()
    words = vocabulary(paragraphs)
    docs = [p for p in paragraphs if 80 <= len(p) <= 600]
    random.Random(args.seed + 1).shuffle(docs)
    docs = docs[: args.documents + 200]
    chats = [conversation(rng, words) for _ in range(args.conversations)]
    val_rng = random.Random(args.seed + 2)
    val_chats = [conversation(val_rng, words) for _ in range(400)]
    print(f"data: {len(chats)} conversations, {len(docs)} prose paragraphs, {len(words)} words to count in")
    return Text(chats, val_chats, docs, words)


def build_data(args: argparse.Namespace, text: Text) -> Data:
    """Learn and save the tokenizer, then render everything to ids + masks."""
    chats, val_chats, docs = text.chats, text.val_chats, text.docs

    t0 = time.perf_counter()
    ranks = train_bpe([s for c in chats for s in message_strings(c)] + docs, VOCAB_SIZE - len(SPECIAL_TOKENS))
    enc = build_encoding(ranks)
    if enc.n_vocab != VOCAB_SIZE:
        raise SystemExit(f"the BPE trainer ran out of pairs at {enc.n_vocab} tokens; add text")
    tok_path = args.out / "tokenizer" / "tokenizer.pkl"
    tok_path.parent.mkdir(parents=True, exist_ok=True)
    with tok_path.open("wb") as f:
        pickle.dump(enc, f)
    tok = TiktokenTokenizer(enc, tok_path)
    print(f"tokenizer: {enc.n_vocab} tokens learned in {time.perf_counter() - t0:.1f}s -> {tok_path}")
    token_bytes = torch.tensor(
        [len(enc.decode_single_token_bytes(i)) if i < len(ranks) else 0 for i in range(enc.n_vocab)],
        dtype=torch.float32,
    )

    def fits(examples: list[Example]) -> list[Example]:
        return [e for e in examples if len(e.ids) <= args.sequence_len]

    train = fits([render_chat(tok, c) for c in chats] + [render_document(tok, d) for d in docs[200:]])
    val = {
        "chat": fits([render_chat(tok, c) for c in val_chats]),
        "prose": fits([render_document(tok, d) for d in docs[:200]]),
    }
    print(f"tokens: train {sum(len(e.ids) for e in train):,}, trained on {sum(sum(e.mask) for e in train):,}")
    return Data(train, val, tok, token_bytes)


def build_model(args: argparse.Namespace) -> GPT:
    """An initialised E7 model, checked to be exactly what the app's loader would build."""
    cfg = demo_config(args.sequence_len, args.n_layer, args.n_embd, args.n_head, args.window_pattern.upper())
    model = GPT(cfg)
    init_weights(model)
    # Not GPT.prepare(): that readies a loaded model for inference (frozen weights, decode helpers).
    model.set_rotary(torch.device("cpu"), torch.float32)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if shapes != expected_shapes(cfg):
        raise SystemExit("the state_dict's keys or shapes differ from what the loader expects")
    inferred = classify({"model_config": model_config_meta(cfg)}, shapes, "demo")
    if inferred != cfg:
        raise SystemExit(f"the loader would build a different model:\n{inferred}\n{cfg}")
    print(
        f"model: E7, {sum(p.numel() for p in model.parameters()):,} parameters, L={cfg.n_layer} "
        f"C={cfg.n_embd} H={cfg.n_head} window={cfg.window_pattern} seq={cfg.sequence_len}"
    )
    return model


@dataclass
class Training:
    steps: int = 0
    minutes: float = 0.0
    stopped_early: bool = False
    train_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, EMA of batch loss)
    evals: list[tuple[int, float, dict[str, tuple[float, float]]]] = field(default_factory=list)

    def last_eval(self, name: str) -> tuple[float, float]:
        return self.evals[-1][2][name]


def train_model(model: GPT, data: Data, args: argparse.Namespace) -> Training:
    opt = make_optimizer(model, args.lr)
    rng = random.Random(args.seed + 4)
    pad = data.tok.bos_id
    order: list[list[int]] = []
    run = Training()
    ema = float("nan")
    seen_tokens = 0
    started = time.perf_counter()

    def evaluate() -> None:
        losses = {name: evaluate_loss(model, ex, pad, data.token_bytes) for name, ex in data.val.items()}
        run.evals.append((run.steps, ema, losses))

    model.train()
    while run.steps < args.steps:
        if run.steps % args.eval_every == 0:
            evaluate()
        if not order:
            order = batch_order(data.train, args.batch_size, rng)
        x, y = collate([data.train[i] for i in order.pop()], pad)
        factor = lr_factor(run.steps, args.steps, warmup=50)
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * factor
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run.steps += 1
        seen_tokens += x.numel()
        batch_loss = loss.item()
        ema = batch_loss if math.isnan(ema) else 0.95 * ema + 0.05 * batch_loss
        run.train_curve.append((run.steps, ema))
        elapsed = time.perf_counter() - started
        if run.steps % 25 == 0 or run.steps == args.steps:
            eta = elapsed / run.steps * (args.steps - run.steps)
            print(
                f"step {run.steps:5d}/{args.steps} loss {ema:.4f} lr x{factor:.2f} "
                f"{seen_tokens / elapsed:,.0f} tok/s {elapsed / 60:.1f}m eta {eta / 60:.1f}m",
                flush=True,
            )
        if elapsed > args.minutes * 60 and run.steps < args.steps:
            print(f"time limit of {args.minutes} min reached at step {run.steps}; stopping early")
            run.stopped_early = True
            break
    evaluate()
    run.minutes = (time.perf_counter() - started) / 60
    model.eval()
    return run


def save_checkpoint(model: GPT, run: Training, args: argparse.Namespace) -> Path:
    """``model_<step>.pt`` + ``meta_<step>.json`` as nanochat's chat_sft writes them."""
    ckpt_dir = args.out / "chatsft_checkpoints" / TAG
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    for old in [*ckpt_dir.glob("model_*.pt"), *ckpt_dir.glob("meta_*.json")]:
        old.unlink()  # one step only, so the app never picks a stale one
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    torch.save(state, ckpt_dir / f"model_{run.steps:06d}.pt")
    val_loss, val_bpb = run.last_eval("chat")
    user_config = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("out", "plot")
    }
    user_config.update(script="packaging/train_demo.py", stopped_early=run.stopped_early)
    meta = {
        "step": run.steps,
        "val_bpb": round(val_bpb, 6),
        "val_loss": round(val_loss, 6),
        "model_config": model_config_meta(model.config),
        "user_config": user_config,
    }
    (ckpt_dir / f"meta_{run.steps:06d}.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return ckpt_dir


def print_loss_table(run: Training) -> None:
    """The loss table docs/DEMO_MODEL.md shows (markdown)."""
    print("\n| step | train loss (EMA) | val loss, chat | val bpb, chat | val loss, prose |")
    print("|---:|---:|---:|---:|---:|")
    picks = run.evals[:: max(1, len(run.evals) // 6)]
    if picks[-1] is not run.evals[-1]:
        picks.append(run.evals[-1])
    for step, ema, losses in picks:
        train = "–" if math.isnan(ema) else f"{ema:.3f}"
        (chat_loss, chat_bpb), (prose_loss, _) = losses["chat"], losses["prose"]
        print(f"| {step} | {train} | {chat_loss:.3f} | {chat_bpb:.3f} | {prose_loss:.3f} |")


def grade_demo(args: argparse.Namespace, text: Text) -> None:
    """Grade the saved demo through the engine and print the accuracy table (markdown)."""
    seen = {m.plain_text() for c in text.chats for m in c if m.role == "user"}
    sets: dict[str, Sequence[Case]] = {
        "showcase": SHOWCASE,
        "held-out": held_out_cases(args.seed + 3, seen, text.words, args.held_out),
    }
    sets.update(novel_cases(args.seed + 5, text.words, args.held_out // 3))
    scores = check_with_engine(args.out, sets)
    print("\n| question set | questions | exact call | right result | whole reply exact |")
    print("|---|---:|---:|---:|---:|")
    for label, sc in scores.items():
        cells = " | ".join(f"{k} ({100 * k / sc.n:.0f}%)" for k in (sc.call, sc.tool, sc.reply))
        print(f"| {label} | {sc.n} | {cells} |")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    text = generate_text(args)
    if args.check_only:
        grade_demo(args, text)
        return 0
    data = build_data(args, text)
    model = build_model(args)
    run = train_model(model, data, args)
    val_loss, val_bpb = run.last_eval("chat")
    print(f"final: chat val loss {val_loss:.4f}, bpb {val_bpb:.4f}; training took {run.minutes:.1f} min")
    ckpt_dir = save_checkpoint(model, run, args)
    total = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"saved {ckpt_dir}: {total / 1e6:.2f} MB in {args.out}")
    if total > 10_000_000:
        raise SystemExit(f"{args.out} holds {total} bytes; the demo must stay within 10 MB")
    curves = {"train (EMA of batch loss)": run.train_curve}
    for name in data.val:
        curves[f"validation, {name}"] = [(step, losses[name][0]) for step, _, losses in run.evals]
    draw_loss_curve(args.plot, curves)
    print(f"loss curve -> {args.plot}")

    print_loss_table(run)
    grade_demo(args, text)
    print(f"total wall time {(time.perf_counter() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
