"""Tiny random checkpoints in the native nanochat / fork on-disk layout, for loader tests.

Everything here follows /work/shared/specs/checkpoint-formats.md (the "spec"):

* Directory layout and file names: spec §1.1 (``<base>/<phase>_checkpoints/<tag>/model_<step:06d>.pt``
  holding what ``torch.save(model.state_dict())`` writes, plus ``meta_<step:06d>.json``). Every file
  is saved from a real ``nn.Module``'s ``state_dict()`` (:func:`module_state_dict`): an
  ``OrderedDict`` whose ``_metadata`` names every submodule, the pickle shape of a training
  script's file (tests/engine/nanochat/test_factory_shape.py compares it with the golden files).
* Meta fields per training script: spec §1.1 (base_train, mid_train, chat_sft, chat_rl) and §2.2 (fork
  base_train writes every extra except ``activation``; sft_train writes every GPTConfig field).
* Keys and shapes per upstream era: spec §1.3 and the era table in §1.4 (E0 ... E7), branch-only variants
  at the end of §1.4 (ve branch, moe branch).
* Fork keys and meta extras: spec §2.1 (Engram, mHC, MTP, DSA, SwiGLU).
* Dtypes of real checkpoints (``dtype_mix``): spec §1.5 ("cuda_mixed": wte and value embeddings in bf16,
  the rest fp32) and §2.1 (fork on CUDA: everything bf16, "bf16_all").

Unlike nanochat's own init (which zeroes every output projection), all weights are random and sized so the
next-token distribution is clearly peaked: greedy decoding is then decided by real logit gaps, not float
noise. The era is an explicit argument everywhere; the file contents never say which era they are, exactly
as with real checkpoints.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

ERAS = (
    "E0",
    "E0pad",
    "E1",
    "E2",
    "E3",
    "E4",
    "E5",
    "E6",
    "E7",
    "fork",
    "fork_engram",
    "fork_mhc",
    "fork_engram_mhc",
    "fork_mtp_dsa",
    "fork_swiglu",
)
FORK_ERAS = tuple(era for era in ERAS if era.startswith("fork"))
# Branch-only experiments that a loader must reject with a clear error (spec §1.4, last part; §5.2).
UNSUPPORTED_VARIANTS = ("ve_branch", "ve_branch_single", "ve_branch_factored", "moe")

UPSTREAM_PHASES = ("base", "mid", "chatsft", "chatrl")
FORK_PHASES = (*UPSTREAM_PHASES, "sft", "gspo", "rl")
DTYPE_MIXES = ("fp32", "cuda_mixed", "bf16_all")
TOKENIZER_KINDS = ("auto", "pkl", "json", "both")

COMPILED_PREFIX = "_orig_mod."
_SIX_FIELDS = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
SMEAR_GATE_CHANNELS = 24  # E7 smear gate width (spec §1.4)


class _Remove:
    """Sentinel type for ``meta_overrides``: a key mapped to ``REMOVE`` is deleted from the meta."""

    def __repr__(self) -> str:
        return "REMOVE"


REMOVE = _Remove()


@dataclass(frozen=True)
class TinyConfig:
    """Model sizes plus the fork's hyper-parameters (upstream eras ignore the fork fields).

    ``n_embd`` must be at least 32 because the E3 value-embedding gate reads the first 32 channels.
    """

    sequence_len: int = 64
    vocab_size: int = 300  # deliberately not a multiple of 64, so padded eras really pad (Vp = 320)
    n_layer: int = 2
    n_head: int = 2
    n_kv_head: int = 2
    n_embd: int = 64
    window_pattern: str = "SL"
    # fork extras (spec §2.1); the era decides which features are switched on
    rope_theta: float = 10000.0
    window_long: int = 0
    window_short: int = 0
    engram_layers: str = "0"
    engram_ngram_orders: str = "2,3,4"
    engram_bottleneck_dim: int = 0
    engram_dropout: float = 0.0
    mhc_num_branches: int = 0
    mhc_sinkhorn_iters: int = 5
    mhc_temperature: float = 1.0
    mhc_epsilon: float = 1e-6
    mhc_blend_alpha: float = 1.0
    mtp_lambda: float = 0.3
    dsa_start_layer: int = 1
    dsa_top_k_ratio: float = 0.5
    dsa_local_window: int = 128
    dsa_indexer_heads: int = 4
    dsa_indexer_dim: int = 8
    # nanochat "moe" branch meta fields (only the "moe" variant writes them)
    num_experts: int = 4
    top_k: int = 2
    num_shared_experts: int = 1

    def __post_init__(self) -> None:
        if self.n_embd < 32:
            raise ValueError(f"n_embd={self.n_embd}: must be >= 32 (the E3 VE gate reads 32 channels)")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"n_embd={self.n_embd} must split into an even head_dim over {self.n_head} heads"
            )
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")
        if not self.window_pattern or set(self.window_pattern.upper()) - {"S", "L"}:
            raise ValueError(f"window_pattern={self.window_pattern!r}: use only S and L")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab(self) -> int:
        return math.ceil(self.vocab_size / 64) * 64


@dataclass(frozen=True)
class _Layout:
    """What one era/variant stores, and which script versions wrote its metas."""

    padded_vocab: bool = True
    lambdas: bool = True
    ve_gate_width: int = 0  # 0: no value embeddings
    bigram: bool = False
    smear_backout: bool = False
    window_pattern_in_meta: bool = True
    legacy_chat_sft: bool = False  # chat_sft before 2026-01-31 wrote config.__dict__ + val_loss + metrics
    mid_train_exists: bool = True  # scripts/mid_train.py was deleted on 2026-01-31
    initial_base_meta: bool = False  # base_train's first meta had only six fields
    single_optim_file: bool = False  # optim_<step>.pt before 2025-11-13, then one shard per rank
    ve_branch: str = ""  # "", "all_layers", "single", "factored"
    moe: bool = False
    fork: bool = False
    engram: bool = False
    mhc: bool = False
    mtp: bool = False
    dsa: bool = False
    swiglu: bool = False


_OLD = {"legacy_chat_sft": True}  # eras whose chat_sft predates the 2026-01-31 rewrite
_NEW = {"mid_train_exists": False}  # eras after mid_train.py was deleted (2026-01-31)
_LAYOUTS: dict[str, _Layout] = {
    "E0": _Layout(
        padded_vocab=False,
        lambdas=False,
        window_pattern_in_meta=False,
        initial_base_meta=True,
        single_optim_file=True,
        **_OLD,
    ),
    "E0pad": _Layout(lambdas=False, window_pattern_in_meta=False, **_OLD),
    "E1": _Layout(window_pattern_in_meta=False, **_OLD),
    "E2": _Layout(**_OLD),
    "E3": _Layout(ve_gate_width=32, **_OLD),
    "E4": _Layout(ve_gate_width=32, bigram=True, **_OLD),
    "E5": _Layout(ve_gate_width=32, **_NEW),
    "E6": _Layout(ve_gate_width=12, **_NEW),
    "E7": _Layout(ve_gate_width=12, smear_backout=True, **_NEW),
    "fork": _Layout(fork=True),
    "fork_engram": _Layout(fork=True, engram=True),
    "fork_mhc": _Layout(fork=True, mhc=True),
    "fork_engram_mhc": _Layout(fork=True, engram=True, mhc=True),
    "fork_mtp_dsa": _Layout(fork=True, mtp=True, dsa=True),
    "fork_swiglu": _Layout(fork=True, swiglu=True),
    "ve_branch": _Layout(ve_branch="all_layers", **_OLD),
    "ve_branch_single": _Layout(ve_branch="single", **_OLD),
    "ve_branch_factored": _Layout(ve_branch="factored", **_OLD),
    "moe": _Layout(ve_gate_width=32, moe=True, **_NEW),
}

# Per-era default sizes: GQA (n_kv_head=1) in some eras, several window patterns, negative engram layer
# indices, duplicate/non-positive engram orders, non-default rope_theta and explicit fork windows.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "E0": {"n_layer": 2, "n_kv_head": 2},
    "E0pad": {"n_layer": 2, "n_kv_head": 1},
    "E1": {"n_layer": 2, "n_kv_head": 1},
    "E2": {"n_layer": 3, "n_kv_head": 1, "window_pattern": "SL"},
    "E3": {"n_layer": 4, "n_kv_head": 1, "window_pattern": "SSSL"},
    "E4": {"n_layer": 3, "n_kv_head": 2, "window_pattern": "SL"},
    "E5": {"n_layer": 4, "n_kv_head": 2, "window_pattern": "SSSL"},
    "E6": {"n_layer": 3, "n_kv_head": 1, "window_pattern": "SSSL"},
    "E7": {"n_layer": 4, "n_kv_head": 1, "window_pattern": "SSSL"},
    "fork": {"n_layer": 3, "n_kv_head": 1, "window_pattern": "SL"},
    "fork_engram": {"n_layer": 3, "n_kv_head": 2, "engram_layers": "0,-1", "rope_theta": 50000.0},
    "fork_mhc": {"n_layer": 2, "n_kv_head": 1, "mhc_num_branches": 2},
    "fork_engram_mhc": {
        "n_layer": 3,
        "n_kv_head": 1,
        "engram_layers": "1",
        "engram_ngram_orders": "3,2,3,0",
        "engram_bottleneck_dim": 8,
        "mhc_num_branches": 3,
    },
    "fork_mtp_dsa": {
        "n_layer": 3,
        "n_kv_head": 1,
        "dsa_start_layer": 1,
        "rope_theta": 500000.0,
        "window_long": 48,
        "window_short": 12,
    },
    "fork_swiglu": {"n_layer": 2, "n_kv_head": 2, "window_short": 16},
    "ve_branch": {"n_layer": 4, "n_kv_head": 1},
    "ve_branch_single": {"n_layer": 4, "n_kv_head": 1},
    "ve_branch_factored": {"n_layer": 4, "n_kv_head": 1},
    "moe": {"n_layer": 2, "n_kv_head": 2, "window_pattern": "SSSL"},
}


def _layout(era: str) -> _Layout:
    try:
        return _LAYOUTS[era]
    except KeyError:
        raise ValueError(f"unknown era {era!r}; expected one of {ERAS + UNSUPPORTED_VARIANTS}") from None


def default_config(era: str, **overrides: Any) -> TinyConfig:
    """The tiny config used for ``era`` when none is given, with optional field overrides."""
    _layout(era)
    return replace(TinyConfig(**_DEFAULTS[era]), **overrides)


def has_value_embedding(layer: int, n_layer: int) -> bool:
    """Upstream E3+ rule (spec §1.4): VE on layers with the same parity as the last layer."""
    return layer % 2 == (n_layer - 1) % 2


def engram_layer_set(cfg: TinyConfig) -> set[int]:
    """Fork rule (spec §2.1): csv of layer indices, negative ones counted from the end."""
    layers = set()
    for raw in cfg.engram_layers.split(","):
        if raw.strip():
            index = int(raw)
            layers.add(index + cfg.n_layer if index < 0 else index)
    return layers


def engram_orders(cfg: TinyConfig) -> tuple[int, ...]:
    """Fork rule (spec §2.1): csv orders, first occurrence kept, non-positive dropped, default 2,3,4."""
    orders: list[int] = []
    for raw in cfg.engram_ngram_orders.split(","):
        if raw.strip() and int(raw) > 0 and int(raw) not in orders:
            orders.append(int(raw))
    return tuple(orders) or (2, 3, 4)


def engram_bottleneck(cfg: TinyConfig) -> int:
    return cfg.engram_bottleneck_dim or max(1, cfg.n_embd // 4)


def mhc_hidden(cfg: TinyConfig) -> int:
    return max(8, min(256, cfg.n_embd // 4))


def swiglu_hidden(cfg: TinyConfig) -> int:
    """Spec §2.1: Hf = ceil8(int(8C/3))."""
    return math.ceil(int(8 * cfg.n_embd / 3) / 8) * 8


# ---------------------------------------------------------------------------------------------------
# state dict


class _Weights:
    """Seeded random tensors, scaled so every branch moves the output by O(1)."""

    def __init__(self, seed: int) -> None:
        self._gen = torch.Generator().manual_seed(seed)

    def matrix(self, rows: int, cols: int, gain: float = 1.0) -> torch.Tensor:
        """A Linear weight ``[out, in]`` with std ``gain/sqrt(in)``."""
        return torch.randn(rows, cols, generator=self._gen) * (gain / math.sqrt(cols))

    def normal(self, *shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=self._gen) * std

    def uniform(self, n: int, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=self._gen)


def _add_mlp(sd: dict[str, torch.Tensor], prefix: str, cfg: TinyConfig, swiglu: bool, w: _Weights) -> None:
    C = cfg.n_embd
    if swiglu:
        hidden = swiglu_hidden(cfg)
        sd[prefix + "c_gate.weight"] = w.matrix(hidden, C)
        sd[prefix + "c_fc.weight"] = w.matrix(hidden, C)
    else:
        hidden = 4 * C
        sd[prefix + "c_fc.weight"] = w.matrix(hidden, C)
    sd[prefix + "c_proj.weight"] = w.matrix(C, hidden, gain=0.5)


def _add_attention(sd: dict[str, torch.Tensor], prefix: str, cfg: TinyConfig, w: _Weights) -> None:
    C, kvd = cfg.n_embd, cfg.n_kv_head * cfg.head_dim
    sd[prefix + "c_q.weight"] = w.matrix(cfg.n_head * cfg.head_dim, C)
    sd[prefix + "c_k.weight"] = w.matrix(kvd, C)
    sd[prefix + "c_v.weight"] = w.matrix(kvd, C)
    sd[prefix + "c_proj.weight"] = w.matrix(C, C, gain=0.7)


def make_state_dict(era: str, cfg: TinyConfig | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random fp32 state dict with exactly the keys and shapes ``era`` stores (spec §1.3, §1.4, §2.1).

    The same ``(era, cfg, seed)`` always gives the same tensors.
    """
    lay = _layout(era)
    cfg = cfg or default_config(era)
    w = _Weights(seed)
    C, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    rows = cfg.padded_vocab if lay.padded_vocab else V
    kvd = cfg.n_kv_head * cfg.head_dim
    sd: dict[str, torch.Tensor] = {}

    # Parameters registered directly on GPT come first in a real state_dict.
    if lay.lambdas:
        sd["resid_lambdas"] = w.uniform(L, 0.5, 1.5)
        sd["x0_lambdas"] = w.uniform(L, 0.0, 0.5)
    if lay.bigram:
        sd["bigram_lambdas"] = w.uniform(L, 0.1, 0.5)
    if lay.smear_backout:
        sd["smear_lambda"] = w.uniform(1, 0.1, 0.5)
        sd["backout_lambda"] = w.uniform(1, 0.1, 0.5)
    if lay.ve_branch:
        sd["v0_lambdas"] = w.uniform(L, 0.1, 0.5)

    sd["transformer.wte.weight"] = w.normal(rows, C, std=1.0)
    engram_layers = engram_layer_set(cfg) if lay.engram else set()
    for i in range(L):
        prefix = f"transformer.h.{i}."
        _add_attention(sd, prefix + "attn.", cfg, w)
        if lay.ve_gate_width and has_value_embedding(i, L):
            sd[prefix + "attn.ve_gate.weight"] = w.matrix(cfg.n_kv_head, lay.ve_gate_width)
        if lay.dsa and i >= cfg.dsa_start_layer:
            heads, dim = cfg.dsa_indexer_heads, cfg.dsa_indexer_dim
            sd[prefix + "attn.indexer.q_proj.weight"] = w.matrix(heads * dim, C)
            sd[prefix + "attn.indexer.k_proj.weight"] = w.matrix(dim, C)
            sd[prefix + "attn.indexer.w_proj.weight"] = w.matrix(heads, C, gain=0.1)
        if lay.moe:
            sd[prefix + "moe.router.weight"] = w.matrix(cfg.num_experts, C)
            for j in range(cfg.num_experts):
                _add_mlp(sd, f"{prefix}moe.experts.{j}.", cfg, False, w)
            for j in range(cfg.num_shared_experts):
                _add_mlp(sd, f"{prefix}moe.shared_experts.{j}.", cfg, False, w)
        else:
            _add_mlp(sd, prefix + "mlp.", cfg, lay.swiglu, w)
        if i in engram_layers:
            cb = engram_bottleneck(cfg)
            sd[prefix + "engram.in_proj.weight"] = w.matrix(cb, C)
            for j in range(len(engram_orders(cfg))):
                sd[f"{prefix}engram.order_mix.{j}.weight"] = w.matrix(cb, cb)
            sd[prefix + "engram.out_proj.weight"] = w.matrix(C, cb)
        if lay.mhc:
            hid = mhc_hidden(cfg)
            sd[prefix + "mhc.score_proj.weight"] = w.matrix(hid, C)
            sd[prefix + "mhc.score_out.weight"] = w.matrix(1, hid, gain=2.0)

    # std 4/sqrt(C) on a unit-RMS input gives logits with std ~4: a clearly peaked distribution.
    sd["lm_head.weight"] = w.matrix(rows, C, gain=4.0)

    if lay.smear_backout:  # registered before the value embeddings (E7's GPT.__init__)
        sd["smear_gate.weight"] = w.matrix(1, SMEAR_GATE_CHANNELS, gain=2.0)
    if lay.bigram:
        sd["bigram_embed.embed.weight"] = w.normal(5 * V, C, std=0.5)  # unpadded V (spec §1.4 E4)
    if lay.ve_gate_width:
        for i in range(L):
            if has_value_embedding(i, L):
                sd[f"value_embeds.{i}.weight"] = w.normal(rows, kvd, std=1.0)
    if lay.ve_branch == "all_layers":
        for i in range(L):
            sd[f"value_embeds.{i}.weight"] = w.normal(rows, kvd, std=1.0)
    elif lay.ve_branch == "single":
        sd["value_embed.weight"] = w.normal(rows, kvd, std=1.0)
    elif lay.ve_branch == "factored":
        sd["value_embed_A.weight"] = w.normal(rows, 32, std=1.0)
        sd["value_embed_B.weight"] = w.matrix(kvd, 32)
    if lay.mtp:
        sd["mtp.proj.weight"] = w.matrix(C, 2 * C)
        _add_attention(sd, "mtp.block.attn.", cfg, w)
        _add_mlp(sd, "mtp.block.mlp.", cfg, lay.swiglu, w)
    return sd


