"""One configurable model description covering every nanochat era and the seed fork.

The meta json never records the architecture switches (softcap, rope base, value embeddings,
smear...), so ``classify.py`` infers them from the state_dict and fills this dataclass; the model
is then built from it alone (docs/ARCHITECTURE.md, Eras).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    return ((vocab_size + multiple - 1) // multiple) * multiple


def has_value_embedding(layer: int, n_layer: int) -> bool:
    """nanochat's VE layer rule: alternate layers, always including the last one."""
    return layer % 2 == (n_layer - 1) % 2


@dataclass(frozen=True)
class ModelConfig:
    sequence_len: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    embed_rows: int  # rows of wte/lm_head: padded vocab, or V for pre-padding checkpoints
    era: str  # "E0".."E7" or "fork"
    window_pattern: str = "L"
    long_window: int = 0  # 0 -> sequence_len; E0/E1 (before windows existed) attend without limit
    short_window: int = 0  # left window of "S" layers
    softcap: float = 15.0
    rope_base: float = 10000.0
    rope_bf16: bool = True  # cos/sin tables rounded to bf16 (E0-E5 and the fork)
    qk_scale: float = 1.0
    has_lambdas: bool = False
    ve_layers: tuple[int, ...] = ()
    ve_gate_channels: int = 0
    ve_gate_scale: float = 0.0
    has_bigram: bool = False
    has_smear: bool = False  # E7 smear + backout
    swiglu: bool = False
    mlp_hidden: int = 0  # 0 -> 4*n_embd
    engram_layers: tuple[int, ...] = ()
    engram_orders: tuple[int, ...] = ()
    engram_dim: int = 0
    mhc: bool = False
    mhc_sinkhorn_iters: int = 5
    mhc_temperature: float = 1.0
    mhc_epsilon: float = 1e-6
    mhc_blend_alpha: float = 1.0
    dsa_layers: tuple[int, ...] = ()  # layers with an (ignored) DSA indexer: dense at decode
    has_mtp: bool = False  # training-only head; keys accepted, never used
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def hidden_dim(self) -> int:
        return self.mlp_hidden or 4 * self.n_embd

    @property
    def rope_len(self) -> int:
        """nanochat precomputes rotary tables for 10x the training length and asserts beyond."""
        return 10 * self.sequence_len

    @property
    def is_fork(self) -> bool:
        return self.era == "fork"

    def window_sizes(self) -> list[int]:
        """Per-layer left window (FA3 ``(left, 0)`` semantics: a query sees ``left + 1`` keys).

        The pattern is tiled over layers and the last layer is always "L". "L" is
        ``(sequence_len, 0)``, not unlimited (docs/ARCHITECTURE.md, Eras).
        """
        long_w = self.long_window or self.sequence_len
        short_w = self.short_window or long_w // 2
        pattern = (self.window_pattern or "L").upper()
        sizes = [long_w if pattern[i % len(pattern)] == "L" else short_w for i in range(self.n_layer)]
        sizes[-1] = long_w
        return sizes


def e6_short_window(seq: int) -> int:
    return math.ceil(math.ceil(seq / 3) / 128) * 128


def e7_short_window(seq: int) -> int:
    return -(-seq // 4 // 128) * 128


def e7_config(
    sequence_len: int, vocab_size: int, n_layer: int, n_head: int, n_embd: int, window_pattern: str = "SSSL"
) -> ModelConfig:
    """The current upstream architecture (E7), as ``classify`` infers it: for writing new checkpoints
    (the demo trainer, benchmarks) with exactly the era parameters the loader will expect."""
    return ModelConfig(
        sequence_len=sequence_len,
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=n_head,
        n_embd=n_embd,
        embed_rows=padded_vocab(vocab_size),
        era="E7",
        window_pattern=window_pattern,
        short_window=e7_short_window(sequence_len),
        rope_base=100000.0,
        rope_bf16=False,
        qk_scale=1.2,
        has_lambdas=True,
        ve_layers=tuple(i for i in range(n_layer) if has_value_embedding(i, n_layer)),
        ve_gate_channels=12,
        ve_gate_scale=3.0,
        has_smear=True,
    )
