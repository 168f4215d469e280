"""Tell which nanochat era or fork variant a checkpoint is, and verify its keys and shapes.

Works on the meta json and the state_dict's key -> shape map only, so it can run before any
weights are read (docs/ARCHITECTURE.md, Eras; Loading). Every mismatch raises with the offending
keys listed; nothing is silently patched. Meta fields are typed by ``config.META_FIELDS``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from desktop.engine.errors import CheckpointError, UnsupportedFormatError
from desktop.engine.nanochat.config import (
    MAX_NGRAM_ORDERS,
    META_FIELDS,
    ModelConfig,
    e6_short_window,
    e7_short_window,
    has_value_embedding,
    padded_vocab,
    parse_meta_field,
)

Shape = tuple[int, ...]

AMBIGUOUS_E3_E5 = "E3 and E5 checkpoints cannot be told apart"
FORK_META_PREFIXES = ("engram_", "mhc_", "mtp_", "dsa_", "mamba")
FORK_META_KEYS = {
    "rope_theta",
    "window_long",
    "window_short",
    "activation",
    "aux_loss_weight",
    "gradient_checkpointing",
}
FORK_KEY_MARKERS = (".engram.", ".mhc.", ".attn.indexer.", ".attn.A_log", "mlp.c_gate")

REQUIRED = tuple(f.name for f in META_FIELDS if f.required)


def read_model_config(meta: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate the meta's ``model_config`` block (every field Nanoscope reads, by
    :data:`~.config.META_FIELDS`) and return it typed, n_kv_head filled in. Fields it does not read
    are kept as they are; absent optional fields stay absent."""
    cfg = meta.get("model_config") if isinstance(meta, Mapping) else None
    if not isinstance(cfg, Mapping):
        raise CheckpointError(f"{where}: meta has no model_config object")
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        raise CheckpointError(f"{where}: model_config is missing {', '.join(missing)}")
    if "num_experts" in cfg:
        raise UnsupportedFormatError(f"{where}: nanochat MoE-branch checkpoints are not supported")
    out = dict(cfg)
    try:
        for field in META_FIELDS:
            if field.name in cfg:
                out[field.name] = parse_meta_field(field, cfg[field.name], where)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    out["n_kv_head"] = out.get("n_kv_head") or out["n_head"]
    if out["n_embd"] % out["n_head"]:
        raise CheckpointError(f"{where}: n_embd={out['n_embd']} is not divisible by n_head={out['n_head']}")
    if out["n_head"] % out["n_kv_head"]:
        raise CheckpointError(
            f"{where}: n_head={out['n_head']} is not divisible by n_kv_head={out['n_kv_head']}"
        )
    wp = out.get("window_pattern", "L")
    if not wp or any(c not in "SLsl" for c in wp):
        raise CheckpointError(f"{where}: invalid window_pattern {wp!r} (use only S and L)")
    layers = out.get("engram_layers") or ()
    if any(not -out["n_layer"] <= i < out["n_layer"] for i in layers):
        raise CheckpointError(
            f"{where}: model_config.engram_layers {list(layers)} names layers outside 0..{out['n_layer'] - 1}"
        )
    return out


def is_fork(model_config: Mapping[str, Any], keys: Mapping[str, Shape]) -> bool:
    if any(k.startswith(FORK_META_PREFIXES) or k in FORK_META_KEYS for k in model_config):
        return True
    return any(m in k for k in keys for m in FORK_KEY_MARKERS) or any(k.startswith("mtp.") for k in keys)


def _layer_indices(keys: Mapping[str, Shape], pattern: str) -> set[int]:
    rx = re.compile(pattern)
    return {int(m.group(1)) for k in keys if (m := rx.fullmatch(k))}