# ---------------------------------------------------------------------------------------------------
# meta


def _fork_model_config(era: str, cfg: TinyConfig, *, with_activation: bool) -> dict[str, Any]:
    """Every fork GPTConfig field (spec §2.1); base_train leaves out ``activation`` (spec §2.2)."""
    lay = _layout(era)
    config: dict[str, Any] = {
        "sequence_len": cfg.sequence_len,
        "vocab_size": cfg.vocab_size,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_kv_head": cfg.n_kv_head,
        "n_embd": cfg.n_embd,
        "window_pattern": cfg.window_pattern,
        "engram_enabled": lay.engram,
        "engram_layers": cfg.engram_layers if lay.engram else "",
        "engram_ngram_orders": cfg.engram_ngram_orders,
        "engram_bottleneck_dim": cfg.engram_bottleneck_dim,
        "engram_dropout": cfg.engram_dropout,
        "mhc_enabled": lay.mhc,
        "mhc_num_branches": cfg.mhc_num_branches,
        "mhc_sinkhorn_iters": cfg.mhc_sinkhorn_iters,
        "mhc_temperature": cfg.mhc_temperature,
        "mhc_epsilon": cfg.mhc_epsilon,
        "mhc_blend_alpha": cfg.mhc_blend_alpha,
        "mtp_enabled": lay.mtp,
        "mtp_lambda": cfg.mtp_lambda,
        "dsa_enabled": lay.dsa,
        "dsa_start_layer": cfg.dsa_start_layer,
        "dsa_top_k_ratio": cfg.dsa_top_k_ratio,
        "dsa_local_window": cfg.dsa_local_window,
        "dsa_indexer_heads": cfg.dsa_indexer_heads,
        "gradient_checkpointing": False,
        "dsa_indexer_dim": cfg.dsa_indexer_dim,
        "aux_loss_weight": 0.0,
        "mamba_enabled": False,
        "mamba_pattern": "",
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_headdim": 128,
        "mamba_ngroups": 1,
        "mamba_chunk_size": 256,
        "mamba3_qknorm": False,
        "mamba3_bias": False,
        "mamba3_complex_rope": False,
        "mamba3_trapezoidal": False,
        "mamba_xla_scan": False,
        "window_long": cfg.window_long,
        "window_short": cfg.window_short,
        "rope_theta": cfg.rope_theta,
    }
    if with_activation:
        config["activation"] = "swiglu" if lay.swiglu else "relu2"
    return config


