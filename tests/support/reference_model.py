"""A slow, plain reference forward pass for every nanochat era and the fork, written from the spec.

It is the independent check for the real loader/model: it shares no code with ``desktop/engine`` or with
``checkpoint_factory``, works on the raw state dict plus the meta's ``model_config``, always recomputes the
whole sequence (no KV cache), and computes attention explicitly (``softmax(QK^T/sqrt(hd) + mask) V``, GQA by
``repeat_interleave``), not with ``scaled_dot_product_attention``. Everything runs in float32 on the CPU;
bf16 tensors from a checkpoint are upcast, as nanochat's ``checkpoint_manager`` does on CPU.

Spec sections (/work/shared/specs/checkpoint-formats.md) each piece follows:

* §1.3 invariants: ``norm = F.rms_norm(x, (C,))`` with eps=None; pre-norm blocks; normed embedding; final
  norm; RoPE *then* QK-norm; rotate-half with nanochat's sign (``y1 = x1 cos + x2 sin``,
  ``y2 = -x1 sin + x2 cos``); cos/sin rounded to bf16 then used in fp32 math; logits sliced to V, then
  ``softcap * tanh(logits / softcap)`` in fp32; relu² MLP.
* §1.4 era table: E1 lambdas, E2 windows, E3 value embeddings, E4 bigram hash, E5 softcap 20, E6 gate/qk
  scale/rope base/short window, E7 smear + backout.
* §1.6 windows: FA3 ``(left, 0)`` semantics (a query at p sees keys p-left..p); "L" = ``sequence_len``;
  the last layer is always L. E0/E1 predate windows and use plain full causal attention, which is what they
  were trained with (a loader that patches them to ``"L"`` differs only past ``sequence_len`` tokens).
* §2.1 fork: E2 math with ``rope_theta`` and ``window_long``/``window_short``; Engram branch; mHC mixer;
  SwiGLU (``c_proj(silu(c_gate x) * c_fc x)``, chosen when ``mlp.c_gate`` keys exist or the meta says
  ``activation="swiglu"``); DSA layers run dense (the indexer is unused at inference); MTP keys are unused.

mHC pools over the *whole* sequence (its training-time behaviour), so fork eras with mHC are not causal
here: earlier positions see later tokens through the pooled branch scores. In practice the Sinkhorn weights
are ~1/N whatever the scores (spec §2.1), so the effect is tiny.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

_COMPILED_PREFIX = "_orig_mod."


@dataclass(frozen=True)
class EraMath:
    """The per-era switches of the forward pass (spec §1.4 and §5.2)."""

    softcap: float
    rope_base: float | None  # None: the meta's rope_theta (fork)
    qk_scale: float
    short_window: str  # "none" (no windows), "half", "third128", "quarter128", "fork"
    lambdas: bool
    ve_gate_channels: int = 0  # 0: no value embeddings
    ve_gate_scale: float = 0.0
    bigram: bool = False
    smear_backout: bool = False
    fork: bool = False


_E0 = EraMath(softcap=15.0, rope_base=10000.0, qk_scale=1.0, short_window="none", lambdas=False)
_E2 = EraMath(softcap=15.0, rope_base=10000.0, qk_scale=1.0, short_window="half", lambdas=True)
_E3 = EraMath(15.0, 10000.0, 1.0, "half", True, ve_gate_channels=32, ve_gate_scale=2.0)
_E6 = EraMath(15.0, 100000.0, 1.15, "third128", True, ve_gate_channels=12, ve_gate_scale=3.0)
_FORK = EraMath(softcap=15.0, rope_base=None, qk_scale=1.0, short_window="fork", lambdas=True, fork=True)

ERA_MATH: dict[str, EraMath] = {
    "E0": _E0,
    "E0pad": _E0,
    "E1": EraMath(softcap=15.0, rope_base=10000.0, qk_scale=1.0, short_window="none", lambdas=True),
    "E2": _E2,
    "E3": _E3,
    "E4": EraMath(15.0, 10000.0, 1.0, "half", True, ve_gate_channels=32, ve_gate_scale=2.0, bigram=True),
    "E5": EraMath(20.0, 10000.0, 1.0, "half", True, ve_gate_channels=32, ve_gate_scale=2.0),
    "E6": _E6,
    "E7": EraMath(15.0, 100000.0, 1.2, "quarter128", True, 12, 3.0, smear_backout=True),
    "fork": _FORK,
    "fork_engram": _FORK,
    "fork_mhc": _FORK,
    "fork_engram_mhc": _FORK,
    "fork_mtp_dsa": _FORK,
    "fork_swiglu": _FORK,
}

SMEAR_CHANNELS = 24


def era_math(era: str) -> EraMath:
    try:
        return ERA_MATH[era]
    except KeyError:
        raise ValueError(f"the reference model does not implement era {era!r}") from None


def norm(x: torch.Tensor) -> torch.Tensor:
    """nanochat's functional RMSNorm: no weight, eps=None (finfo(dtype).eps)."""
    return F.rms_norm(x, (x.size(-1),))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def layer_windows(era: str, meta_cfg: dict[str, Any]) -> list[int | None]:
    """Left window per layer (``None`` = unlimited causal), spec §1.4, §1.6 and §2.1."""
    math_ = era_math(era)
    n_layer, seq = int(meta_cfg["n_layer"]), int(meta_cfg["sequence_len"])
    if math_.short_window == "none":
        return [None] * n_layer
    long_window = seq
    if math_.short_window == "half":
        short_window = seq // 2
    elif math_.short_window == "third128":
        short_window = _ceil_div(_ceil_div(seq, 3), 128) * 128
    elif math_.short_window == "quarter128":
        short_window = _ceil_div(_ceil_div(seq, 4), 128) * 128
    else:  # fork: dedicated fields, 0 meaning "derive"
        long_window = int(meta_cfg.get("window_long") or 0) or seq
        short_window = int(meta_cfg.get("window_short") or 0) or long_window // 2
    # Missing window_pattern is what checkpoint_manager patches to "L" (spec §1.2 step 4).
    pattern = str(meta_cfg.get("window_pattern") or "L").upper()
    windows: list[int | None] = [
        short_window if pattern[i % len(pattern)] == "S" else long_window for i in range(n_layer)
    ]
    windows[-1] = long_window
    return windows