def classify(
    meta: Mapping[str, Any], keys: Mapping[str, Shape], where: str, softcap_override: float | None = None
) -> ModelConfig:
    """Return the era-specific configuration for a nanochat-family checkpoint."""
    mc = read_model_config(meta, where)
    common: dict[str, Any] = {
        k: mc[k] for k in ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
    }
    V = mc["vocab_size"]
    common["window_pattern"] = mc.get("window_pattern", "L").upper()
    common["embed_rows"] = _embed_rows(keys, V, where)
    warnings: list[str] = []

    if "v0_lambdas" in keys or "value_embed.weight" in keys or "value_embed_A.weight" in keys:
        raise UnsupportedFormatError(
            f"{where}: nanochat 've' branch experiment checkpoints are not supported"
        )
    if any(k.startswith("transformer.h.0.moe.") for k in keys):
        raise UnsupportedFormatError(f"{where}: nanochat MoE-branch checkpoints are not supported")

    if is_fork(mc, keys):
        cfg = _fork_config({**mc, "user_config": meta.get("user_config")}, keys, common, where, warnings)
    else:
        cfg = _upstream_config(mc, keys, common, where, warnings)
    if softcap_override is not None:
        if isinstance(softcap_override, bool) or not (
            isinstance(softcap_override, (int, float))
            and math.isfinite(softcap_override)
            and 0 < softcap_override <= 1e6
        ):
            raise CheckpointError(f"the softcap override must be a positive number, got {softcap_override!r}")
        cfg["softcap"] = float(softcap_override)
        if cfg["era"] in ("E3", "E5"):
            warnings[:] = [w for w in warnings if not w.startswith(AMBIGUOUS_E3_E5)]  # the user decided
            if softcap_override == 20:
                cfg["era"] = "E5"
                cfg["rope_bf16"] = False
    model = ModelConfig(**cfg, warnings=tuple(warnings))
    verify_shapes(model, keys, where)
    return model


def _embed_rows(keys: Mapping[str, Shape], V: int, where: str) -> int:
    wte = keys.get("transformer.wte.weight")
    head = keys.get("lm_head.weight")
    if wte is None or head is None:
        missing = [k for k in ("transformer.wte.weight", "lm_head.weight") if k not in keys]
        raise CheckpointError(f"{where}: missing {', '.join(missing)} (is this a nanochat checkpoint?)")
    rows = wte[0]
    if rows not in (V, padded_vocab(V)):
        raise CheckpointError(
            f"{where}: transformer.wte.weight has {rows} rows but the meta's vocab_size={V} needs "
            f"{padded_vocab(V)} (padded){'' if padded_vocab(V) == V else f' or {V}'}"
        )
    if head[0] != rows:
        raise CheckpointError(
            f"{where}: lm_head.weight has {head[0]} rows but transformer.wte.weight has {rows}"
        )
    return rows


