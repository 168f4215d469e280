"""A Hugging Face ``config.json`` read into the few numbers the HF model needs (torch-free).

Two ``model_type`` s run (checkpoint-formats spec §4, §4.1):

* ``"nanochat"``: transformers' NanoChat port. Weightless RMSNorm with ``rms_norm_eps`` after the
  embedding, around every block and at the end; RoPE with nanochat's sign, then QK-norm; relu²;
  logits softcapped by ``final_logit_softcapping``.
* ``"llama"``: RMSNorm with weights, GQA, SwiGLU, rotary embeddings as the config writes them
  (default, ``"linear"`` or ``"llama3"`` scaling), tied or untied embeddings, optional biases.

Everything else gets one line naming what is not supported. The numbers are checked against
sane bounds here, before any file of weights is opened.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.engine.errors import CheckpointError, UnsupportedFormatError
from desktop.engine.files.numbers import NumberRefused, describe, finite_float

SUPPORTED_TYPES = ("nanochat", "llama")
ROPE_KINDS = ("default", "linear", "llama3")
# Upper bounds well above any released model (Llama 3.1 405B: hidden 16384, 126 layers, vocab
# 128256): a config beyond them is broken or hostile, and would make us allocate absurd sizes.
LIMITS = {
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 19,
    "num_hidden_layers": 1 << 10,
    "num_attention_heads": 1 << 10,
    "num_key_value_heads": 1 << 10,
    "head_dim": 1 << 12,
    "vocab_size": 1 << 23,
    "max_position_embeddings": 1 << 24,
}
FAMILY = {"nanochat": "hf-nanochat", "llama": "hf-llama"}
# The port's own defaults (NanoChatConfig) and Llama's (LlamaConfig), for keys a config leaves out.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "nanochat": {
        "vocab_size": 50304,
        "hidden_size": 768,
        "intermediate_size": 8192,
        "num_hidden_layers": 12,
        "num_attention_heads": 6,
        "max_position_embeddings": 2048,
        "hidden_act": "relu2",
        "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 15.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "final_logit_softcapping": None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    },
}
_ACTIVATION = {"nanochat": "relu2", "llama": "silu"}


@dataclass(frozen=True)
class Rope:
    """Rotary embedding as transformers computes it for the kinds implemented here."""

    kind: str  # "default" | "linear" | "llama3"
    theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 0


@dataclass(frozen=True)
class HFConfig:
    model_type: str  # "nanochat" | "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: Rope
    softcap: float | None
    tie_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    # What the KV cache and the generation loop read of a model config (engine.kvcache, generation).
    has_smear: bool = False
    engram_layers: tuple[int, ...] = ()
    engram_dim: int = 0

    @property
    def family(self) -> str:
        return FAMILY[self.model_type]

    @property
    def n_embd(self) -> int:
        return self.hidden_size

    @property
    def rope_len(self) -> int:
        """The longest context: transformers' ``max_position_embeddings``."""
        return self.max_position_embeddings

    @property
    def sequence_len(self) -> int:
        return self.max_position_embeddings

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the checkpoint must hold, and its shape (transformers' key names)."""
        C, hd = self.hidden_size, self.head_dim
        q_rows, kv_rows, ff = self.n_head * hd, self.n_kv_head * hd, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, C)}
        if not self.tie_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, C)
        llama = self.model_type == "llama"
        if llama:
            shapes["model.norm.weight"] = (C,)
        for i in range(self.n_layer):
            p = f"model.layers.{i}"
            attn = {
                "q_proj": (q_rows, C),
                "k_proj": (kv_rows, C),
                "v_proj": (kv_rows, C),
                "o_proj": (C, q_rows),
            }
            for name, shape in attn.items():
                shapes[f"{p}.self_attn.{name}.weight"] = shape
                if self.attention_bias:
                    shapes[f"{p}.self_attn.{name}.bias"] = (shape[0],)
            if llama:
                mlp = {"gate_proj": (ff, C), "up_proj": (ff, C), "down_proj": (C, ff)}
                shapes[f"{p}.input_layernorm.weight"] = (C,)
                shapes[f"{p}.post_attention_layernorm.weight"] = (C,)
            else:
                mlp = {"fc1": (ff, C), "fc2": (C, ff)}
            for name, shape in mlp.items():
                shapes[f"{p}.mlp.{name}.weight"] = shape
                if self.mlp_bias:
                    shapes[f"{p}.mlp.{name}.bias"] = (shape[0],)
        return shapes

    def n_params(self) -> int:
        total = 0
        for shape in self.expected_shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def kv_bytes_per_token(self, element_size: int = 4) -> int:
        return 2 * self.n_layer * self.n_kv_head * self.head_dim * element_size


