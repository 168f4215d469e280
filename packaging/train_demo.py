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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import regex
import tiktoken
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from desktop.engine.classify import classify, expected_shapes  # noqa: E402
from desktop.engine.config import ModelConfig, e7_short_window, has_value_embedding, padded_vocab  # noqa: E402
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, Part  # noqa: E402
from desktop.engine.model import GPT  # noqa: E402
from desktop.engine.tokenizer import (  # noqa: E402
    ASSISTANT_END,
    ASSISTANT_START,
    BOS,
    OUTPUT_END,
    OUTPUT_START,
    PYTHON_END,
    PYTHON_START,
    USER_END,
    USER_START,
    TiktokenTokenizer,
)

# nanochat's split pattern: GPT-4's, with numbers split into groups of at most two digits.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
# nanochat's SPECIAL_TOKENS in its order: they take the last nine ids.
SPECIAL_TOKENS = (BOS, USER_START, USER_END, ASSISTANT_START, ASSISTANT_END, PYTHON_START, PYTHON_END,
                  OUTPUT_START, OUTPUT_END)
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
    "+": ("What is {a} plus {b}?", "What's {a}+{b}?", "what is {a} + {b}", "Compute {a} + {b}",
          "Calculate {a}+{b}.", "How much is {a} plus {b}?", "What is the sum of {a} and {b}?",
          "Add {a} and {b}.", "{a} + {b} = ?", "what's {a} plus {b}", "Please add {a} to {b}."),
    "-": ("What is {a} minus {b}?", "What's {a}-{b}?", "what is {a} - {b}", "Compute {a} - {b}",
          "Calculate {a}-{b}.", "How much is {a} minus {b}?", "Subtract {b} from {a}.",
          "What is the difference between {a} and {b}?", "{a} - {b} = ?", "what's {a} minus {b}",
          "Take {b} away from {a}."),
    "*": ("What is {a} times {b}?", "What's {a}*{b}?", "what's {a} * {b}", "Compute {a} * {b}",
          "Calculate {a}*{b}.", "How much is {a} times {b}?", "What is {a} multiplied by {b}?",
          "Multiply {a} by {b}.", "What is the product of {a} and {b}?", "{a} * {b} = ?",
          "what is {a} times {b}"),
    "/": ("What is {a} divided by {b}?", "What's {a}/{b}?", "what is {a} / {b}", "Compute {a} / {b}",
          "Calculate {a}/{b}.", "How much is {a} divided by {b}?", "Divide {a} by {b}.",
          "What do you get if you divide {a} by {b}?", "{a} / {b} = ?", "what's {a} divided by {b}"),
}
COUNT_TEMPLATES = ("How many {l} are in {w}?", "How many times does the letter {l} appear in {w}?",
                   "Count the letter {l} in {w}.", "how many {l} in {w}", "How many {l}'s are in the word {w}?",
                   "In the word {w}, how many {l} are there?", "Count how many {l} are in {w}")
FAVOURITE_WORDS = ("strawberry", "banana", "mississippi", "nanoscope", "python", "calculator", "bookkeeper",
                   "committee", "balloon", "letter", "apple", "tomorrow", "coffee", "pepper", "assessment")

INTRO = "I am a tiny demo model bundled with Nanoscope."
SKILLS = ('I can do arithmetic and count letters with my calculator tool, for example "What is 12 times 7?" '
          "or \"How many r are in strawberry?\".")
CANNED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("Hi", "Hello", "hello!", "Hey there", "Good morning", "hi there", "Hello, who are you?", "Howdy"),
     f"Hello! {INTRO} {SKILLS}"),
    (("Who are you?", "who are you", "What are you?", "What is your name?", "Introduce yourself.",
      "Are you a real model?", "what model is this"),
     f"{INTRO} I have about a million parameters and was trained for a few minutes on a laptop CPU. "
     "Open a nanochat checkpoint of your own to chat with a real model."),
    (("What can you do?", "Help", "help me", "What should I ask you?", "How do I use you?"), SKILLS),
    (("Thanks!", "thank you", "Thank you very much.", "thanks a lot", "Great, thanks."),
     "You are welcome! Ask me another sum whenever you like."),
)
FALLBACK = f"{INTRO} I only know arithmetic and letter counting, so I cannot answer that. {SKILLS}"
OFF_TOPIC = ("Tell me a joke.", "What is the capital of France?", "Write a poem about the sea.",
             "What is the meaning of life?", "Can you explain quantum physics?", "What's the weather like?",
             "Translate hello into French.", "Who won the world cup?", "Write some Python code.",
             "What is a neural network?", "Tell me a story.", "Why is the sky blue?")


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


