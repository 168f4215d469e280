"""One configurable model description covering every nanochat era and the seed fork.

The meta json never records the architecture switches (softcap, rope base, value embeddings,
smear...), so ``classify.py`` infers them from the state_dict and fills this dataclass; the model
is then built from it alone (docs/ARCHITECTURE.md, Eras).

The meta's own fields are typed here (:data:`META_FIELDS`: type, range, default) so every value
read from a file is checked once with a readable message, and :func:`table_bytes` says what the
meta's numbers will make the model allocate, so the loader can refuse before allocating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from desktop.engine.files.numbers import NumberRefused, finite_float


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
    has_mtp: bool = False  # the fork's MTP head: left out of the model, read when it drafts (mtp.py)
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


# --- the meta's model_config, field by field ----------------------------------------------------

# The most Engram n-gram order and the most orders: the fork's default is "2,3,4". Each order
# pads and pools its history at every step, so a file's 10**9 would allocate gigabytes.
MAX_NGRAM_ORDER = 64
MAX_NGRAM_ORDERS = 16
# Sinkhorn rounds of the mHC mixer run per layer per token (the fork's default is 5).
MAX_SINKHORN_ITERS = 100


@dataclass(frozen=True)
class MetaField:
    """One ``model_config`` field Nanoscope reads: its type and the values it accepts.

    ``kind``: "int", "float", "bool", "text" or "ints" (a list of ints, or the fork's comma-separated
    text). ``lo``/``hi`` bound numbers (and every item of "ints"); ``lo_open`` excludes ``lo``.
    ``zero_is_default``: 0 or null means "use the default" (the fork writes 0 for "derive it").
    """

    name: str
    kind: str
    lo: float = 0
    hi: float = 0
    required: bool = False
    lo_open: bool = False
    choices: tuple[str, ...] = ()
    zero_is_default: bool = False


META_FIELDS: tuple[MetaField, ...] = (
    MetaField("sequence_len", "int", 1, 1 << 20, required=True),
    MetaField("vocab_size", "int", 1, 1 << 22, required=True),
    MetaField("n_layer", "int", 1, 1024, required=True),
    MetaField("n_head", "int", 1, 1024, required=True),
    MetaField("n_kv_head", "int", 1, 1024),
    MetaField("n_embd", "int", 1, 1 << 16, required=True),
    MetaField("window_pattern", "text"),
    # the fork (checkpoint-formats spec §2.1)
    MetaField("window_long", "int", 0, 1 << 24, zero_is_default=True),
    MetaField("window_short", "int", 0, 1 << 24, zero_is_default=True),
    MetaField("rope_theta", "float", 0, 1e12, lo_open=True, zero_is_default=True),
    MetaField("activation", "text", choices=("relu2", "swiglu")),
    MetaField("engram_layers", "ints", -1024, 1023),
    MetaField("engram_ngram_orders", "ints", -(1 << 20), MAX_NGRAM_ORDER),
    MetaField("engram_bottleneck_dim", "int", 0, 1 << 16, zero_is_default=True),
    MetaField("mhc_sinkhorn_iters", "int", 0, MAX_SINKHORN_ITERS),
    MetaField("mhc_temperature", "float", 0, 1e6, lo_open=True),
    MetaField("mhc_epsilon", "float", 0, 0.5, lo_open=True),
    MetaField("mhc_blend_alpha", "float", 0, 1),
    MetaField("mamba_enabled", "bool"),
)
META_FIELD = {f.name: f for f in META_FIELDS}


def _fmt_bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _short(value: object) -> str:
    """A value for a message: never a 5,000-digit number or a megabyte of text."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"a {int(abs(value).bit_length() * 0.30103) + 1}-digit number"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(f: MetaField, value: object, where: str) -> float | int:
    label = f"{where}: model_config.{f.name}"
    number: float | int
    if f.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{label} must be an integer, got {_short(value)}")
        number = value
    else:
        try:
            number = finite_float(value)  # a 400-digit int is a number, but not a finite float
        except NumberRefused:
            raise ValueError(f"{label} must be a finite number, got {_short(value)}") from None
    if number < f.lo or (f.lo_open and number == f.lo):
        word = "positive" if f.lo == 0 and f.lo_open else f"at least {_fmt_bound(f.lo)}"
        if f.lo == 1 and f.kind == "int":
            word = "positive"
        raise ValueError(f"{label} must be {word}, got {_short(value)}")
    if number > f.hi:
        raise ValueError(f"{label}={_short(value)} is implausibly large (limit {_fmt_bound(f.hi)})")
    return number


def _ints(f: MetaField, value: object, where: str) -> tuple[int, ...]:
    label = f"{where}: model_config.{f.name}"
    if isinstance(value, str):
        if len(value) > 10_000:
            raise ValueError(f"{label} is {len(value)} characters long")
        parts: list[object] = []
        for piece in value.split(","):
            piece = piece.strip()
            if not piece:
                continue
            if not piece.lstrip("-").isdigit() or len(piece) > 18:
                raise ValueError(f"{label} must be comma-separated integers, got {_short(value)}")
            parts.append(int(piece))
    elif isinstance(value, list):
        parts = list(value)
    elif value is None:
        parts = []
    else:
        raise ValueError(f"{label} must be a list or comma-separated integers, got {_short(value)}")
    if len(parts) > 1024:
        raise ValueError(f"{label} lists {len(parts)} values")
    item = MetaField(f.name, "int", f.lo, f.hi)
    return tuple(int(_number(item, p, where)) for p in parts)


def parse_meta_field(f: MetaField, value: object, where: str) -> object:
    """``value`` as ``f``'s type, or ValueError with one line naming the field and the value."""
    if f.zero_is_default and (value is None or value == 0):
        return None
    if f.kind in ("int", "float"):
        return _number(f, value, where)
    if f.kind == "ints":
        return _ints(f, value, where)
    if f.kind == "bool":
        if value is None or isinstance(value, bool) or (type(value) is int and value in (0, 1)):
            return bool(value)
        raise ValueError(f"{where}: model_config.{f.name} must be true or false, got {_short(value)}")
    if not isinstance(value, str) or len(value) > 1024:
        raise ValueError(f"{where}: model_config.{f.name} must be a short text, got {_short(value)}")
    if f.choices and value not in f.choices:
        raise ValueError(
            f"{where}: model_config.{f.name} must be one of {', '.join(f.choices)}, got {_short(value)}"
        )
    return value


# --- memory the meta's numbers decide ------------------------------------------------------------


def table_bytes(cfg: ModelConfig, dtype_bytes: int) -> dict[str, int]:
    """Bytes the model allocates from the meta's numbers, besides its weights.

    The rotary table grows on demand up to nanochat's 10 x sequence_len rows (``rope_len``); while
    it is built, t, freqs, cos and sin exist in float32 beside the final [[cos, sin], [-sin, cos]]
    table (and its stacked halves). The KV cache of one full context holds keys and values per layer,
    token ids, and the smear and Engram histories of the eras that keep them.
    """
    rows, hd = cfg.rope_len, cfg.head_dim
    rotary = rows * (4 + hd // 2 * 4 * 4 + 2 * hd * dtype_bytes * 2)
    seq = cfg.sequence_len
    kv = 2 * cfg.n_layer * seq * cfg.n_kv_head * hd * dtype_bytes + seq * 8
    if cfg.has_smear:
        kv += seq * cfg.n_embd * dtype_bytes
    kv += len(cfg.engram_layers) * seq * cfg.engram_dim * dtype_bytes
    return {"rotary tables": rotary, "KV cache": kv}
