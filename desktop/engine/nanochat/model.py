"""One configurable GPT that computes every nanochat era and the seed fork (docs/ARCHITECTURE.md, Eras).

Parameter names equal the checkpoint's state_dict keys, so weights are attached with
``load_state_dict(assign=True)`` straight from the memory-mapped file without a second copy.
The op order follows nanochat's (norm, RoPE then QK-norm, SDPA branches, softcap in fp32), so
CPU float32 results match nanochat's Engine token for token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from desktop.engine.decode.attention import flash_attn_kvcache_fn, inlined_attention, sdpa_attention
from desktop.engine.decode.chunked import (
    CHECK_ROWS,
    chunk_step,
    cut,
    keeps_bits,
    prefill_rows,
)
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.kernels.gemv import Kernel, alignment, packs, weight_bytes
from desktop.engine.kernels.rms_norm import rms_norm as norm
from desktop.engine.kernels.tuning import Choice, KernelTuner, tuner_for
from desktop.engine.nanochat.config import ModelConfig

Product = Callable[[torch.Tensor], torch.Tensor]  # x -> x @ W.T, whichever kernel computes it


def apply_rotary(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """nanochat's rotate-half RoPE: ``y1 = x1*cos + x2*sin``, ``y2 = x1*(-sin) + x2*cos``.

    ``rotation`` holds ``[[cos, sin], [-sin, cos]]`` per position (see :func:`rotary_tables`), so
    the four products are one multiply and the two sums one reduction over a dimension of two.
    Each output is still the sum of the same two rounded products (a sum of two floats rounds
    once, whatever the accumulator), so the bits are nanochat's, in 2 ops instead of 9.
    """
    B, T, H, D = x.shape
    halves = x.view(B, T, H, 1, 2, D // 2)
    return (halves * rotation).sum(-2).view(B, T, H, D)


def rotary_tables(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, length: int) -> torch.Tensor:
    """``(1, length, 1, 2, 2, head_dim / 2)``: ``[[cos, sin], [-sin, cos]]`` for positions
    ``0 .. length-1`` (each row depends on its position alone, so any length gives the same rows)."""
    hd = cfg.head_dim
    channel_range = torch.arange(0, hd, 2, dtype=torch.float32, device=device)
    inv_freq = 1.0 / (cfg.rope_base ** (channel_range / hd))
    t = torch.arange(length, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    if cfg.rope_bf16:
        # nanochat keeps the tables in bf16 (E0-E5 and the fork); rounding them is part of the math.
        cos, sin = cos.bfloat16(), sin.bfloat16()
    cos, sin = cos.to(dtype), sin.to(dtype)
    table = torch.stack([torch.stack([cos, sin], 1), torch.stack([-sin, cos], 1)], 1)
    return table[None, :, None]


def embedding(rows: int, dim: int) -> nn.Embedding:
    """An embedding table left uninitialised: weights always come from a checkpoint (or the demo
    trainer's own init). On the meta device, where models are built before loading, Embedding's
    default random init would import sympy: ~70 MB of resident memory and a second of loading."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.scale_qk = cfg.qk_scale != 1.0
        self.qk_scale: float | torch.Tensor = cfg.qk_scale
        C = cfg.n_embd
        self.c_q = nn.Linear(C, cfg.n_head * cfg.head_dim, bias=False)
        self.c_k = nn.Linear(C, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.c_v = nn.Linear(C, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.c_proj = nn.Linear(cfg.n_head * cfg.head_dim, C, bias=False)
        self.ve_channels = cfg.ve_gate_channels if layer in cfg.ve_layers else 0
        self.ve_scale: float | torch.Tensor = cfg.ve_gate_scale
        if self.ve_channels:
            self.ve_gate = nn.Linear(self.ve_channels, cfg.n_kv_head, bias=False)
        self.use_flash = False
        self.attend = sdpa_attention  # inlined_attention in a compiled twin of a small model
        self.qkv: Kernel | None = None  # q|k|v as one matrix, once bound for inference
        self.proj: Product | None = None

    def bind(self, kind: str, tuner: KernelTuner) -> None:
        """Install the kernels of ``kind``; q, k and v become one matrix where that is safe.

        One product instead of three per token, and q|k come out side by side, ready for RoPE and
        the norm. Fusing copies the three matrices; the originals are then dropped, so memory
        does not grow. "plain" keeps nanochat's three separate
        ``F.linear`` calls, and exact mode checks every route for the fused matrix against them
        (see ``gemv.ExactLinear``): a BLAS may sum a 3C-row product in another order than three
        C-row ones (MKL's threaded SGEMV splits the rows among threads by the row count).
        """
        self.attend = inlined_attention if kind == "inlined" else sdpa_attention
        self.qkv = self._fuse_qkv(kind, tuner) if kind != "plain" else None
        if self.qkv is None:
            for lin in (self.c_q, self.c_k, self.c_v):
                tuner.install(lin, kind)
        tuner.install(self.c_proj, kind)
        self.proj = self.c_proj.forward
        if self.ve_channels:
            tuner.install(self.ve_gate, kind)

    def _fuse_qkv(self, kind: str, tuner: KernelTuner) -> Kernel | None:
        """q|k|v as one product, or None where exact mode could not reproduce the separate ones."""
        parts = (self.c_q, self.c_k, self.c_v)
        originals = [lin.weight for lin in parts]
        rows = [w.shape[0] for w in originals]
        fused = torch.cat(originals)
        views = fused.split(rows)
        moved = any(alignment(v) != alignment(w) for v, w in zip(views, originals, strict=True))
        if kind == "exact" and moved:
            # The plain path multiplies the originals; a BLAS may sum otherwise at another alignment.
            return None
        product = tuner.product(fused, kind, rows)
        for lin, view in zip(parts, views, strict=True):
            if packs(fused, kind):
                lin.register_parameter("weight", None)
            else:  # state_dict and parameter counts still see q, k and v, now views of one matrix
                lin.weight = nn.Parameter(view, requires_grad=False)
        return product

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k side by side as ``(B, T, H + Hkv, D)``, and v as ``(B, T, Hkv, D)``.

        With q and k in one tensor, RoPE, QK-norm and the scale run once for both; every element
        sees the same operations as when they run separately, so no bit changes.
        """
        B, T, _ = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
        if self.qkv is not None:
            out = self.qkv(x)
            qk, v = out[..., : (H + Hkv) * D], out[..., (H + Hkv) * D :]
            return qk.view(B, T, H + Hkv, D), v.view(B, T, Hkv, D)
        q = self.c_q(x).view(B, T, H, D)
        k = self.c_k(x).view(B, T, Hkv, D)
        return torch.cat([q, k], dim=2), self.c_v(x).view(B, T, Hkv, D)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        window: int,
        cache: KVCache | None,
        ve: torch.Tensor | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        H = self.n_head
        qk, v = self._qkv(x)
        if ve is not None:
            gate = self.ve_scale * torch.sigmoid(self.ve_gate(x[..., : self.ve_channels]))
            v = v + gate.unsqueeze(-1) * ve.view(v.shape)
        qk = norm(apply_rotary(qk, rope))
        if self.scale_qk:
            qk = qk * self.qk_scale
        q, k = qk[:, :, :H], qk[:, :, H:]
        if cache is None:
            y = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), window).transpose(1, 2)
        else:
            y = self._cached(q, k, v, window, cache)
        return (self.proj or self.c_proj)(y.contiguous().view(B, T, -1))

    def _cached(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, cache: KVCache
    ) -> torch.Tensor:
        pos, T = cache.pos, q.size(1)
        k_cache, v_cache = cache.k_layers[self.layer], cache.v_layers[self.layer]
        if self.use_flash:  # pragma: no cover - CUDA + flash-attn only
            seqlens = torch.full((q.size(0),), pos, dtype=torch.int32, device=q.device)
            return flash_attn_kvcache_fn()(
                q.contiguous(),
                k_cache,
                v_cache,
                k=k.contiguous(),
                v=v.contiguous(),
                cache_seqlens=seqlens,
                causal=True,
                window_size=(window, 0),
            )
        k_cache[:, pos : pos + T] = k
        v_cache[:, pos : pos + T] = v
        k_full, v_full = k_cache[:, : pos + T], v_cache[:, : pos + T]
        return self.attend(
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
        self.products: tuple[Product, ...] = ()  # fc, proj(, gate) kernels, once bound for inference

    def bind(self, kind: str, tuner: KernelTuner) -> None:
        """Install the kernels of ``kind`` (see ``Attention.bind``)."""
        linears = (self.c_fc, self.c_proj, self.c_gate) if self.swiglu else (self.c_fc, self.c_proj)
        for lin in linears:
            tuner.install(lin, kind)
        self.products = tuple(lin.forward for lin in linears)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            c_fc, c_proj, c_gate = self.products or (self.c_fc, self.c_proj, self.c_gate)
            return c_proj(F.silu(c_gate(x)) * c_fc(x))
        c_fc, c_proj = self.products or (self.c_fc, self.c_proj)
        if torch.is_grad_enabled():  # training (the demo trainer): autograd needs relu's output
            return c_proj(F.relu(c_fc(x)).square())
        # In place on the product's own output: the same values, two fewer hidden-sized tensors
        # (25 MB each at a 1,024-token prefill of depth 12).
        return c_proj(c_fc(x).relu_().square_())


class Engram(nn.Module):
    """The fork's n-gram branch: causal averages of a bottleneck projection (docs/ARCHITECTURE.md, Eras)."""

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
    """The fork's mHC mixer: Sinkhorn-normalised weights over residual branches (ARCHITECTURE.md, Eras)."""

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
        rope: torch.Tensor,
        window: int,
        cache: KVCache | None,
        ve: torch.Tensor | None,
    ) -> torch.Tensor:
        # .forward: no hooks are used, and nn.Module's call machinery costs ~2 us a call per token.
        out = x + self.attn.forward(norm(x), rope, window, cache, ve)
        out = out + self.mlp.forward(norm(out))
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
                "wte": embedding(cfg.embed_rows, C),
                "h": nn.ModuleList(Block(cfg, i) for i in range(L)),
            }
        )
        self.lm_head = nn.Linear(C, cfg.embed_rows, bias=False)
        if cfg.has_lambdas:
            self.resid_lambdas = nn.Parameter(torch.ones(L))
            self.x0_lambdas = nn.Parameter(torch.zeros(L))
        if cfg.ve_layers:
            kvd = cfg.n_kv_head * cfg.head_dim
            self.value_embeds = nn.ModuleDict({str(i): embedding(cfg.embed_rows, kvd) for i in cfg.ve_layers})
        if cfg.has_bigram:
            self.bigram_embed = nn.Module()
            self.bigram_embed.embed = embedding(5 * cfg.vocab_size, C)
            self.bigram_lambdas = nn.Parameter(torch.zeros(L))
        if cfg.has_smear:
            self.smear_gate = nn.Linear(24, 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
            self.backout_lambda = nn.Parameter(torch.zeros(1))
        self.windows = cfg.window_sizes()
        self.register_buffer("rotation", torch.empty(0), persistent=False)
        self.softcap: float | torch.Tensor = cfg.softcap
        self._scalar_views: dict[str, list[torch.Tensor]] | None = None
        self._layers: list[tuple[Block, int, torch.Tensor | None]] | None = None  # set by prepare
        self._lm_head: Product | None = None  # the head's kernel; set by prepare
        self.tuner: KernelTuner | None = None  # chose the kernels; set by prepare
        self.kernel_kind = "plain"  # which kernels prepare bound ("exact", "fp16", ...)

    @property
    def blocks(self) -> Sequence[Block]:
        """The transformer blocks, typed (nn.ModuleDict attributes are not)."""
        return cast(Sequence[Block], self.transformer["h"])

    @property
    def wte(self) -> nn.Embedding:
        return cast(nn.Embedding, self.transformer["wte"])

    def set_rotary(self, device: torch.device, dtype: torch.dtype, length: int | None = None) -> None:
        """Rotary rows for ``length`` positions (default: twice the training context; nanochat's
        10x is reached by growing on demand, which keeps ~80% of the table out of memory)."""
        cfg = self.config
        length = min(cfg.rope_len, length or 2 * cfg.sequence_len)
        self.rotation = rotary_tables(cfg, device, dtype, length)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The activations' dtype (also the KV cache's)."""
        return self.rotation.dtype

    def prepare(
        self, device: torch.device, dtype: torch.dtype, gemv: str = "exact", tuner: KernelTuner | None = None
    ) -> None:
        """Ready a model whose weights were just attached for inference: rotary tables, frozen
        weights, scalars in their cheapest form, and the matrix-vector kernels of ``gemv``:
        "exact", "fp16", "int8" (see :mod:`.gemv`), "plain" for torch's own ``F.linear``, or
        "inlined" for a compiled twin's products and attention (``gemv.InlinedLinear``), each
        chosen by ``tuner``'s measurements (default: timings kept in memory only).

        Scalars cost more than the arithmetic in a one-token step: torch wraps a Python float into
        a tensor on every op (~2 us), and indexing a parameter makes a view each time. So learned
        scalars become views made once, and on the CPU constants become 0-dim fp32 tensors, which
        torch takes as a scalar with the same value a Python float gives."""
        self.set_rotary(device, dtype)
        self.requires_grad_(False)
        self._scalar_views = {name: list(t.unbind(0)) for name, t in self._scalar_params().items()}
        cfg = self.config
        # Off the CPU a Python float is cheap next to a kernel launch, and stays the safe choice.
        host = torch.tensor if device.type == "cpu" else float
        self.softcap = host(cfg.softcap)
        tuner = tuner or tuner_for(None)
        self.tuner, self.kernel_kind = tuner, gemv
        bound: set[int] = set()  # the Linears attention and MLP installed themselves
        for block in self.blocks:
            block.attn.qk_scale, block.attn.ve_scale = host(cfg.qk_scale), host(cfg.ve_gate_scale)
            for part in (block.attn, block.mlp):
                part.bind(gemv, tuner)
                bound.update(map(id, part.modules()))
        for module in self.modules():  # the head, the gates, Engram and mHC
            if isinstance(module, nn.Linear) and id(module) not in bound:
                tuner.install(module, gemv)
        self._layers = self._layer_inputs()
        self._lm_head = self.lm_head.forward

    def _layer_inputs(self) -> list[tuple[Block, int, torch.Tensor | None]]:
        """(block, window, value-embedding table or None) per layer."""
        ve = self.config.ve_layers
        return [
            (block, self.windows[i], self._value_table(i) if i in ve else None)
            for i, block in enumerate(self.blocks)
        ]

    def _value_table(self, layer: int) -> torch.Tensor:
        return cast(nn.Embedding, self.value_embeds[str(layer)]).weight

    def _scalar_params(self) -> dict[str, torch.Tensor]:
        names = ("resid_lambdas", "x0_lambdas", "bigram_lambdas", "smear_lambda", "backout_lambda")
        return {n: getattr(self, n) for n in names if hasattr(self, n)}

    def _scalars(self) -> dict[str, list[torch.Tensor]] | dict[str, torch.Tensor]:
        """Learned scalars: views made once when prepared, the parameters themselves while training."""
        return self._scalar_views if self._scalar_views is not None else self._scalar_params()

    def products(self) -> list[Kernel]:
        """Every matrix product's kernel once bound (q|k|v fused counts once), in model order."""
        found: list[Kernel] = []
        for module in self.modules():
            if isinstance(module, Attention) and module.qkv is not None:
                found.append(module.qkv)
            kernel = module.__dict__.get("forward") if isinstance(module, nn.Linear) else None
            if kernel is not None:
                found.append(kernel)
        return found

    def kernel_choices(self) -> list[Choice]:
        """Which kernel computes each distinct matrix shape, with the timings that chose it."""
        return self.tuner.describe(self.products()) if self.tuner is not None else []

    def decode_bytes(self) -> int:
        """Bytes one decode step reads from weights: every matrix once, one row of each embedding."""
        fused = [b.attn for b in self.blocks if b.attn.qkv is not None]
        covered = {id(lin) for a in fused for lin in (a.c_q, a.c_k, a.c_v)}
        total = sum(a.qkv.weight_nbytes for a in fused if a.qkv is not None)
        for module in self.modules():
            if isinstance(module, nn.Linear) and id(module) not in covered:
                total += weight_bytes(module)
            elif isinstance(module, nn.Embedding):
                total += module.weight.shape[1] * module.weight.element_size()
        return total

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    def forward(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        last_only: bool = False,
        chunk: int | None = None,
        cancel: threading.Event | None = None,
    ) -> torch.Tensor:
        """Logits (float32, softcapped, sliced to the real vocab) for ``idx`` (B, T).

        With a cache, ``idx`` continues the cached sequence and the cache advances by T.
        ``last_only`` computes the head for the final position only (generation needs no more).
        A long prompt prefilled that way runs its layers ``chunk`` rows at a time, so that its
        activations take a chunk's memory, not the prompt's (:mod:`~desktop.engine.decode.chunked`);
        by default where this machine gives one pass's bits that way (:meth:`_chunk_rows`); 0 is
        one pass. ``cancel`` set between two chunks ends the pass there, with the rows done kept
        in the cache (:func:`~desktop.engine.decode.chunked.prefill_rows`).
        """
        cfg = self.config
        T = idx.shape[1]
        pos = 0 if cache is None else cache.pos
        if pos + T > cfg.rope_len:
            raise ValueError(f"context of {pos + T} tokens exceeds the rotary table ({cfg.rope_len})")
        if cache is not None:
            cache.ensure_capacity(pos + T)
        # Rows for the whole cache at once, so memory grows when a cache is made, not mid-reply.
        needed = pos + T if cache is None else max(pos + T, cache.capacity)
        if needed > self.rotation.size(1):
            self.set_rotary(self.rotation.device, self.rotation.dtype, max(needed, 2 * self.rotation.size(1)))
        step = self._chunk_rows(T, cache, last_only) if chunk is None else chunk
        rope = self.rotation[:, pos : pos + T]
        scalars = self._scalars()
        # The embedding, E7's smear and E4's bigram over the whole prompt in every case: the smear
        # gate's one-column product and sigmoid compute their last rows by other code, so a chunk
        # boundary would move that tail (docs/PERFORMANCE.md, Loading and memory).
        x = norm(F.embedding(idx, self.wte.weight))
        if cfg.has_smear:
            x = self._smear(x, cache, scalars["smear_lambda"][0])
        bigram = self._bigram(idx, cache) if cfg.has_bigram else None

        def rows(a: int, b: int) -> torch.Tensor:
            h = norm(
                self._trunk(
                    cut(idx, a, b, T),
                    cut(x, a, b, T),
                    cut(bigram, a, b, T),
                    cut(rope, a, b, T),
                    cache,
                    scalars,
                )
            )
            # The MTP head reads each position's final state (nanochat/mtp.py).
            if cache is not None and cache.hidden is not None:
                cache.hidden[:, pos + a : pos + b] = h
            return h

        x = prefill_rows(idx, step, cache, last_only, cancel, rows)
        return self.logits_of(x)

    def _trunk(
        self,
        idx: torch.Tensor,
        x: torch.Tensor,
        bigram: torch.Tensor | None,
        rope: torch.Tensor,
        cache: KVCache | None,
        scalars: dict[str, list[torch.Tensor]] | dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """The layers over rows already embedded (and smeared), then E7's backout."""
        cfg = self.config
        x0 = x
        backout = None
        for block, window, ve_table in self._layers or self._layer_inputs():
            i = block.layer
            if cfg.has_lambdas:
                x = scalars["resid_lambdas"][i] * x + scalars["x0_lambdas"][i] * x0
                if bigram is not None:
                    x = x + scalars["bigram_lambdas"][i] * bigram
            ve = F.embedding(idx, ve_table) if ve_table is not None else None
            x = block.forward(x, rope, window, cache, ve)
            if cfg.has_smear and i == cfg.n_layer // 2:
                backout = x
        if backout is not None:
            x = x - scalars["backout_lambda"][0] * backout
        return x

    def _chunk_rows(self, T: int, cache: KVCache | None, last_only: bool) -> int:
        """Rows per prefill pass (:func:`~desktop.engine.decode.chunked.chunk_step`; 0: one pass).
        Never for the fork's mHC, whose mixer pools over the rows of a pass: chunks would change
        its math, not only its rounding."""
        if self.config.mhc:
            return 0
        return chunk_step(self, T, cache, last_only, self._chunks_keep_bits)

    def _chunks_keep_bits(self) -> bool:
        """:func:`~desktop.engine.decode.chunked.keeps_bits` through one layer of each kind
        (:meth:`_check_layers`), not all of them."""
        cfg = self.config
        layers = self._layers
        self._layers = self._check_layers()
        try:
            return keeps_bits(
                lambda ids, cache, chunk: self(ids, cache, last_only=True, chunk=chunk),
                cfg.vocab_size,
                min(CHECK_ROWS, cfg.rope_len),  # past PREFILL_CHUNK, as any prompt checked
                lambda rows: KVCache(cfg, 1, rows, self.device, self.compute_dtype),
            )
        finally:
            self._layers = layers

    def _check_layers(self) -> list[tuple[Block, int, torch.Tensor | None]]:
        """The first layer of each kind (window, value embedding, Engram branch), the one E7's
        backout keeps and the last: a chunk runs the same kernels in every layer of a kind, so
        the check costs a few layers' prefill (3.1-3.5 s at depth 20), not the model's (11-12 s)."""
        layers = self._layers or self._layer_inputs()
        kinds: dict[tuple[int, bool, bool], tuple[Block, int, torch.Tensor | None]] = {}
        for block, window, ve in layers:
            kinds.setdefault((window, ve is not None, hasattr(block, "engram")), (block, window, ve))
        picked = {entry[0].layer: entry for entry in kinds.values()}
        for extra in (layers[self.config.n_layer // 2], layers[-1]):
            picked.setdefault(extra[0].layer, extra)
        return [picked[i] for i in sorted(picked)]

    def logits_of(self, x: torch.Tensor) -> torch.Tensor:
        """The head on final-normed states: float32 logits, sliced to the real vocab, softcapped."""
        logits = (self._lm_head or self.lm_head)(x)
        if logits.size(-1) != self.config.vocab_size:
            logits = logits[..., : self.config.vocab_size]
        logits = logits.float()
        return self.softcap * torch.tanh(logits / self.softcap)

    def _smear(self, e: torch.Tensor, cache: KVCache | None, lam: torch.Tensor) -> torch.Tensor:
        """E7: mix each position's embedding with the previous one's (pre-smear) embedding."""
        pos = 0 if cache is None else cache.pos
        if cache is not None and cache.embeds is not None:
            cache.embeds[:, pos : pos + e.size(1)] = e
        if pos > 0 and cache is not None and cache.embeds is not None:
            prev = cache.embeds[:, pos - 1 : pos]
            if e.size(1) > 1:
                prev = torch.cat([prev, e[:, :-1]], dim=1)
            return e + lam * torch.sigmoid(self.smear_gate(e[..., :24])) * prev
        if e.size(1) == 1:
            return e
        gated = lam * torch.sigmoid(self.smear_gate(e[:, 1:, :24])) * e[:, :-1]
        if torch.is_grad_enabled():  # training (the demo trainer): autograd needs e as it was
            return torch.cat([e[:, :1], e[:, 1:] + gated], dim=1)
        # In place on this pass's own embeddings (the cache holds their copy): the same sums,
        # without two more prompt-sized tensors (10 MB each at 2,000 tokens of depth 20).
        e[:, 1:] += gated
        return e

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
        return F.embedding(h, cast(nn.Embedding, self.bigram_embed.embed).weight)