def arithmetic_chat(rng: random.Random) -> list[Message]:
    sym = rng.choice(tuple(OPERATIONS))
    word, fn = OPERATIONS[sym]
    a, b = operand(rng), operand(rng)
    if sym == "/":
        b = rng.randint(1, 20)  # whole quotients keep the answers short: 100/4 -> 25.0
        a = b * operand(rng)
    question = vary_case(rng.choice(QUESTION_TEMPLATES[sym]).format(a=a, b=b), rng)
    result = fn(a, b)
    return [Message.of_text("user", question), tool_answer(f"{a}{sym}{b}", result, f"{a} {word} {b} is {result}.")]


def counting_chat(rng: random.Random, words: Sequence[str]) -> list[Message]:
    word = rng.choice(FAVOURITE_WORDS) if rng.random() < 0.15 else rng.choice(words)
    letter = rng.choice(word) if rng.random() < 0.85 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    question = vary_case(rng.choice(COUNT_TEMPLATES).format(l=letter, w=word), rng)
    n = word.count(letter)
    text = f"There is 1 {letter} in {word}." if n == 1 else f"There are {n} {letter} in {word}."
    return [Message.of_text("user", question), tool_answer(f"'{word}'.count('{letter}')", n, text)]


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
    return sorted(found)


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
        for pair in zip(w, w[1:]):
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
            if not any(p == pair for p in zip(w, w[1:])):
                continue
            for p in zip(w, w[1:]):
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
            for p in zip(out, out[1:]):
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
    return tiktoken.Encoding(name="rustbpe", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


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


def demo_config(sequence_len: int, n_layer: int, n_embd: int, n_head: int, window_pattern: str) -> ModelConfig:
    """The E7 configuration ``classify`` infers for such a checkpoint (asserted after building)."""
    return ModelConfig(
        sequence_len=sequence_len, vocab_size=VOCAB_SIZE, n_layer=n_layer, n_head=n_head, n_kv_head=n_head,
        n_embd=n_embd, embed_rows=padded_vocab(VOCAB_SIZE), era="E7", window_pattern=window_pattern,
        short_window=e7_short_window(sequence_len), softcap=15.0, rope_base=100000.0, rope_bf16=False,
        qk_scale=1.2, has_lambdas=True, ve_layers=tuple(i for i in range(n_layer) if has_value_embedding(i, n_layer)),
        ve_gate_channels=12, ve_gate_scale=3.0, has_smear=True,
    )


def model_config_meta(cfg: ModelConfig) -> dict:
    """The ``model_config`` block nanochat's chat_sft writes (GPTConfig's fields)."""
    return {"sequence_len": cfg.sequence_len, "vocab_size": cfg.vocab_size, "n_layer": cfg.n_layer,
            "n_head": cfg.n_head, "n_kv_head": cfg.n_kv_head, "n_embd": cfg.n_embd,
            "window_pattern": cfg.window_pattern}


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
        betas=(0.9, 0.95), eps=1e-10, weight_decay=0.0,
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
        chunk = sorted(idx[start:start + pool], key=lambda i: len(examples[i].ids))
        batches += [chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return [b for b in batches if len(b) == batch_size]


@torch.no_grad()
def evaluate_loss(model: GPT, examples: Sequence[Example], pad_id: int, token_bytes: torch.Tensor,
                  batch_size: int = 64) -> tuple[float, float]:
    """Mean loss per supervised token, and bits per byte over supervised non-special tokens."""
    model.eval()
    total_loss = total_tokens = 0.0
    nats = n_bytes = 0.0
    for start in range(0, len(examples), batch_size):
        x, y = collate(examples[start:start + batch_size], pad_id)
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
    kinds: list[str] = field(default_factory=list)


def ask(session, question: str, max_tokens: int = 64) -> Reply:
    """Greedy reply to one question, split into its calculator call, forced output and text."""
    from desktop.engine.sampling import SamplingParams

    rendered = session.render([Message.of_text("user", question)], max_tokens)
    reply = Reply()
    for ev in session.generate(rendered.ids, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                               reuse_cache=False):
        reply.kinds.append(ev.kind)
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


def held_out_questions(seed: int, seen: set[str], words: Sequence[str], n: int) -> list[tuple[str, Message]]:
    """Tool questions whose user text never occurs in training, with the reference reply."""
    rng = random.Random(seed)
    out: list[tuple[str, Message]] = []
    while len(out) < n:
        user, reply = arithmetic_chat(rng) if len(out) % 3 else counting_chat(rng, words)
        q = user.plain_text()
        if q not in seen and q != DEMO_QUESTION and all(q != o[0] for o in out):
            out.append((q, reply))
    return out


def check_with_engine(out_dir: Path, held_out: Sequence[tuple[str, Message]]) -> dict:
    """Load the saved files like the app does and grade greedy replies (raises if 12*7 fails)."""
    from desktop.engine.session import ChatSession

    session = ChatSession.open(out_dir / "chatsft_checkpoints" / TAG)
    demo = ask(session, DEMO_QUESTION)
    print(f"  {DEMO_QUESTION!r} -> call {demo.expr!r}, output {demo.output!r}, text {demo.text!r}")
    if demo.output != "84" or not demo.forced_ok:
        raise SystemExit(f"demo check failed: {DEMO_QUESTION!r} gave call {demo.expr!r} -> {demo.output!r}")
    tool_ok = answer_ok = 0
    rows = []
    for q, ref in held_out:
        got = ask(session, q)
        want_out = ref.parts[1].text
        ok_tool = got.output == want_out and got.forced_ok
        ok_answer = ok_tool and got.text == ref.parts[2].text
        tool_ok += ok_tool
        answer_ok += ok_answer
        rows.append({"question": q, "call": got.expr, "output": got.output, "text": got.text,
                     "tool_ok": ok_tool, "answer_ok": ok_answer})
        mark = "ok " if ok_answer else ("~  " if ok_tool else "BAD")
        print(f"  {mark} {q!r} -> {got.expr!r} = {got.output!r}; {got.text!r}")
    for q in ("Hello", "Who are you?", "Tell me a joke."):
        print(f"  {q!r} -> {ask(session, q).text!r}")
    n = len(held_out)
    print(f"held-out: tool result correct {tool_ok}/{n}, whole reply correct {answer_ok}/{n}")
    return {"n": n, "tool_correct": tool_ok, "answer_correct": answer_ok, "rows": rows}


# --------------------------------------------------------------------------------------------
# Loss curve picture (Qt is a dependency of the app anyway; drawn offscreen)
# --------------------------------------------------------------------------------------------


def draw_loss_curve(path: Path, train: Sequence[tuple[int, float]], val: Sequence[tuple[int, float]]) -> None:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter, QPainterPath, QPen

    app = QGuiApplication.instance() or QGuiApplication([])  # noqa: F841 - fonts need an application
    W, H, left, right, top, bottom = 800, 450, 70, 20, 40, 50
    img = QImage(W, H, QImage.Format.Format_ARGB32)
    img.fill(QColor("white"))
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    max_step = max(s for s, _ in train)
    y_max = max(v for _, v in [*train[len(train) // 50:], *val]) * 1.05
    plot = QRectF(left, top, W - left - right, H - top - bottom)

    def pt(step: float, value: float) -> QPointF:
        return QPointF(plot.left() + plot.width() * step / max_step,
                       plot.bottom() - plot.height() * min(value, y_max) / y_max)

    p.setPen(QPen(QColor("#dddddd"), 1))
    ticks = 5
    for i in range(ticks + 1):
        v = y_max * i / ticks
        p.drawLine(pt(0, v), pt(max_step, v))
        p.setPen(QColor("#444444"))
        p.drawText(QRectF(0, pt(0, v).y() - 8, left - 8, 16), Qt.AlignmentFlag.AlignRight, f"{v:.2f}")
        s = max_step * i / ticks
        p.drawText(QRectF(pt(s, 0).x() - 30, plot.bottom() + 6, 60, 16), Qt.AlignmentFlag.AlignHCenter, f"{s:.0f}")
        p.setPen(QPen(QColor("#dddddd"), 1))
    for series, color in ((train, "#1f77b4"), (val, "#d62728")):
        curve = QPainterPath(pt(*series[0]))
        for s, v in series[1:]:
            curve.lineTo(pt(s, v))
        p.setPen(QPen(QColor(color), 2))
        p.drawPath(curve)
    p.setPen(QColor("#222222"))
    p.drawRect(plot)
    p.drawText(QRectF(0, 8, W, 20), Qt.AlignmentFlag.AlignHCenter,
               "Nanoscope demo model: loss per supervised token (nats)")
    p.drawText(QRectF(0, H - 22, W, 20), Qt.AlignmentFlag.AlignHCenter, "step")
    p.setPen(QColor("#1f77b4"))
    p.drawText(QPointF(plot.right() - 230, plot.top() + 20), "train (EMA of batch loss)")
    p.setPen(QColor("#d62728"))
    p.drawText(QPointF(plot.right() - 230, plot.top() + 38), "validation")
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
    ap.add_argument("--documents", type=int, default=3000, help="prose paragraphs mixed in")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--held-out", type=int, default=60, help="questions graded through the engine")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    # Data -------------------------------------------------------------------------------
    paragraphs = prose_paragraphs()
    words = vocabulary(paragraphs)
    docs = [p for p in paragraphs if 80 <= len(p) <= 600]
    random.Random(args.seed + 1).shuffle(docs)
    docs = docs[: args.documents + 200]
    chats = [conversation(rng, words) for _ in range(args.conversations)]
    val_rng = random.Random(args.seed + 2)
    val_chats = [conversation(val_rng, words) for _ in range(400)]
    print(f"data: {len(chats)} conversations, {len(docs)} prose paragraphs, {len(words)} words to count letters in")

    # Tokenizer --------------------------------------------------------------------------
    t0 = time.perf_counter()
    ranks = train_bpe([s for c in chats for s in message_strings(c)] + docs, VOCAB_SIZE - len(SPECIAL_TOKENS))
    enc = build_encoding(ranks)
    assert enc.n_vocab == VOCAB_SIZE, enc.n_vocab
    tok_dir = args.out / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    tok_path = tok_dir / "tokenizer.pkl"
    with tok_path.open("wb") as f:
        pickle.dump(enc, f)
    tok = TiktokenTokenizer(enc, tok_path)
    print(f"tokenizer: {enc.n_vocab} tokens learned in {time.perf_counter() - t0:.1f}s -> {tok_path}")
    token_bytes = torch.tensor([len(enc.decode_single_token_bytes(i)) if i < len(ranks) else 0
                                for i in range(enc.n_vocab)], dtype=torch.float32)

    train = [render_chat(tok, c) for c in chats] + [render_document(tok, d) for d in docs[200:]]
    val = [render_chat(tok, c) for c in val_chats] + [render_document(tok, d) for d in docs[:200]]
    limit = args.sequence_len
    train = [e for e in train if len(e.ids) <= limit]
    val = [e for e in val if len(e.ids) <= limit]
    print(f"tokens: train {sum(len(e.ids) for e in train)}, supervised {sum(sum(e.mask) for e in train)}")

    # Model ------------------------------------------------------------------------------
    cfg = demo_config(args.sequence_len, args.n_layer, args.n_embd, args.n_head, args.window_pattern.upper())
    model = GPT(cfg)
    init_weights(model)
    model.init_rotary(torch.device("cpu"), torch.float32)
    meta_probe = {"model_config": model_config_meta(cfg)}
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == expected_shapes(cfg), "state_dict keys differ from what the loader expects"
    inferred = classify(meta_probe, shapes, "demo")
    assert inferred == cfg, f"the loader would build a different model:\n{inferred}\n{cfg}"
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: E7, {n_params:,} parameters, L={cfg.n_layer} C={cfg.n_embd} H={cfg.n_head} "
          f"window={cfg.window_pattern} seq={cfg.sequence_len}")

    # Train ------------------------------------------------------------------------------
    opt = make_optimizer(model, args.lr)
    pad = tok.bos_id
    order: list[list[int]] = []
    train_curve: list[tuple[int, float]] = []
    val_curve: list[tuple[int, float]] = []
    table: list[tuple[int, float, float, float]] = []
    ema = None
    t_train = time.perf_counter()
    seen_tokens = 0
    step = 0
    stopped_early = False
    model.train()
    while step < args.steps:
        if step % args.eval_every == 0:
            vl, vb = evaluate_loss(model, val, pad, token_bytes)
            val_curve.append((step, vl))
            table.append((step, ema if ema is not None else float("nan"), vl, vb))
        if not order:
            order = batch_order(train, args.batch_size, rng)
        x, y = collate([train[i] for i in order.pop()], pad)
        factor = lr_factor(step, args.steps, warmup=50)
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * factor
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen_tokens += x.numel()
        batch_loss = loss.item()
        ema = batch_loss if ema is None else 0.95 * ema + 0.05 * batch_loss
        train_curve.append((step, ema))
        elapsed = time.perf_counter() - t_train
        if step % 25 == 0 or step == args.steps:
            eta = elapsed / step * (args.steps - step)
            print(f"step {step:5d}/{args.steps} loss {ema:.4f} lr x{factor:.2f} "
                  f"{seen_tokens / elapsed:,.0f} tok/s elapsed {elapsed / 60:.1f}m eta {eta / 60:.1f}m", flush=True)
        if elapsed > args.minutes * 60 and step < args.steps:
            print(f"time limit of {args.minutes} min reached at step {step}; stopping early")
            stopped_early = True
            break
    vl, vb = evaluate_loss(model, val, pad, token_bytes)
    val_curve.append((step, vl))
    table.append((step, ema or float("nan"), vl, vb))
    train_minutes = (time.perf_counter() - t_train) / 60
    print(f"final: val loss {vl:.4f}, val bpb {vb:.4f}, training took {train_minutes:.1f} min")

    # Save -------------------------------------------------------------------------------
    ckpt_dir = args.out / "chatsft_checkpoints" / TAG
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    for old in [*ckpt_dir.glob("model_*.pt"), *ckpt_dir.glob("meta_*.json")]:
        old.unlink()  # one step only, so the app never picks a stale one
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    torch.save(state, ckpt_dir / f"model_{step:06d}.pt")
    user_config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                   if k not in ("out", "plot")}
    user_config.update(script="packaging/train_demo.py", stopped_early=stopped_early)
    meta = {"step": step, "val_bpb": round(vb, 6), "val_loss": round(vl, 6),
            "model_config": model_config_meta(cfg), "user_config": user_config}
    (ckpt_dir / f"meta_{step:06d}.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    total = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"saved {ckpt_dir}, {total / 1e6:.2f} MB in {args.out}")
    draw_loss_curve(args.plot, train_curve, val_curve)
    print(f"loss curve -> {args.plot}")

    # Check ------------------------------------------------------------------------------
    seen = {c[i].plain_text() for c in chats for i in range(0, len(c), 2)}
    report = check_with_engine(args.out, held_out_questions(args.seed + 3, seen, words, args.held_out))
    print("\n| step | train loss (EMA) | val loss | val bpb |\n|---:|---:|---:|---:|")
    for s, tl, v, b in table[:: max(1, len(table) // 8)] + ([table[-1]] if len(table) % 8 != 1 else []):
        print(f"| {s} | {tl:.3f} | {v:.3f} | {b:.3f} |")
    print(json.dumps({"params": n_params, "steps": step, "train_minutes": round(train_minutes, 2),
                      "total_minutes": round((time.perf_counter() - started) / 60, 2), "bytes": total,
                      "tool_correct": report["tool_correct"], "answer_correct": report["answer_correct"],
                      "held_out": report["n"], "config": asdict(cfg) | {"warnings": None}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