def rope_tables(
    n_pos: int, head_dim: int, base: float, bf16: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[n_pos, head_dim/2]`` in fp32 math. Up to E4 (and in the fork) nanochat rounds them to
    bf16; from 2026-03-04 (E5 onwards) they are cast to COMPUTE_DTYPE, which is fp32 on CPU (spec §1.3)."""
    channel_range = torch.arange(0, head_dim, 2, dtype=torch.float32)
    inv_freq = 1.0 / (base ** (channel_range / head_dim))
    t = torch.arange(n_pos, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    if not bf16:
        return freqs.cos(), freqs.sin()
    return freqs.cos().bfloat16().float(), freqs.sin().bfloat16().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half with nanochat's sign on ``x [T, heads, hd]``."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


def bigram_hash(ids: Sequence[int], vocab_size: int) -> list[int]:
    """E4 hash (spec §1.4): h[0] = 5V-1; h[t] = ((36313*cur) ^ (27191*prev)) % (5V-1)."""
    modulus = 5 * vocab_size - 1
    hashes = [modulus]
    for t in range(1, len(ids)):
        hashes.append(((36313 * ids[t]) ^ (27191 * ids[t - 1])) % modulus)
    return hashes


def causal_ngram_average(z: torch.Tensor, order: int) -> torch.Tensor:
    """Engram local average over ``z [T, Cb]``: mean of the last ``order`` rows, zero-padded, divisor n."""
    out = torch.zeros_like(z)
    for t in range(z.size(0)):
        out[t] = z[max(0, t - order + 1) : t + 1].sum(dim=0) / order
    return out


def parse_engram_orders(spec: str) -> list[int]:
    """First occurrence kept, non-positive dropped, (2, 3, 4) when nothing is left (fork engram.py)."""
    orders: list[int] = []
    for part in str(spec).split(","):
        part = part.strip()
        if part and int(part) > 0 and int(part) not in orders:
            orders.append(int(part))
    return orders or [2, 3, 4]


def parse_engram_layers(spec: str, n_layer: int) -> set[int]:
    layers = set()
    for part in str(spec).split(","):
        if part.strip():
            index = int(part)
            layers.add(index + n_layer if index < 0 else index)
    return layers


def mhc_weights(
    branches: list[torch.Tensor],
    score_proj: torch.Tensor,
    score_out: torch.Tensor,
    *,
    temperature: float,
    epsilon: float,
    sinkhorn_iters: int,
) -> torch.Tensor:
    """mHC mixing weights ``[N]`` for branches ``[T, C]`` each (spec §2.1, fork mhc.py)."""
    pooled = torch.stack(branches, dim=0).mean(dim=1)  # [N, C]: mean over *all* time steps
    scores = (torch.tanh(pooled @ score_proj.T) @ score_out.T).squeeze(-1)  # [N]
    raw = (scores[:, None] + scores[None, :]) / max(temperature, epsilon)
    transport = torch.exp(raw - raw.max()).clamp_min(epsilon)
    for _ in range(max(0, sinkhorn_iters)):
        transport = transport / (transport.sum(dim=1, keepdim=True) + epsilon)  # rows
        transport = transport / (transport.sum(dim=0, keepdim=True) + epsilon)  # columns
    transport = transport / (transport.sum(dim=1, keepdim=True) + epsilon)
    weights = transport.mean(dim=0)
    weights = weights / (weights.sum() + epsilon)
    if not torch.isfinite(weights).all():
        weights = torch.full_like(weights, 1.0 / len(branches))
    return weights


@dataclass
class _Model:
    """The state dict (fp32, prefix stripped) and the numbers the forward needs."""

    w: dict[str, torch.Tensor]
    cfg: dict[str, Any]
    math: EraMath
    vocab: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int

    def linear(self, x: torch.Tensor, key: str) -> torch.Tensor:
        return x @ self.w[key].T


def _prepare(sd: dict[str, torch.Tensor], meta_cfg: dict[str, Any], era: str) -> _Model:
    weights = {key.removeprefix(_COMPILED_PREFIX): value.detach().float() for key, value in sd.items()}
    if meta_cfg.get("mamba_enabled"):
        raise ValueError("the reference model does not implement the fork's Mamba layers")
    n_embd, n_head = int(meta_cfg["n_embd"]), int(meta_cfg["n_head"])
    return _Model(
        w=weights,
        cfg=meta_cfg,
        math=era_math(era),
        vocab=int(meta_cfg["vocab_size"]),
        n_layer=int(meta_cfg["n_layer"]),
        n_head=n_head,
        n_kv_head=int(meta_cfg["n_kv_head"]),
        head_dim=n_embd // n_head,
    )


def _attention(
    m: _Model,
    layer: int,
    xn: torch.Tensor,
    idx: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    window: int | None,
) -> torch.Tensor:
    """One attention layer on the normed input ``xn [T, C]``."""
    T, hd = xn.size(0), m.head_dim
    prefix = f"transformer.h.{layer}.attn."
    q = m.linear(xn, prefix + "c_q.weight").view(T, m.n_head, hd)
    k = m.linear(xn, prefix + "c_k.weight").view(T, m.n_kv_head, hd)
    v = m.linear(xn, prefix + "c_v.weight").view(T, m.n_kv_head, hd)

    ve_key = f"value_embeds.{layer}.weight"
    if m.math.ve_gate_channels and layer % 2 == (m.n_layer - 1) % 2:
        ve = m.w[ve_key][idx].view(T, m.n_kv_head, hd)
        gate_in = xn[:, : m.math.ve_gate_channels]
        gate = m.math.ve_gate_scale * torch.sigmoid(m.linear(gate_in, prefix + "ve_gate.weight"))  # [T, Hkv]
        v = v + gate[:, :, None] * ve

    cos, sin = rope
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q, k = norm(q), norm(k)
    q, k = q * m.math.qk_scale, k * m.math.qk_scale

    group = m.n_head // m.n_kv_head
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    pos = torch.arange(T)
    distance = pos[:, None] - pos[None, :]  # query minus key position
    allowed = distance >= 0
    if window is not None:
        allowed &= distance <= window

    heads = []
    for h in range(m.n_head):
        scores = (q[:, h] @ k[:, h].T) / math.sqrt(hd)
        scores = scores.masked_fill(~allowed, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v[:, h])
    y = torch.cat(heads, dim=-1)  # [T, H*hd], head-major like .view(B, T, -1)
    return m.linear(y, prefix + "c_proj.weight")


def _mlp(m: _Model, layer: int, xn: torch.Tensor) -> torch.Tensor:
    prefix = f"transformer.h.{layer}.mlp."
    if prefix + "c_gate.weight" in m.w or m.cfg.get("activation") == "swiglu":
        hidden = F.silu(m.linear(xn, prefix + "c_gate.weight")) * m.linear(xn, prefix + "c_fc.weight")
    else:
        hidden = torch.relu(m.linear(xn, prefix + "c_fc.weight")).square()
    return m.linear(hidden, prefix + "c_proj.weight")


def _engram(m: _Model, layer: int, x_in: torch.Tensor) -> torch.Tensor:
    prefix = f"transformer.h.{layer}.engram."
    z = m.linear(norm(x_in), prefix + "in_proj.weight")
    orders = parse_engram_orders(m.cfg.get("engram_ngram_orders", "2,3,4"))
    mixed = torch.zeros_like(z)
    for j, order in enumerate(orders):
        mixed = mixed + m.linear(causal_ngram_average(z, order), f"{prefix}order_mix.{j}.weight")
    return m.linear(mixed / len(orders), prefix + "out_proj.weight")


def _mhc(m: _Model, layer: int, branches: list[torch.Tensor]) -> torch.Tensor:
    max_branches = int(m.cfg.get("mhc_num_branches", 0))
    if max_branches > 0 and len(branches) > max_branches:
        raise ValueError(f"layer {layer}: {len(branches)} mHC branches > mhc_num_branches={max_branches}")
    prefix = f"transformer.h.{layer}.mhc."
    weights = mhc_weights(
        branches,
        m.w[prefix + "score_proj.weight"],
        m.w[prefix + "score_out.weight"],
        temperature=float(m.cfg.get("mhc_temperature", 1.0)),
        epsilon=float(m.cfg.get("mhc_epsilon", 1e-6)),
        sinkhorn_iters=int(m.cfg.get("mhc_sinkhorn_iters", 5)),
    )
    mixed = sum(weight * branch for weight, branch in zip(weights, branches, strict=True))
    alpha = min(max(float(m.cfg.get("mhc_blend_alpha", 1.0)), 0.0), 1.0)
    return mixed if alpha == 1.0 else branches[0] + alpha * (mixed - branches[0])


def _block(
    m: _Model,
    layer: int,
    x: torch.Tensor,
    idx: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    window: int | None,
    engram_layers: set[int],
) -> torch.Tensor:
    x_attn = x + _attention(m, layer, norm(x), idx, rope, window)
    out = x_attn + _mlp(m, layer, norm(x_attn))
    if not m.math.fork:
        return out
    engram_out = out + _engram(m, layer, x) if layer in engram_layers else None
    if not m.cfg.get("mhc_enabled"):
        return engram_out if engram_out is not None else out
    branches = [out, x] if engram_out is None else [out, x, engram_out]
    return _mhc(m, layer, branches)


def _smear(m: _Model, e: torch.Tensor) -> torch.Tensor:
    """E7: e'[t] = e[t] + smear_lambda * sigmoid(smear_gate(e[t, :24])) * e[t-1] for t >= 1."""
    gate = torch.sigmoid(m.linear(e[1:, :SMEAR_CHANNELS], "smear_gate.weight"))  # [T-1, 1]
    smeared = e[1:] + m.w["smear_lambda"] * gate * e[:-1]
    return torch.cat([e[:1], smeared], dim=0)


def reference_logits(
    sd: dict[str, torch.Tensor],
    meta_cfg: dict[str, Any],
    era: str,
    ids: Sequence[int],
    softcap: float | None = None,
) -> torch.Tensor:
    """Full-forward logits ``[T, V]`` (float32) for token ``ids`` under ``era``'s math.

    ``meta_cfg`` is the meta's ``model_config`` (sizes, ``window_pattern``, fork extras). ``softcap``
    overrides the era default (15; 20 for E5). Raises ValueError for empty input, ids outside ``[0, V)``,
    or more than ``10*sequence_len`` tokens (nanochat's RoPE table size).
    """
    m = _prepare(sd, meta_cfg, era)
    x = reference_hidden(sd, meta_cfg, era, ids)
    logits = m.linear(x, "lm_head.weight")[:, : m.vocab].float()
    cap = m.math.softcap if softcap is None else float(softcap)
    return cap * torch.tanh(logits / cap)


def reference_hidden(
    sd: dict[str, torch.Tensor], meta_cfg: dict[str, Any], era: str, ids: Sequence[int]
) -> torch.Tensor:
    """The trunk's output after its final norm ``[T, C]``: what the head (and the fork's MTP head)
    reads. Raises as :func:`reference_logits` does."""
    m = _prepare(sd, meta_cfg, era)
    T = len(ids)
    max_positions = 10 * int(meta_cfg["sequence_len"])
    if not 0 < T <= max_positions:
        raise ValueError(f"{T} tokens: need between 1 and {max_positions} (10*sequence_len)")
    if any(not 0 <= i < m.vocab for i in ids):
        raise ValueError(f"token ids must lie in [0, {m.vocab})")
    idx = torch.tensor(list(ids), dtype=torch.long)

    base = float(meta_cfg.get("rope_theta", 10000.0)) if m.math.rope_base is None else m.math.rope_base
    rope = rope_tables(T, m.head_dim, base, bf16=era not in ("E5", "E6", "E7"))
    windows = layer_windows(era, meta_cfg)
    engram_layers = (
        parse_engram_layers(meta_cfg.get("engram_layers", ""), m.n_layer)
        if m.math.fork and meta_cfg.get("engram_enabled")
        else set()
    )

    x = norm(m.w["transformer.wte.weight"][idx])
    if m.math.smear_backout:
        x = _smear(m, x)
    x0 = x
    bigram = m.w["bigram_embed.embed.weight"][bigram_hash(list(ids), m.vocab)] if m.math.bigram else None
    backout_source = None
    for i in range(m.n_layer):
        if m.math.lambdas:
            x = m.w["resid_lambdas"][i] * x + m.w["x0_lambdas"][i] * x0
            if bigram is not None:
                x = x + m.w["bigram_lambdas"][i] * bigram
        x = _block(m, i, x, idx, rope, windows[i], engram_layers)
        if m.math.smear_backout and i == m.n_layer // 2:
            backout_source = x
    if backout_source is not None:
        x = x - m.w["backout_lambda"] * backout_source
    return norm(x)


def reference_greedy(
    sd: dict[str, torch.Tensor],
    meta_cfg: dict[str, Any],
    era: str,
    prompt_ids: Sequence[int],
    n_new: int,
    softcap: float | None = None,
) -> list[int]:
    """The ``n_new`` greedily decoded tokens after ``prompt_ids``, recomputing the full forward every step.

    Ties go to the lowest id (``torch.argmax``). Unlike nanochat's E7 forward, a 1-token prompt is allowed.
    """
    ids = list(prompt_ids)
    for _ in range(n_new):
        ids.append(int(torch.argmax(reference_logits(sd, meta_cfg, era, ids, softcap)[-1])))
    return ids[len(prompt_ids) :]
