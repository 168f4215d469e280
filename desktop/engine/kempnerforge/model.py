"""KempnerForge's dense ``Transformer`` forward, op for op (checkpoint-formats spec §3.1).

Pre-norm decoder: embedding → blocks (norm → attention → residual, norm → MLP → residual) →
final norm → output head; no softcap. The operations, their order, their dtypes and their
shapes are those of ``kempnerforge/model/*.py`` so that logits match its own forward bit for bit
on the same device: RMSNorm in fp32 cast back, per-head QK RMSNorm (eps 1e-5, as KempnerForge
builds it) before RoPE, fp32 rotary tables made on the CPU and cast to the activation dtype,
GQA by ``repeat_interleave``, SDPA with the default scale, logits for every position.

One deliberate difference: KempnerForge's attention passes ``is_causal=True`` whenever the cache
is in use and more than one token comes in, which is wrong for a chunk appended to a non-empty
cache (PyTorch aligns that mask top-left). Such appends, which only the prefix cache of a chat
makes, get an explicit offset mask; a prefill from an empty cache and one-token decoding run
exactly as KempnerForge runs them.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from desktop.engine.decode.chunked import chunk_step_of_uniform, cut, prefill_rows
from desktop.engine.kempnerforge.config import KFModelConfig
from desktop.engine.kernels.gemv import Kernel
from desktop.engine.kernels.memory import zeros_on_demand
from desktop.engine.kernels.tuning import Choice, KernelTuner

QK_NORM_EPS = 1e-5  # Attention builds RMSNorm(head_dim) with the default eps, not model.norm_eps
# Above this many logits a prefill computes only the last position's (memory); below it, every
# position's, as KempnerForge does (a matrix product's rows may round differently by row count).
FULL_LOGITS_LIMIT = 1 << 26


@dataclass
class Norm:
    weight: torch.Tensor
    bias: torch.Tensor | None  # layernorm only


@dataclass
class Block:
    attention_norm: Norm
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    mlp_norm: Norm
    gate: torch.Tensor | None  # silu (SwiGLU) only
    up: torch.Tensor
    down: torch.Tensor


def rope_tables(cfg: KFModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """KempnerForge's ``precompute_rope_frequencies``: fp32, on the CPU, max_seq_len rows."""
    hd = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd))
    positions = torch.arange(cfg.max_seq_len)
    table = torch.outer(positions, freqs)
    return table.cos(), table.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    shape = [1] * (x.ndim - 2) + list(cos.shape)
    cos = cos.view(*shape).to(x.dtype)
    sin = sin.view(*shape).to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (norm * weight).to(dtype)


class KFCache:
    """Keys and values of every layer (after RoPE, before GQA expansion), and the tokens they hold."""

    def __init__(self, cfg: KFModelConfig, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.capacity = capacity
        shape = (1, cfg.n_kv_heads, capacity, cfg.head_dim)
        # Memory as positions are written, as nanochat's cache takes it (kernels.memory).
        self.k = [zeros_on_demand(shape, dtype, device) for _ in range(cfg.n_layers)]
        self.v = [zeros_on_demand(shape, dtype, device) for _ in range(cfg.n_layers)]
        self.pos = 0
        self.tokens: list[int] = []

    def reserve(self, capacity: int) -> None:
        """Room for ``capacity`` positions (what is held is kept)."""
        if capacity <= self.capacity:
            return
        grown = KFCache(self.cfg, capacity, self.device, self.dtype)
        for i in range(self.cfg.n_layers):
            grown.k[i][:, :, : self.pos] = self.k[i][:, :, : self.pos]
            grown.v[i][:, :, : self.pos] = self.v[i][:, :, : self.pos]
        self.k, self.v, self.capacity = grown.k, grown.v, capacity

    def truncate(self, n: int) -> None:
        self.pos = min(self.pos, n)
        del self.tokens[self.pos :]

    def record(self, ids: torch.Tensor) -> None:
        """``ids`` (1, n), whose keys and values a pass just wrote from ``pos`` on: hold them."""
        del self.tokens[self.pos :]
        self.tokens.extend(int(t) for t in ids[0].tolist())
        self.pos += ids.size(1)

    def same_as(self, other: object) -> bool:
        """Whether both hold the same tokens, keys and values, bit for bit."""
        if not isinstance(other, KFCache) or (other.pos, other.tokens) != (self.pos, self.tokens):
            return False
        p = self.pos
        pairs = [*zip(self.k, other.k, strict=True), *zip(self.v, other.v, strict=True)]
        return all(torch.equal(a[:, :, :p], b[:, :, :p]) for a, b in pairs)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.pos + k.shape[2]
        self.k[layer][:, :, self.pos : end] = k
        self.v[layer][:, :, self.pos : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


_SDPA = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


class KFTransformer:
    """The loaded weights and the forward. ``model(ids, cache)`` -> logits (B, T, vocab)."""

    def __init__(
        self,
        cfg: KFModelConfig,
        embedding: torch.Tensor,
        blocks: list[Block],
        norm: Norm,
        output: torch.Tensor,
        device: torch.device,
        tuner: KernelTuner,
    ) -> None:
        self.config = cfg
        self.embedding, self.blocks, self.norm, self.output = embedding, blocks, norm, output
        # Every matrix by the fastest route that gives F.linear's bits (see kernel_tuning).
        matrices = [output, *(w for b in blocks for w in (b.q, b.k, b.v, b.o, b.gate, b.up, b.down))]
        self._matrices = list({id(w): w for w in matrices if w is not None}.values())
        self._products: dict[int, Kernel] = {id(w): tuner.exact(w) for w in self._matrices}
        self.kernel_kind = "exact"  # KempnerForge's bits; "fp16" or "int8" for a draft
        self.tuner = tuner
        self.device = device
        self.compute_dtype = embedding.dtype
        cos, sin = rope_tables(cfg)
        self.cos, self.sin = cos.to(device), sin.to(device)
        self.n_rep = cfg.n_heads // cfg.n_kv_heads
        self.sdpa_backend = cfg.sdpa_backend

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self._products[id(weight)](x)

    def pack(self, kind: str) -> None:
        """Compute this model's products by ``kind``'s kernels ("fp16", "int8": fast and int8
        mode on a CPU), their fp32 matrices freed (the embedding table the head may share stays)."""
        self._products = self.tuner.own_products(self._matrices, kind, keep=(self.embedding,))
        self.kernel_kind = kind

    def with_kernels(self, kind: str) -> KFTransformer:
        """The same model (the same weight tensors, no copy) computing its products by ``kind``'s
        kernels ("fp16", "int8": see kernels/tuning.py): a cheap draft for speculative decoding."""
        other = copy.copy(self)
        other._products = {id(w): self.tuner.product(w, kind) for w in self._matrices}
        other.kernel_kind = kind
        return other

    def kernel_choices(self) -> list[Choice]:
        """Which route computes each matrix shape, as :meth:`GPT.kernel_choices` tells it."""
        return self.tuner.describe(list(self._products.values()))

    def tensors(self) -> Iterator[torch.Tensor]:
        seen: set[int] = set()
        for t in self._all():
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                yield t

    def _all(self) -> Iterator[torch.Tensor | None]:
        yield self.embedding
        yield self.output
        yield self.norm.weight
        yield self.norm.bias
        for b in self.blocks:
            yield from (
                b.attention_norm.weight,
                b.attention_norm.bias,
                b.q,
                b.k,
                b.v,
                b.o,
                b.q_norm,
                b.k_norm,
            )
            yield from (b.mlp_norm.weight, b.mlp_norm.bias, b.gate, b.up, b.down)

    @property
    def n_params(self) -> int:
        return sum(t.numel() for t in self.tensors())

    def _norm(self, x: torch.Tensor, n: Norm) -> torch.Tensor:
        if self.config.norm_type == "rmsnorm":
            return rms_norm(x, n.weight, self.config.norm_eps)
        return F.layer_norm(x, (x.shape[-1],), n.weight, n.bias, self.config.norm_eps)

    def _mlp(self, x: torch.Tensor, b: Block) -> torch.Tensor:
        act = self.config.activation
        if act == "silu":
            assert b.gate is not None
            return self._linear(F.silu(self._linear(x, b.gate)) * self._linear(x, b.up), b.down)
        hidden = self._linear(x, b.up)
        return self._linear(F.gelu(hidden) if act == "gelu" else F.relu(hidden), b.down)

    def _sdpa_context(self) -> contextlib.AbstractContextManager:
        if self.sdpa_backend == "auto":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, _SDPA[self.sdpa_backend]))

    def _attention(
        self,
        x: torch.Tensor,
        b: Block,
        layer: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KFCache | None,
    ) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        hd = self.config.head_dim
        q = self._linear(x, b.q).view(batch, seq_len, -1, hd)
        k = self._linear(x, b.k).view(batch, seq_len, -1, hd)
        v = self._linear(x, b.v).view(batch, seq_len, -1, hd)
        if b.q_norm is not None and b.k_norm is not None:
            q = rms_norm(q, b.q_norm, QK_NORM_EPS)
            k = rms_norm(k, b.k_norm, QK_NORM_EPS)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        start = 0
        if cache is not None:
            start = cache.pos
            k, v = cache.update(layer, k, v)
        out = self._attend(q, k, v, start, cache is None)
        out = out.transpose(1, 2).contiguous().view(batch, seq_len, -1)
        return self._linear(out, b.o)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, fresh: bool
    ) -> torch.Tensor:
        """SDPA of ``q`` (B, H, T, D) at positions ``start ..`` over ``k``/``v`` (B, Hkv, S, D),
        after QK-norm and RoPE, GQA by ``repeat_interleave``; ``fresh``: no cache. A seam the
        Inside recorder wraps."""
        seq_len = q.shape[2]
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=1)
            v = v.repeat_interleave(self.n_rep, dim=1)
        with self._sdpa_context():
            if start and seq_len > 1:
                rows = torch.arange(start, start + seq_len, device=q.device).unsqueeze(1)
                mask = torch.arange(start + seq_len, device=q.device).unsqueeze(0) <= rows
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return F.scaled_dot_product_attention(q, k, v, is_causal=fresh or seq_len > 1)

    def _block(
        self, x: torch.Tensor, blk: Block, i: int, cos: torch.Tensor, sin: torch.Tensor, cache: KFCache | None
    ) -> torch.Tensor:
        """One decoder block: the residual stream it gets to the one it returns."""
        x = x + self._attention(self._norm(x, blk.attention_norm), blk, i, cos, sin, cache)
        return x + self._mlp(self._norm(x, blk.mlp_norm), blk)

    def __call__(
        self,
        ids: torch.Tensor,
        cache: KFCache | None = None,
        last_only: bool = False,
        cancel: threading.Event | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Logits for ``ids`` (B, T); with ``cache``, ``ids`` continue what it holds, which it keeps.

        ``last_only`` may compute only the last position's logits when the whole block would be
        large; every position's are computed otherwise (as KempnerForge does). A long prompt
        prefilled for its last logits runs its layers ``chunk`` rows at a time, by default where
        this machine gives one pass's bits that way (as nanochat's ``GPT.forward``:
        :mod:`~desktop.engine.decode.chunked`); 0 is one pass. ``cancel`` set between two chunks
        ends the pass there, with the rows done kept in the cache.
        """
        seq_len = ids.shape[1]
        start = cache.pos if cache is not None else 0
        if start + seq_len > self.config.max_seq_len:
            raise ValueError(f"{start + seq_len} positions exceed max_seq_len {self.config.max_seq_len}")
        if cache is not None:
            cache.reserve(start + seq_len)
        step = self._chunk_rows(seq_len, cache, last_only) if chunk is None else chunk
        h = F.embedding(ids, self.embedding)

        def rows(a: int, b: int) -> torch.Tensor:
            x = cut(h, a, b, seq_len)
            cos, sin = self.cos[start + a : start + b], self.sin[start + a : start + b]
            for i, blk in enumerate(self.blocks):
                x = self._block(x, blk, i, cos, sin, cache)
            return self._norm(x, self.norm)

        last = last_only and seq_len * self.config.vocab_size > FULL_LOGITS_LIMIT
        return self._linear(prefill_rows(ids, step, cache, last, cancel, rows), self.output)

    def _chunk_rows(self, T: int, cache: KFCache | None, last_only: bool) -> int:
        """Rows per prefill pass (:func:`~desktop.engine.decode.chunked.chunk_step_of_uniform`)."""
        cfg = self.config
        return chunk_step_of_uniform(
            self,
            "blocks",
            T,
            cache,
            last_only,
            lambda rows: KFCache(cfg, rows, self.device, self.compute_dtype),
        )
