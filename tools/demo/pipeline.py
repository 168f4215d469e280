"""From settings to saved snapshots: the corpus, the tokenizer, the examples and the training run."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from desktop.engine.nanochat.tokenizer import TiktokenTokenizer

from . import bpe, snapshots
from .data import Chat, ChatMaker, chat_strings, prose_paragraphs, vocabulary
from .examples import Example, render_document, render_fitting
from .settings import RunSettings
from .training import Losses, TrainingLog, build_model, evaluate_loss, train

logger = logging.getLogger(__name__)


@dataclass
class Corpus:
    chats: list[Chat]
    val_chats: list[Chat]
    train_docs: list[str]
    val_docs: list[str]
    words: list[str]


def make_corpus(s: RunSettings) -> Corpus:
    """The synthetic chats and the prose, from the seed alone."""
    paragraphs = prose_paragraphs()
    words = vocabulary(paragraphs)
    docs = [p for p in paragraphs if 80 <= len(p) <= 600]
    random.Random(s.seed + 1).shuffle(docs)
    maker = ChatMaker(random.Random(s.seed), words)
    chats = [maker.training_chat(s.max_exchanges) for _ in range(s.conversations)]
    val_maker = ChatMaker(random.Random(s.seed + 2), words)
    val_chats = [val_maker.training_chat(s.max_exchanges) for _ in range(s.val_conversations)]
    return Corpus(chats, val_chats, docs[s.documents : 2 * s.documents], docs[: s.documents], words)


def held_out_chats(s: RunSettings, corpus: Corpus) -> list[Chat]:
    """Chats of ``grade_exchanges`` questions with a result each, no fresh question seen in training."""
    seen = {ex.question for chat in corpus.chats for ex in chat}
    maker = ChatMaker(random.Random(s.seed + 3), corpus.words, avoid=seen, tools_only=True)
    return [maker.chat(s.grade_exchanges) for _ in range(s.grade_chats)]


@dataclass
class Tokens:
    tok: TiktokenTokenizer
    token_bytes: torch.Tensor  # UTF-8 length of each token, 0 for specials (for bits per byte)


def make_tokenizer(s: RunSettings, corpus: Corpus) -> Tokens:
    texts = [t for chat in corpus.chats for t in chat_strings(chat)] + corpus.train_docs
    enc = bpe.build_encoding(bpe.learn_ranks(texts, s.vocab_size))
    path = s.out / "tokenizer" / "tokenizer.pkl"
    bpe.save_encoding(enc, path)
    n_ranks = enc.n_vocab - len(enc.special_tokens_set)
    sizes = [len(enc.decode_single_token_bytes(i)) if i < n_ranks else 0 for i in range(enc.n_vocab)]
    return Tokens(TiktokenTokenizer(enc, path), torch.tensor(sizes, dtype=torch.float32))


def render_all(s: RunSettings, corpus: Corpus, tok: TiktokenTokenizer) -> tuple[list[Example], dict]:
    limit = s.sequence_len

    def chats(cs: Sequence[Chat]) -> list[Example]:
        return [e for c in cs if (e := render_fitting(tok, c, limit)) is not None]

    train_set = chats(corpus.chats) + [render_document(tok, d, limit) for d in corpus.train_docs]
    val = {
        "chat": chats(corpus.val_chats),
        "prose": [render_document(tok, d, limit) for d in corpus.val_docs],
    }
    return train_set, val


def run_training(s: RunSettings, corpus: Corpus) -> TrainingLog:
    started = time.perf_counter()
    tokens = make_tokenizer(s, corpus)
    tok = tokens.tok
    logger.info("tokenizer: %d tokens learned in %.1fs", tok.vocab_size, time.perf_counter() - started)
    train_set, val = render_all(s, corpus, tok)
    n_tokens = sum(len(e.ids) for e in train_set)
    n_trained = sum(sum(e.mask) for e in train_set)
    logger.info("data: %d examples, %d tokens, %d trained on", len(train_set), n_tokens, n_trained)
    model = build_model(s)
    logger.info("model: E7, %d parameters", sum(p.numel() for p in model.parameters()))

    def evaluate(m: torch.nn.Module) -> Losses:
        return {name: evaluate_loss(m, ex, tok.bos_id, tokens.token_bytes) for name, ex in val.items()}

    def on_snapshot(m: torch.nn.Module, step: int) -> Losses:
        losses = evaluate(snapshots.as_shipped(m))  # the loss of the weights as stored
        path = snapshots.save(m, step, losses, s)
        logger.info("saved %s (chat val loss %.4f)", path, losses["chat"][0])
        return losses

    snapshots.clear(s)
    return train(model, train_set, evaluate, s, tok.bos_id, on_snapshot)