def _upstream_model_config(era: str, cfg: TinyConfig) -> dict[str, Any]:
    lay = _layout(era)
    config: dict[str, Any] = {name: getattr(cfg, name) for name in _SIX_FIELDS}
    if lay.window_pattern_in_meta:
        config["window_pattern"] = cfg.window_pattern
    if lay.moe:
        config.update(num_experts=cfg.num_experts, top_k=cfg.top_k, num_shared_experts=cfg.num_shared_experts)
    return config


def _user_config(era: str, cfg: TinyConfig, step: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "run": "dummy",
        "depth": cfg.n_layer,
        "max_seq_len": cfg.sequence_len,
        "device_batch_size": 4,
        "total_batch_size": 4 * cfg.sequence_len,
        "num_iterations": step,
    }
    if _layout(era).fork:
        config["xla_flash_attn"] = False  # spec §2.2: TPU Pallas runs ignored the windows
    return config


def _base_train_meta(era: str, cfg: TinyConfig, step: int, model_config: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "step": step,
        "val_bpb": 1.25,
        "model_config": model_config,
        "user_config": _user_config(era, cfg, step),
        "device_batch_size": 4,
        "max_seq_len": cfg.sequence_len,
    }
    if not _layout(era).initial_base_meta:
        meta["dataloader_state_dict"] = {"pq_idx": 0, "rg_idx": step}
        meta["loop_state"] = {"min_val_bpb": 1.2, "smooth_train_loss": 3.5, "total_training_time": 12.5}
    return meta