def parse_config(data: dict[str, Any], path: Path) -> HFConfig:
    """Read ``config.json`` (already parsed) into an :class:`HFConfig`, or raise one line."""
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise UnsupportedFormatError(
            f"{path}: model_type {model_type!r} is not supported "
            f"(Nanoscope runs Hugging Face models of type {' and '.join(SUPPORTED_TYPES)})"
        )
    if data.get("quantization_config"):
        kind = data["quantization_config"]
        method = kind.get("quant_method", "?") if isinstance(kind, dict) else "?"
        raise UnsupportedFormatError(f"{path}: quantized weights ({method}) are not supported")
    values = {**_DEFAULTS[model_type], **{k: v for k, v in data.items() if v is not None}}
    ints = {name: _int(values, name, path) for name in LIMITS if name in values}
    n_head = ints["num_attention_heads"]
    n_kv = _int(values, "num_key_value_heads", path) if "num_key_value_heads" in values else n_head
    head_dim = _int(values, "head_dim", path) if "head_dim" in values else ints["hidden_size"] // n_head
    if "head_dim" not in values and ints["hidden_size"] % n_head:
        raise CheckpointError(
            f"{path}: hidden_size {ints['hidden_size']} is not a multiple of {n_head} heads"
        )
    if n_head % n_kv:
        raise CheckpointError(f"{path}: {n_head} attention heads do not split into {n_kv} key/value heads")
    if head_dim % 2:
        raise CheckpointError(f"{path}: head_dim {head_dim} is odd; rotary embeddings need an even one")
    act = values.get("hidden_act")
    if act != _ACTIVATION[model_type]:
        raise UnsupportedFormatError(f"{path}: hidden_act {act!r} is not supported for {model_type} models")
    eps = _float(values, "rms_norm_eps", path)
    softcap = values.get("final_logit_softcapping") if model_type == "nanochat" else None
    if softcap is not None:
        softcap = _float(values, "final_logit_softcapping", path)
        if softcap <= 0:
            raise CheckpointError(f"{path}: final_logit_softcapping must be positive, got {softcap}")
    return HFConfig(
        model_type=model_type,
        vocab_size=ints["vocab_size"],
        hidden_size=ints["hidden_size"],
        intermediate_size=ints["intermediate_size"],
        n_layer=ints["num_hidden_layers"],
        n_head=n_head,
        n_kv_head=n_kv,
        head_dim=head_dim,
        max_position_embeddings=ints["max_position_embeddings"],
        rms_norm_eps=eps,
        rope=parse_rope(values, ints["max_position_embeddings"], path),
        softcap=softcap,
        tie_embeddings=_bool(values, "tie_word_embeddings", path),
        attention_bias=_bool(values, "attention_bias", path),
        mlp_bias=model_type == "llama" and _bool(values, "mlp_bias", path),
    )


def parse_rope(values: dict[str, Any], max_positions: int, path: Path) -> Rope:
    """``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (older configs)."""
    params = values.get("rope_parameters") or values.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{path}: rope_parameters is not an object")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise UnsupportedFormatError(f"{path}: per-layer rope_parameters are not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_KINDS:
        raise UnsupportedFormatError(
            f"{path}: rope scaling {kind!r} is not supported (supported: {', '.join(ROPE_KINDS)})"
        )
    partial = params.get("partial_rotary_factor", values.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedFormatError(f"{path}: partial_rotary_factor {partial} is not supported")
    theta = _float(
        {"rope_theta": params.get("rope_theta", values.get("rope_theta", 10000.0))},
        "rope_theta",
        path,
        positive=True,
    )
    if kind == "default":
        return Rope("default", theta)
    factor = _float(params, "factor", path)
    if factor <= 0:
        raise CheckpointError(f"{path}: rope scaling factor must be positive, got {factor}")
    if kind == "linear":
        return Rope("linear", theta, factor=factor)
    low, high = _float(params, "low_freq_factor", path), _float(params, "high_freq_factor", path)
    original = params.get("original_max_position_embeddings", max_positions)
    if (
        not isinstance(original, int)
        or isinstance(original, bool)
        or original <= 0
        or low <= 0
        or high <= low
    ):
        raise CheckpointError(f"{path}: llama3 rope scaling has inconsistent parameters {params}")
    return Rope("llama3", theta, factor, low, high, original)


def _int(values: dict[str, Any], name: str, path: Path) -> int:
    value = values.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"{path}: {name} must be a positive integer, got {value!r}")
    limit = LIMITS.get(name)
    if limit is not None and value > limit:
        raise CheckpointError(f"{path}: {name} = {value:,} is beyond any real model (limit {limit:,})")
    return value


def _float(values: dict[str, Any], name: str, path: Path, *, positive: bool = False) -> float:
    """A finite model constant (a NaN or infinite one makes every logit NaN)."""
    value = values.get(name)
    try:
        number = finite_float(value)  # a 400-digit int is a number, but not a finite float
    except NumberRefused:
        number = math.nan  # refused below, as a negative number is
    if not (number > 0 if positive else number >= 0):
        kind = "positive" if positive else "non-negative"
        raise CheckpointError(f"{path}: {name} must be a finite {kind} number, got {describe(value)}")
    return number


def _bool(values: dict[str, Any], name: str, path: Path) -> bool:
    value = values.get(name, False)
    if not isinstance(value, bool):
        raise CheckpointError(f"{path}: {name} must be true or false, got {value!r}")
    return value


def token_ids(value: Any) -> list[int]:
    """``eos_token_id`` as configs write it: an int, a list of ints, or nothing."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []
