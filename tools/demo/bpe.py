"""The demo's tokenizer: byte-level BPE learned by ``rustbpe`` (nanochat's own trainer) and saved as
nanochat saves it, a pickled ``tiktoken.Encoding`` named "rustbpe" whose last ids are the nine
chat special tokens. The app loads it like any nanochat ``tokenizer.pkl``."""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from pathlib import Path

import tiktoken

from desktop.engine.nanochat.special_tokens import SPECIAL_TOKENS

# nanochat's split pattern: GPT-4's, with numbers split into groups of at most two digits, so a
# number in a question has the same tokens as in the calculator call.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)


class TokenizerTrainingError(RuntimeError):
    """The text was too small for the vocabulary asked for."""


def learn_ranks(texts: Iterable[str], vocab_size: int) -> dict[bytes, int]:
    """``mergeable_ranks`` (256 bytes, then merges) leaving room for the special tokens.

    rustbpe merges the most frequent pair first and breaks ties by the smaller pair of ids, so
    the same texts always give the same ranks.
    """
    import rustbpe  # training-only dependency: the `demo` extra

    n_ranks = vocab_size - len(SPECIAL_TOKENS)
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(iter(texts), n_ranks, pattern=SPLIT_PATTERN)
    ranks = {bytes(token): rank for token, rank in trainer.get_mergeable_ranks()}
    if len(ranks) != n_ranks:
        raise TokenizerTrainingError(f"only {len(ranks)} of {n_ranks} tokens could be learned; add text")
    return ranks


def build_encoding(ranks: dict[bytes, int]) -> tiktoken.Encoding:
    """nanochat's tokenizer: the learned ranks plus the special tokens on the last ids."""
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(
        name="rustbpe", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )


def save_encoding(enc: tiktoken.Encoding, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(enc, f)