def make_meta(
    era: str, cfg: TinyConfig | None = None, *, phase: str = "base", step: int = 10
) -> dict[str, Any]:
    """The meta JSON that ``phase``'s script of ``era`` writes (spec §1.1 and §2.2).

    The fork (diverged 2026-01-15) kept upstream's mid_train, chat_sft and chat_rl of that date, so those
    phases write upstream's forms of then; its own base_train and sft_train write the fork fields.
    """
    lay = _layout(era)
    cfg = cfg or default_config(era)
    allowed = FORK_PHASES if lay.fork else UPSTREAM_PHASES
    if phase not in allowed:
        raise ValueError(f"phase {phase!r} does not exist for {era}; expected one of {allowed}")
    if phase == "mid" and not lay.mid_train_exists:
        raise ValueError(f"{era} is after 2026-01-31, when scripts/mid_train.py was deleted")

    if lay.fork:
        model_config = _fork_model_config(era, cfg, with_activation=phase != "base")
    else:
        model_config = _upstream_model_config(era, cfg)
    if phase == "mid":
        # mid_train listed the six fields by hand: never window_pattern, never fork extras (spec §1.1).
        six = {k: model_config[k] for k in _SIX_FIELDS}
        return {
            "step": step,
            "val_bpb": 1.2,
            "model_config": six,
            "user_config": _user_config(era, cfg, step),
        }
    if phase == "base":
        return _base_train_meta(era, cfg, step, model_config)
    if phase == "chatrl":
        return {"model_config": model_config}  # no step at all (spec §1.1)
    if phase == "chatsft" and (lay.legacy_chat_sft or lay.fork):
        return {
            "step": step,
            "val_loss": 2.5,
            "mmlu_acc": 0.25,
            "arc_easy_acc": 0.3,
            "model_config": model_config,
        }
    if phase == "chatsft":
        return {
            "step": step,
            "val_bpb": 1.1,
            "model_config": model_config,
            "user_config": _user_config(era, cfg, step),
        }
    # The fork's sft_train / gspo / rl write vars(GPTConfig) (spec §2.2); their other fields are not
    # documented, so only the step travels with it.
    return {"step": step, "model_config": model_config}