def _upstream_config(
    mc: dict[str, Any], keys: Mapping[str, Shape], common: dict[str, Any], where: str, warnings: list[str]
) -> dict[str, Any]:
    L, seq = mc["n_layer"], mc["sequence_len"]
    cfg = dict(common, softcap=15.0, rope_base=10000.0, rope_bf16=True, qk_scale=1.0, short_window=seq // 2)
    gate = keys.get(f"transformer.h.{L - 1}.attn.ve_gate.weight")
    if "smear_gate.weight" in keys:
        era = "E7"
    elif "bigram_embed.embed.weight" in keys:
        era = "E4"
    elif gate is not None and gate[-1] == 12:
        era = "E6"
    elif gate is not None:
        era = "E3"
        if gate[-1] != 32:
            raise CheckpointError(f"{where}: ve_gate width {gate[-1]} is neither 12 (E6+) nor 32 (E3)")
        warnings.append(
            f"{AMBIGUOUS_E3_E5}; using softcap 15 "
            "(pass --softcap 20 for checkpoints trained 2026-03-03..03-09)"
        )
    elif "resid_lambdas" in keys:
        era = "E1" if "window_pattern" not in mc else "E2"
    else:
        era = "E0"
    cfg["era"] = era
    cfg["has_lambdas"] = era != "E0"
    if era in ("E0", "E1"):
        # Trained before sliding windows existed: plain causal attention at any length (up to the
        # rotary table), not master's patched "L" = sequence_len window.
        cfg["long_window"] = 10 * seq
    if era in ("E3", "E4", "E6", "E7"):
        cfg["ve_layers"] = tuple(i for i in range(L) if has_value_embedding(i, L))
        cfg["ve_gate_channels"] = 12 if era in ("E6", "E7") else 32
        cfg["ve_gate_scale"] = 3.0 if era in ("E6", "E7") else 2.0
    if era == "E4":
        cfg["has_bigram"] = True
        warnings.append(
            "E4 bigram: decoding hashes (previous, current) token as in training, "
            "not nanochat's Engine, which uses the reserved index at single-token steps"
        )
    if era in ("E6", "E7"):
        cfg.update(rope_base=100000.0, rope_bf16=False)
        cfg["qk_scale"] = 1.15 if era == "E6" else 1.2
        cfg["short_window"] = e6_short_window(seq) if era == "E6" else e7_short_window(seq)
    if era == "E7":
        cfg["has_smear"] = True
    return cfg


def _fork_config(
    mc: dict[str, Any], keys: Mapping[str, Shape], common: dict[str, Any], where: str, warnings: list[str]
) -> dict[str, Any]:
    L, C = mc["n_layer"], mc["n_embd"]
    if mc.get("mamba_enabled") or any(".attn.A_log" in k or ".attn.in_proj." in k for k in keys):
        raise UnsupportedFormatError(f"{where}: fork checkpoints with Mamba layers are not supported")
    long_w = mc.get("window_long") or mc["sequence_len"]
    cfg = dict(
        common,
        era="fork",
        softcap=15.0,
        rope_base=mc.get("rope_theta") or 10000.0,
        rope_bf16=True,
        qk_scale=1.0,
        has_lambdas=True,
        long_window=long_w,
        short_window=mc.get("window_short") or long_w // 2,
    )
    user_cfg = mc.get("user_config") or {}  # the meta's top-level user_config, passed in by classify()
    xla_flash = user_cfg.get("xla_flash_attn") if isinstance(user_cfg, Mapping) else None
    if isinstance(xla_flash, (bool, int)) and xla_flash:
        cfg["window_pattern"] = "L"
        warnings.append("trained with XLA flash attention, which ignores windows: every layer runs as L")
    swiglu = "transformer.h.0.mlp.c_gate.weight" in keys or mc.get("activation") == "swiglu"
    if swiglu:
        cfg["swiglu"] = True
        cfg["mlp_hidden"] = (
            keys.get("transformer.h.0.mlp.c_fc.weight", (0,))[0] or ((8 * C // 3) + 7) // 8 * 8
        )
    engram = sorted(_layer_indices(keys, r"transformer\.h\.(\d+)\.engram\.in_proj\.weight"))
    if engram:
        # Dedupe keeping the first occurrence: order_mix.{j} belongs to the j-th listed order.
        orders = list(dict.fromkeys(o for o in mc.get("engram_ngram_orders", (2, 3, 4)) if o > 0))
        if not orders or len(orders) > MAX_NGRAM_ORDERS:
            raise CheckpointError(
                f"{where}: model_config.engram_ngram_orders must give 1 to {MAX_NGRAM_ORDERS} positive orders"
            )
        declared = {(i + L if i < 0 else i) for i in mc.get("engram_layers") or ()}
        if declared and declared != set(engram):
            raise CheckpointError(
                f"{where}: engram weights exist for layers {engram} but the meta's "
                f"engram_layers gives {sorted(declared)}"
            )
        dim = keys[f"transformer.h.{engram[0]}.engram.in_proj.weight"][0]
        if "engram_bottleneck_dim" in mc:  # 0 means the fork's default, n_embd // 4
            declared = mc["engram_bottleneck_dim"] or C // 4
            if declared != dim:
                raise CheckpointError(
                    f"{where}: engram weights have bottleneck {dim} but the meta's "
                    f"engram_bottleneck_dim gives {declared}"
                )
        cfg.update(engram_layers=tuple(engram), engram_orders=tuple(orders), engram_dim=dim)
    if any(".mhc." in k for k in keys):
        cfg.update(
            mhc=True,
            mhc_sinkhorn_iters=mc.get("mhc_sinkhorn_iters", 5),
            mhc_temperature=mc.get("mhc_temperature", 1.0),
            mhc_epsilon=mc.get("mhc_epsilon", 1e-6),
            mhc_blend_alpha=mc.get("mhc_blend_alpha", 1.0),
        )
        warnings.append("mHC pools over the current chunk at decode, as the fork's Engine does")
    dsa = sorted(_layer_indices(keys, r"transformer\.h\.(\d+)\.attn\.indexer\.q_proj\.weight"))
    if dsa:
        cfg["dsa_layers"] = tuple(dsa)
        warnings.append("DSA layers run dense attention at inference (the indexer is not used)")
    cfg["has_mtp"] = any(k.startswith("mtp.") for k in keys)
    return cfg


def expected_shapes(cfg: ModelConfig) -> dict[str, Shape]:
    C, L, rows = cfg.n_embd, cfg.n_layer, cfg.embed_rows
    kvd = cfg.n_kv_head * cfg.head_dim
    hid = cfg.hidden_dim
    shapes: dict[str, Shape] = {"transformer.wte.weight": (rows, C), "lm_head.weight": (rows, C)}
    for i in range(L):
        p = f"transformer.h.{i}."
        shapes[p + "attn.c_q.weight"] = (cfg.n_head * cfg.head_dim, C)
        shapes[p + "attn.c_k.weight"] = (kvd, C)
        shapes[p + "attn.c_v.weight"] = (kvd, C)
        shapes[p + "attn.c_proj.weight"] = (C, cfg.n_head * cfg.head_dim)
        shapes[p + "mlp.c_fc.weight"] = (hid, C)
        shapes[p + "mlp.c_proj.weight"] = (C, hid)
        if cfg.swiglu:
            shapes[p + "mlp.c_gate.weight"] = (hid, C)
        if i in cfg.ve_layers:
            shapes[f"value_embeds.{i}.weight"] = (rows, kvd)
            shapes[p + "attn.ve_gate.weight"] = (cfg.n_kv_head, cfg.ve_gate_channels)
        if i in cfg.engram_layers:
            cb = cfg.engram_dim
            shapes[p + "engram.in_proj.weight"] = (cb, C)
            for j in range(len(cfg.engram_orders)):
                shapes[p + f"engram.order_mix.{j}.weight"] = (cb, cb)
            shapes[p + "engram.out_proj.weight"] = (C, cb)
        if cfg.mhc:
            h = max(8, min(256, C // 4))
            shapes[p + "mhc.score_proj.weight"] = (h, C)
            shapes[p + "mhc.score_out.weight"] = (1, h)
    if cfg.has_lambdas:
        shapes["resid_lambdas"] = (L,)
        shapes["x0_lambdas"] = (L,)
    if cfg.has_bigram:
        shapes["bigram_embed.embed.weight"] = (5 * cfg.vocab_size, C)
        shapes["bigram_lambdas"] = (L,)
    if cfg.has_smear:
        shapes["smear_gate.weight"] = (1, 24)
        shapes["smear_lambda"] = (1,)
        shapes["backout_lambda"] = (1,)
    return shapes


def is_ignorable(key: str, cfg: ModelConfig) -> bool:
    """Keys the model leaves out: the fork's MTP head (read only to draft, mtp.py) and the DSA indexer."""
    return (cfg.has_mtp and key.startswith("mtp.")) or (bool(cfg.dsa_layers) and ".attn.indexer." in key)


def _fmt(shape: Shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def verify_shapes(cfg: ModelConfig, keys: Mapping[str, Shape], where: str) -> None:
    expected = expected_shapes(cfg)
    if cfg.ve_layers:
        present = _layer_indices(keys, r"value_embeds\.(\d+)\.weight")
        if present != set(cfg.ve_layers):
            raise CheckpointError(
                f"{where}: value_embeds exist for layers {sorted(present)}, but nanochat puts "
                f"them on layers {list(cfg.ve_layers)} for n_layer={cfg.n_layer}"
            )
    missing = [k for k in expected if k not in keys]
    unexpected = [k for k in keys if k not in expected and not is_ignorable(k, cfg)]
    wrong = [
        f"{k} {_fmt(tuple(keys[k]))} (expected {_fmt(s)})"
        for k, s in expected.items()
        if k in keys and tuple(keys[k]) != s
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {_short_list(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_short_list(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes: {_short_list(wrong)}")
    if problems:
        raise CheckpointError(
            f"{where}: does not match a {cfg.era} model with this meta — " + "; ".join(problems)
        )


def _short_list(items: list[str], limit: int = 6) -> str:
    head = ", ".join(items[:limit])
    return head + (f" and {len(items) - limit} more" if len(items) > limit else "")
