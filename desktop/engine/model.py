"""One configurable GPT that computes every nanochat era and the seed fork (spec §1.3-1.7, §2.1).

Parameter names equal the checkpoint's state_dict keys, so weights are attached with
``load_state_dict(assign=True)`` straight from the memory-mapped file without a second copy.
The op order follows nanochat's (norm, RoPE then QK-norm, SDPA branches, softcap in fp32), so
CPU float32 results match nanochat's Engine token for token.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import flash_attn_kvcache_fn, sdpa_attention
from .config import ModelConfig
from .kvcache import KVCache
from .parallel_linear import RowLinear, parallelize


def norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.shape[3] // 2
    x1, x2 = x[..., :d], x[..., d:]
    y1 = x1 * cos + x2 * sin
    y2 = x1 * (-sin) + x2 * cos
    return torch.cat([y1, y2], 3)


def rotary_tables(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    hd = cfg.head_dim
    channel_range = torch.arange(0, hd, 2, dtype=torch.float32, device=device)
    inv_freq = 1.0 / (cfg.rope_base ** (channel_range / hd))
    t = torch.arange(cfg.rope_len, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    if cfg.rope_bf16:
        # nanochat keeps the tables in bf16 (E0-E5 and the fork); rounding them is part of the math.
        cos, sin = cos.bfloat16(), sin.bfloat16()
    return cos.to(dtype)[None, :, None, :], sin.to(dtype)[None, :, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.qk_scale = cfg.qk_scale
        C = cfg.n_embd
        self.c_q = nn.Linear(C, cfg.n_head * cfg.head_dim, bias=False)
        self.c_k = nn.Linear(C, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.c_v = nn.Linear(C, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.c_proj = nn.Linear(cfg.n_head * cfg.head_dim, C, bias=False)
        self.ve_channels = cfg.ve_gate_channels if layer in cfg.ve_layers else 0
        self.ve_scale = cfg.ve_gate_scale
        if self.ve_channels:
            self.ve_gate = nn.Linear(self.ve_channels, cfg.n_kv_head, bias=False)
        self.use_flash = False
        self._qkv: RowLinear | None = None

    def fuse_qkv(self) -> None:
        """One matrix-vector product for q, k and v: their rows stacked, so each output is the
        same dot product as before (bit-identical) and the separate weights become views of it."""
        fused = torch.cat([self.c_q.weight, self.c_k.weight, self.c_v.weight])
        nq, nk = self.c_q.weight.shape[0], self.c_k.weight.shape[0]
        for lin, part in zip((self.c_q, self.c_k, self.c_v), fused.split((nq, nk, nk)), strict=True):
            lin.weight = nn.Parameter(part, requires_grad=False)
        self._qkv = RowLinear(fused)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        window: int,
        cache: KVCache | None,
        ve: torch.Tensor | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        if self._qkv is not None:
            nq, nk = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
            q, k, v = self._qkv(x).split((nq, nk, nk), dim=-1)
        else:
            q, k, v = self.c_q(x), self.c_k(x), self.c_v(x)
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_kv_head, self.head_dim)
        v = v.contiguous().view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:
            gate = self.ve_scale * torch.sigmoid(self.ve_gate(x[..., : self.ve_channels]))
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_kv_head, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k = norm(q), norm(k)
        if self.qk_scale != 1.0:
            q, k = q * self.qk_scale, k * self.qk_scale
        if cache is None:
            y = sdpa_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), window).transpose(
                1, 2
            )
        else:
            y = self._cached(q, k, v, window, cache)
        return self.c_proj(y.contiguous().view(B, T, -1))

    def _cached(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, cache: KVCache
    ) -> torch.Tensor:
        pos, T = cache.pos, q.size(1)
        k_cache, v_cache = cache.k[self.layer], cache.v[self.layer]
        if self.use_flash:  # pragma: no cover - CUDA + flash-attn only
            seqlens = torch.full((q.size(0),), pos, dtype=torch.int32, device=q.device)
            return flash_attn_kvcache_fn()(
                q, k_cache, v_cache, k=k, v=v, cache_seqlens=seqlens, causal=True, window_size=(window, 0)
            )
        k_cache[:, pos : pos + T] = k
        v_cache[:, pos : pos + T] = v
        k_full, v_full = k_cache[:, : pos + T], v_cache[:, : pos + T]
        return sdpa_attention(
            q.transpose(1, 2), k_full.transpose(1, 2), v_full.transpose(1, 2), window
        ).transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.swiglu = cfg.swiglu
        self.c_fc = nn.Linear(cfg.n_embd, cfg.hidden_dim, bias=False)
        if cfg.swiglu:
            self.c_gate = nn.Linear(cfg.n_embd, cfg.hidden_dim, bias=False)
        self.c_proj = nn.Linear(cfg.hidden_dim, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x))
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Engram(nn.Module):
    """The fork's n-gram branch: causal averages of a bottleneck projection (spec §2.1)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.orders = cfg.engram_orders
        self.in_proj = nn.Linear(cfg.n_embd, cfg.engram_dim, bias=False)
        self.order_mix = nn.ModuleList(
            nn.Linear(cfg.engram_dim, cfg.engram_dim, bias=False) for _ in self.orders
        )
        self.out_proj = nn.Linear(cfg.engram_dim, cfg.n_embd, bias=False)

    def forward(self, u: torch.Tensor, history: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``u``: normed block input (B, T, C); ``history``: earlier z values (B, P, Cb) or None."""
        z = self.in_proj(u)
        T = z.size(1)
        mixed = []
        for n, mix in zip(self.orders, self.order_mix, strict=True):
            prev = history[:, -(n - 1) :] if history is not None and n > 1 else z[:, :0]
            pad = (n - 1) - prev.size(1)
            seq = torch.cat([prev, z], dim=1).transpose(1, 2)  # (B, Cb, P + T)
            if pad > 0:
                seq = F.pad(seq, (pad, 0))
            avg = F.avg_pool1d(seq, kernel_size=n, stride=1).transpose(1, 2)[:, -T:]
            mixed.append(mix(avg))
        return self.out_proj(torch.stack(mixed).mean(0)), z


class BranchMixer(nn.Module):
    """The fork's mHC mixer: Sinkhorn-normalised weights over residual branches (spec §2.1)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = max(8, min(256, cfg.n_embd // 4))
        self.score_proj = nn.Linear(cfg.n_embd, hidden, bias=False)
        self.score_out = nn.Linear(hidden, 1, bias=False)
        self.iters, self.temperature = cfg.mhc_sinkhorn_iters, cfg.mhc_temperature
        self.eps, self.alpha = cfg.mhc_epsilon, min(max(cfg.mhc_blend_alpha, 0.0), 1.0)

    def forward(self, branches: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(branches, dim=2)  # (B, T, N, C)
        logits = self.score_out(torch.tanh(self.score_proj(stacked.mean(dim=1)))).squeeze(-1)
        raw = ((logits.unsqueeze(-1) + logits.unsqueeze(-2)) / max(self.temperature, self.eps)).float()
        transport = torch.exp(raw - raw.amax(dim=(-2, -1), keepdim=True)).clamp_min(self.eps)
        for _ in range(max(0, self.iters)):
            transport = transport / (transport.sum(dim=-1, keepdim=True) + self.eps)
            transport = transport / (transport.sum(dim=-2, keepdim=True) + self.eps)
        transport = transport / (transport.sum(dim=-1, keepdim=True) + self.eps)
        weights = transport.mean(dim=1)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + self.eps)
        uniform = torch.full_like(weights, 1.0 / stacked.size(2))
        weights = torch.where(torch.isfinite(weights).all(dim=-1, keepdim=True), weights, uniform)
        mixed = (stacked * weights.to(stacked.dtype)[:, None, :, None]).sum(dim=2)
        return mixed if self.alpha == 1.0 else branches[0] + self.alpha * (mixed - branches[0])


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        if layer in cfg.engram_layers:
            self.engram = Engram(cfg)
        if cfg.mhc:
            self.mhc = BranchMixer(cfg)
        self.layer = layer

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        window: int,
        cache: KVCache | None,
        ve: torch.Tensor | None,
    ) -> torch.Tensor:
        out = x + self.attn(norm(x), cos, sin, window, cache, ve)
        out = out + self.mlp(norm(out))
        has_engram = hasattr(self, "engram")
        if has_engram:
            hist = None
            if cache is not None:
                hist = cache.engram[self.layer][:, : cache.pos]
            y, z = self.engram(norm(x), hist)
            if cache is not None:
                cache.engram[self.layer][:, cache.pos : cache.pos + z.size(1)] = z
            eng = out + y
        if not hasattr(self, "mhc"):
            return eng if has_engram else out
        return self.mhc([out, x, eng] if has_engram else [out, x])


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        C, L = cfg.n_embd, cfg.n_layer
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(cfg.embed_rows, C),
                "h": nn.ModuleList(Block(cfg, i) for i in range(L)),
            }
        )
        self.lm_head = nn.Linear(C, cfg.embed_rows, bias=False)
        if cfg.has_lambdas:
            self.resid_lambdas = nn.Parameter(torch.ones(L))
            self.x0_lambdas = nn.Parameter(torch.zeros(L))
        if cfg.ve_layers:
            kvd = cfg.n_kv_head * cfg.head_dim
            self.value_embeds = nn.ModuleDict(
                {str(i): nn.Embedding(cfg.embed_rows, kvd) for i in cfg.ve_layers}
            )
        if cfg.has_bigram:
            self.bigram_embed = nn.Module()
            self.bigram_embed.embed = nn.Embedding(5 * cfg.vocab_size, C)
            self.bigram_lambdas = nn.Parameter(torch.zeros(L))
        if cfg.has_smear:
            self.smear_gate = nn.Linear(24, 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
            self.backout_lambda = nn.Parameter(torch.zeros(1))
        self.windows = cfg.window_sizes()
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    def prepare(self, device: torch.device, dtype: torch.dtype, decode_paths: bool = True) -> None:
        """Finish a model whose weights were just attached: rotary tables and, unless
        ``decode_paths`` is off, the bit-exact decode speed-ups (fused q/k/v, row-parallel GEMV)."""
        self.cos, self.sin = rotary_tables(self.config, device, dtype)
        self.requires_grad_(False)
        if not decode_paths:
            return
        for block in self.transformer.h:
            block.attn.fuse_qkv()
        for module in self.modules():
            if isinstance(module, nn.Linear):
                parallelize(module)

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    def forward(
        self, idx: torch.Tensor, cache: KVCache | None = None, last_only: bool = False
    ) -> torch.Tensor:
        """Logits (float32, softcapped, sliced to the real vocab) for ``idx`` (B, T).

        With a cache, ``idx`` continues the cached sequence and the cache advances by T.
        ``last_only`` computes the head for the final position only (generation needs no more).
        """
        cfg = self.config
        T = idx.shape[1]
        pos = 0 if cache is None else cache.pos
        if pos + T > cfg.rope_len:
            raise ValueError(f"context of {pos + T} tokens exceeds the rotary table ({cfg.rope_len})")
        if cache is not None:
            cache.ensure_capacity(pos + T)
        cos, sin = self.cos[:, pos : pos + T], self.sin[:, pos : pos + T]
        x = norm(self.transformer.wte(idx).to(self.cos.dtype))
        if cfg.has_smear:
            x = self._smear(x, cache)
        x0 = x
        bigram = self._bigram(idx, cache) if cfg.has_bigram else None
        backout = None
        for i, block in enumerate(self.transformer.h):
            if cfg.has_lambdas:
                x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
                if bigram is not None:
                    x = x + self.bigram_lambdas[i] * bigram
            ve = self.value_embeds[str(i)](idx).to(x.dtype) if i in cfg.ve_layers else None
            x = block(x, cos, sin, self.windows[i], cache, ve)
            if cfg.has_smear and i == cfg.n_layer // 2:
                backout = x
        if backout is not None:
            x = x - self.backout_lambda * backout
        if cache is not None:
            cache.tokens[:, pos : pos + T] = idx
            cache.pos = pos + T
        x = norm(x)
        if last_only:
            x = x[:, -1:]
        logits = self.lm_head(x)[..., : cfg.vocab_size].float()
        return cfg.softcap * torch.tanh(logits / cfg.softcap)

    def _smear(self, e: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """E7: mix each position's embedding with the previous one's (pre-smear) embedding."""
        pos = 0 if cache is None else cache.pos
        if cache is not None and cache.embeds is not None:
            cache.embeds[:, pos : pos + e.size(1)] = e
        prev = e[:, :-1]
        if pos > 0 and cache is not None and cache.embeds is not None:
            prev = torch.cat([cache.embeds[:, pos - 1 : pos], prev], dim=1)
            gated = self.smear_lambda * torch.sigmoid(self.smear_gate(e[..., :24])) * prev
            return e + gated
        if e.size(1) == 1:
            return e
        gated = self.smear_lambda * torch.sigmoid(self.smear_gate(e[:, 1:, :24])) * prev
        return torch.cat([e[:, :1], e[:, 1:] + gated], dim=1)

    def _bigram(self, idx: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """E4: hash (previous, current) token pairs into a 5V table; position 0 gets 5V-1."""
        mod = 5 * self.config.vocab_size - 1
        pos = 0 if cache is None else cache.pos
        if pos > 0 and cache is not None:
            prev = torch.cat([cache.tokens[:, pos - 1 : pos], idx[:, :-1]], dim=1)
            h = torch.bitwise_xor(36313 * idx, 27191 * prev) % mod
        else:
            h = torch.empty_like(idx)
            h[:, 0] = mod
            h[:, 1:] = torch.bitwise_xor(36313 * idx[:, 1:], 27191 * idx[:, :-1]) % mod
        return self.bigram_embed.embed(h).to(self.cos.dtype)