def _apply_overrides(meta: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """Top-level keys are replaced, except dict values under dict keys, which merge one level deep."""
    merged = dict(meta)
    for key, value in (overrides or {}).items():
        if value is REMOVE:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            inner = dict(merged[key])
            for inner_key, inner_value in value.items():
                if inner_value is REMOVE:
                    inner.pop(inner_key, None)
                else:
                    inner[inner_key] = inner_value
            merged[key] = inner
        else:
            merged[key] = value
    return merged


# ---------------------------------------------------------------------------------------------------
# writing


def module_state_dict(
    tensors: dict[str, torch.Tensor], empty: tuple[str, ...] = ()
) -> dict[str, torch.Tensor]:
    """``tensors`` as a model's ``state_dict()`` returns them: a tree of ``nn.Module`` s with each
    tensor a parameter at its dotted path, in the given order, and that tree's own ``state_dict()``
    (an ``OrderedDict`` carrying ``_metadata``, each module's version, which ``torch.save`` pickles
    with a BUILD). A ``torch.compile`` d model's prefix ``_orig_mod.`` becomes its wrapper module.
    ``empty``: paths of modules without parameters (a Dropout), each its parent's last child."""
    root = torch.nn.Module()
    for key, value in tensors.items():
        *path, leaf = key.split(".")
        module = root
        for name in path:
            child = module._modules.get(name)
            if child is None:
                child = torch.nn.Module()
                module.add_module(name, child)
            module = child
        module.register_parameter(leaf, torch.nn.Parameter(value, requires_grad=False))
    for path in empty:
        parent, _, name = path.rpartition(".")
        root.get_submodule(parent).add_module(name, torch.nn.Module())
    return root.state_dict()


def empty_modules(era: str, cfg: TinyConfig, prefix: str = "") -> tuple[str, ...]:
    """The modules of ``era`` 's GPT that hold no parameter: the fork's Engram dropout."""
    layers = sorted(engram_layer_set(cfg)) if _layout(era).engram else []
    return tuple(f"{prefix}transformer.h.{i}.engram.dropout" for i in layers)


def apply_dtype_mix(sd: dict[str, torch.Tensor], dtype_mix: str) -> dict[str, torch.Tensor]:
    """Cast like a real save (spec §1.5): "cuda_mixed" = embeddings bf16, "bf16_all" = fork on CUDA."""
    if dtype_mix == "fp32":
        return dict(sd)
    if dtype_mix == "bf16_all":
        return {k: v.to(torch.bfloat16) for k, v in sd.items()}
    if dtype_mix == "cuda_mixed":
        return {k: v.to(torch.bfloat16) if _is_embedding_key(k) else v for k, v in sd.items()}
    raise ValueError(f"dtype_mix={dtype_mix!r}; expected one of {DTYPE_MIXES}")


def _is_embedding_key(key: str) -> bool:
    return key == "transformer.wte.weight" or key.startswith("value_embeds.")


def _tokenizer_factory() -> Any:
    """Import the sibling tokenizer fixture module lazily (it is written separately)."""
    if __package__:
        from . import tokenizer_factory
    else:
        from support import tokenizer_factory
    return tokenizer_factory


def write_tokenizer(base_dir: Path, kind: str, vocab_size: int) -> list[Path]:
    """Write ``<base>/tokenizer/tokenizer.pkl`` (+ ``token_bytes.pt``) for "pkl", ``tokenizer.json`` for
    "json", or all of them for "both"; returns the tokenizer files written."""
    if kind not in ("pkl", "json", "both"):
        raise ValueError(f"tokenizer kind {kind!r}; expected 'pkl', 'json' or 'both'")
    factory = _tokenizer_factory()
    directory = Path(base_dir) / "tokenizer"
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if kind in ("pkl", "both"):
        # nanochat's tokenizer dir also holds token_bytes.pt (spec §1.1, §1.8)
        written.append(
            Path(factory.write_tiktoken_pkl(directory, vocab_size=vocab_size, with_token_bytes=True))
        )
    if kind in ("json", "both"):
        written.append(Path(factory.write_cpp_tokenizer_json(directory, vocab_size=vocab_size)))
    return written


def _write_optimizer(ckpt_dir: Path, era: str, step: int) -> None:
    lay = _layout(era)
    state = {"state": {}, "param_groups": [{"lr": 0.02, "params": []}]}
    if lay.single_optim_file:
        torch.save(state, ckpt_dir / f"optim_{step:06d}.pt")
    else:
        # The fork saves a list of optimizer state dicts (AdamW + Muon), upstream a dict per rank.
        torch.save([state, state] if lay.fork else state, ckpt_dir / f"optim_{step:06d}_rank0.pt")


def write_checkpoint(
    base_dir: Path,
    era: str,
    *,
    phase: str = "base",
    tag: str | None = None,
    step: int = 10,
    cfg: TinyConfig | None = None,
    seed: int = 0,
    dtype_mix: str = "fp32",
    compiled_prefix: bool = False,
    meta_overrides: dict[str, Any] | None = None,
    tokenizer: str | None = "auto",
    with_optim: bool = False,
) -> Path:
    """Write one checkpoint under ``<base_dir>/<phase>_checkpoints/<tag>/`` and return that directory.

    ``tag`` defaults to ``d<n_layer>`` like nanochat. ``tokenizer="auto"`` writes ``tokenizer.json`` for fork
    eras and ``tokenizer.pkl`` otherwise, into ``<base_dir>/tokenizer/``; ``None`` writes none.
    ``meta_overrides`` is merged into the meta (see ``_apply_overrides``; ``REMOVE`` deletes a key).
    ``with_optim`` also writes a small optimizer file, which a loader must ignore.
    """
    cfg = cfg or default_config(era)
    sd = apply_dtype_mix(make_state_dict(era, cfg, seed), dtype_mix)
    if compiled_prefix:
        sd = {COMPILED_PREFIX + key: value for key, value in sd.items()}
    meta = _apply_overrides(make_meta(era, cfg, phase=phase, step=step), meta_overrides)

    ckpt_dir = Path(base_dir) / f"{phase}_checkpoints" / (tag or f"d{cfg.n_layer}")
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    prefix = COMPILED_PREFIX if compiled_prefix else ""
    torch.save(module_state_dict(sd, empty_modules(era, cfg, prefix)), ckpt_dir / f"model_{step:06d}.pt")
    (ckpt_dir / f"meta_{step:06d}.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    if with_optim:
        _write_optimizer(ckpt_dir, era, step)
    if tokenizer is not None:
        if tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"tokenizer={tokenizer!r}; expected one of {TOKENIZER_KINDS} or None")
        kind = ("json" if _layout(era).fork else "pkl") if tokenizer == "auto" else tokenizer
        write_tokenizer(Path(base_dir), kind, cfg.vocab_size)
    return ckpt_dir


# ---------------------------------------------------------------------------------------------------
# reading back, and hostile variants for error tests

_MODEL_FILE = re.compile(r"model_(\d+)\.pt")


def model_file(ckpt_dir: Path, step: int | None = None) -> Path:
    """``model_<step>.pt`` in ``ckpt_dir`` (the highest step when ``step`` is None)."""
    if step is not None:
        return Path(ckpt_dir) / f"model_{step:06d}.pt"
    steps = [int(m.group(1)) for p in Path(ckpt_dir).iterdir() if (m := _MODEL_FILE.fullmatch(p.name))]
    if not steps:
        raise FileNotFoundError(f"no model_*.pt in {ckpt_dir}")
    return Path(ckpt_dir) / f"model_{max(steps):06d}.pt"


def read_checkpoint(
    ckpt_dir: Path, step: int | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load ``(state_dict, meta)`` back exactly as stored (``weights_only=True``, dtypes and prefix kept)."""
    path = model_file(ckpt_dir, step)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    meta_path = path.with_name(path.name.replace("model_", "meta_").replace(".pt", ".json"))
    return sd, json.loads(meta_path.read_text(encoding="utf-8"))


def _rewrite(ckpt_dir: Path, edit: Any) -> Path:
    path = model_file(ckpt_dir)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    edit(sd)
    torch.save(sd, path)
    return path


def _require_key(sd: dict[str, torch.Tensor], key: str) -> None:
    if key not in sd:
        raise KeyError(f"{key!r} is not in the state dict; keys: {sorted(sd)}")


def truncate_file(path: Path, frac: float = 0.5) -> Path:
    """Cut ``path`` to ``frac`` of its size (an interrupted copy or download)."""
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * frac)])
    return Path(path)


def drop_key(ckpt_dir: Path, key: str) -> Path:
    """Remove ``key`` from the stored state dict; returns the model file."""

    def edit(sd: dict[str, torch.Tensor]) -> None:
        _require_key(sd, key)
        del sd[key]

    return _rewrite(ckpt_dir, edit)


def add_key(ckpt_dir: Path, key: str, tensor: torch.Tensor | None = None) -> Path:
    """Add an unexpected ``key`` (default: a small fp32 tensor); returns the model file."""

    def edit(sd: dict[str, torch.Tensor]) -> None:
        sd[key] = torch.zeros(3) if tensor is None else tensor

    return _rewrite(ckpt_dir, edit)


def set_nan(ckpt_dir: Path, key: str, value: float = float("nan")) -> Path:
    """Set the first element of ``key`` to ``value`` (NaN by default, or ``inf``); returns the model file."""

    def edit(sd: dict[str, torch.Tensor]) -> None:
        _require_key(sd, key)
        tensor = sd[key].clone()
        tensor.view(-1)[0] = value
        sd[key] = tensor

    return _rewrite(ckpt_dir, edit)


def write_with_wrong_vocab(base_dir: Path, era: str = "E7", *, vocab_delta: int = 64, **kwargs: Any) -> Path:
    """A checkpoint whose meta ``vocab_size`` is ``vocab_delta`` more than the tensors and tokenizer hold.

    The default delta of 64 also changes the padded vocab, so the embedding row count cannot match either.
    """
    cfg = kwargs.pop("cfg", None) or default_config(era)
    overrides = _apply_overrides(
        kwargs.pop("meta_overrides", None) or {},
        {"model_config": {"vocab_size": cfg.vocab_size + vocab_delta}},
    )
    return write_checkpoint(base_dir, era, cfg=cfg, meta_overrides=overrides, **kwargs)


def write_huge_meta(
    base_dir: Path, era: str = "E7", *, field_name: str = "n_embd", value: int = 10**9, **kwargs: Any
) -> Path:
    """A checkpoint whose meta claims an absurd size (``n_embd=10**9``); a loader must not allocate it."""
    overrides = _apply_overrides(
        kwargs.pop("meta_overrides", None) or {}, {"model_config": {field_name: value}}
    )
    return write_checkpoint(base_dir, era, meta_overrides=overrides, **kwargs)


class _TouchOnUnpickle:
    """Unpickling this calls ``pathlib.Path.touch(marker)``: proof that code ran during ``torch.load``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def write_pickled_code_model(path: Path, marker_file: Path, era: str = "E7") -> Path:
    """Write a real-looking ``model_<step>.pt`` (+ its meta) whose pickle creates ``marker_file`` on load.

    ``torch.load(..., weights_only=True)`` refuses it; a plain unpickle would run the payload.
    """
    path = Path(path)
    match = _MODEL_FILE.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{path.name!r} is not named model_<step>.pt")
    cfg = default_config(era)
    payload = module_state_dict(make_state_dict(era, cfg))
    payload["transformer.wte.weight_meta"] = _TouchOnUnpickle(str(marker_file))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    meta = make_meta(era, cfg, step=int(match.group(1)))
    path.with_name(f"meta_{match.group(1)}.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return path
