"""The forward pass of a Hugging Face NanoChat or Llama model, op for op as transformers runs it.

One small module for both families (checkpoint-formats spec §4, §4.1); where they differ:

=====================  ==========================================  ===============================
                       nanochat (NanoChatForCausalLM)              llama (LlamaForCausalLM)
=====================  ==========================================  ===============================
RMSNorm                no weight; also right after the embedding   with a weight
rotary sign            ``cat(x2, -x1)`` (nanochat's)               ``cat(-x2, x1)``
after RoPE             QK RMSNorm over each head                   nothing
MLP                    ``fc2(relu(fc1(x))²)``                      ``down(silu(gate(x)) * up(x))``
logits                 ``cap * tanh(logits / cap)``                as they come
=====================  ==========================================  ===============================

Norms compute in float32 and cast back, cos/sin are computed in float32 from ``inv_freq`` and cast
to the activation dtype, as in transformers. The KV cache is the engine's :class:`KVCache`, so the
generation loop, the prefix cache and scoring work on this model as on nanochat's.
"""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from desktop.engine.decode.attention import sdpa_attention
from desktop.engine.decode.chunked import chunk_step_of_uniform, cut, prefill_rows
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.hf.config import HFConfig, Rope
from desktop.engine.kernels.gemv import Kernel
from desktop.engine.kernels.tuning import Choice, KernelTuner

# A window wider than any context: every HF layer attends causally to all earlier positions.
FULL_WINDOW = 1 << 62


def inv_freq(rope: Rope, head_dim: int) -> torch.Tensor:
    """transformers' inverse frequencies for the rope kinds implemented (float32)."""
    base = 1.0 / (
        rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim)
    )
    if rope.kind == "linear":
        return base / rope.factor
    if rope.kind == "llama3":
        low_wavelen = rope.original_max_positions / rope.low_freq_factor
        high_wavelen = rope.original_max_positions / rope.high_freq_factor
        wavelen = 2 * math.pi / base
        scaled = torch.where(wavelen > low_wavelen, base / rope.factor, base)
        smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return base


@dataclass
class Layer:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    up: torch.Tensor  # llama up_proj / nanochat fc1
    down: torch.Tensor  # llama down_proj / nanochat fc2
    gate: torch.Tensor | None = None  # llama gate_proj
    input_norm: torch.Tensor | None = None  # llama only
    post_norm: torch.Tensor | None = None
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None
    gate_bias: torch.Tensor | None = None


class HFCausalLM:
    """Weights plus the forward: ``model(ids, cache, last_only)``, as nanochat's ``GPT`` is called."""

    def __init__(self, config: HFConfig, weights: dict[str, torch.Tensor], tuner: KernelTuner) -> None:
        self.config = config
        self.nanochat = config.model_type == "nanochat"
        self.embed = weights["model.embed_tokens.weight"]
        self.head = self.embed if config.tie_embeddings else weights["lm_head.weight"]
        self.final_norm = weights.get("model.norm.weight")
        self.layers = [self._layer(weights, i) for i in range(config.n_layer)]
        self.inv_freq = inv_freq(config.rope, config.head_dim).to(self.embed.device)
        self._cos = self._sin = torch.empty(0)
        # Every bias-free matrix by the fastest route that gives F.linear's bits (see
        # kernel_tuning): transformers' numbers, on all cores where one-row F.linear uses one.
        matrices = [t for name, t in weights.items() if name.endswith(".weight") and t.dim() == 2]
        self._matrices = list({id(w): w for w in (*matrices, self.head)}.values())
        self._products: dict[int, Kernel] = {id(w): tuner.exact(w) for w in self._matrices}
        self.kernel_kind = "exact"  # transformers' bits; "fp16" or "int8" for a draft
        self.tuner = tuner

    def pack(self, kind: str) -> None:
        """Compute this model's products by ``kind``'s kernels ("fp16", "int8": fast and int8
        mode on a CPU), their fp32 matrices freed (the embedding table the head may share stays)."""
        self._products = self.tuner.own_products(self._matrices, kind, keep=(self.embed,))
        self.kernel_kind = kind

    def with_kernels(self, kind: str) -> HFCausalLM:
        """The same model (the same weight tensors, no copy) computing its products by ``kind``'s
        kernels ("fp16", "int8": see kernels/tuning.py): a cheap draft for speculative decoding."""
        other = copy.copy(self)
        other._products = {id(w): self.tuner.product(w, kind) for w in self._matrices}
        other.kernel_kind = kind
        return other

    def decode_bytes(self) -> int:
        """Bytes one decode step reads from weights: every matrix once, one embedding row."""
        matrices = sum(p.weight_nbytes for p in self._products.values())
        return matrices + self.embed.shape[1] * self.embed.element_size()

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Tensor:
        if bias is not None:  # F.linear adds a bias inside the GEMM; a product then an add rounds twice
            return F.linear(x, weight, bias)
        return self._products[id(weight)](x)

    def kernel_choices(self) -> list[Choice]:
        """Which route computes each matrix shape, as :meth:`GPT.kernel_choices` tells it."""
        return self.tuner.describe(list(self._products.values()))

    @staticmethod
    def _layer(w: dict[str, torch.Tensor], i: int) -> Layer:
        p = f"model.layers.{i}"
        a, m = f"{p}.self_attn", f"{p}.mlp"
        llama = f"{m}.gate_proj.weight" in w
        up, down = ("up_proj", "down_proj") if llama else ("fc1", "fc2")
        return Layer(
            q=w[f"{a}.q_proj.weight"],
            k=w[f"{a}.k_proj.weight"],
            v=w[f"{a}.v_proj.weight"],
            o=w[f"{a}.o_proj.weight"],
            up=w[f"{m}.{up}.weight"],
            down=w[f"{m}.{down}.weight"],
            gate=w.get(f"{m}.gate_proj.weight"),
            input_norm=w.get(f"{p}.input_layernorm.weight"),
            post_norm=w.get(f"{p}.post_attention_layernorm.weight"),
            q_bias=w.get(f"{a}.q_proj.bias"),
            k_bias=w.get(f"{a}.k_proj.bias"),
            v_bias=w.get(f"{a}.v_proj.bias"),
            o_bias=w.get(f"{a}.o_proj.bias"),
            up_bias=w.get(f"{m}.{up}.bias"),
            down_bias=w.get(f"{m}.{down}.bias"),
            gate_bias=w.get(f"{m}.gate_proj.bias"),
        )

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.embed.dtype

    def _rms(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return h.to(dtype) if weight is None else weight * h.to(dtype)

    def _rotary(self, pos: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, head_dim) for positions pos .. pos+T-1; rows are computed for a
        whole table at once (each row is an elementwise product, so rows do not depend on it)."""
        if pos + T > self._cos.size(0):
            length = max(pos + T, 2 * self._cos.size(0), 64)
            positions = torch.arange(length, device=self.device).float()
            freqs = positions[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos, self._sin = emb.cos().to(self.compute_dtype), emb.sin().to(self.compute_dtype)
        return self._cos[pos : pos + T], self._sin[pos : pos + T]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        turned = torch.cat((x2, -x1), dim=-1) if self.nanochat else torch.cat((-x2, x1), dim=-1)
        return (x * cos) + (turned * sin)

    def _attention(
        self,
        x: torch.Tensor,
        layer: Layer,
        index: int,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
    ) -> torch.Tensor:
        cfg = self.config
        B, T, _ = x.shape
        q = self._linear(x, layer.q, layer.q_bias).view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2)
        k = self._linear(x, layer.k, layer.k_bias).view(B, T, cfg.n_kv_head, cfg.head_dim).transpose(1, 2)
        v = self._linear(x, layer.v, layer.v_bias).view(B, T, cfg.n_kv_head, cfg.head_dim).transpose(1, 2)
        q, k = self._rotate(q, *rope), self._rotate(k, *rope)
        if self.nanochat:  # RoPE, then QK-norm (the port's order)
            q, k = self._rms(q, None), self._rms(k, None)
        if cache is not None:
            pos = cache.pos
            k_cache, v_cache = cache.k_layers[index], cache.v_layers[index]
            k_cache[:, pos : pos + T] = k.transpose(1, 2)
            v_cache[:, pos : pos + T] = v.transpose(1, 2)
            k, v = k_cache[:, : pos + T].transpose(1, 2), v_cache[:, : pos + T].transpose(1, 2)
        y = self._attend(q, k, v)
        return self._linear(y.transpose(1, 2).reshape(B, T, -1), layer.o, layer.o_bias)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of ``q`` (B, H, T, D) over ``k``/``v`` (B, Hkv, S, D) as the layer
        uses them (after RoPE and QK-norm; GQA shared): a seam the Inside recorder wraps."""
        return sdpa_attention(q, k, v, FULL_WINDOW)

    def _block(
        self,
        h: torch.Tensor,
        layer: Layer,
        index: int,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
    ) -> torch.Tensor:
        """One decoder layer: the residual stream it gets to the one it returns."""
        h = h + self._attention(self._rms(h, layer.input_norm), layer, index, rope, cache)
        return h + self._mlp(self._rms(h, layer.post_norm), layer)

    def _mlp(self, x: torch.Tensor, layer: Layer) -> torch.Tensor:
        if layer.gate is not None:
            gate = F.silu(self._linear(x, layer.gate, layer.gate_bias))
            hidden = gate * self._linear(x, layer.up, layer.up_bias)
        else:
            hidden = torch.square(F.relu(self._linear(x, layer.up, layer.up_bias)))
        return self._linear(hidden, layer.down, layer.down_bias)

    @torch.inference_mode()
    def __call__(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        last_only: bool = False,
        cancel: threading.Event | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Float32 logits for ``idx`` (B, T); with a cache, ``idx`` continues it and it advances by T.
        A long prompt prefilled for its last logits runs its layers ``chunk`` rows at a time, by
        default where this machine gives one pass's bits that way (as nanochat's ``GPT.forward``:
        :mod:`~desktop.engine.decode.chunked`); 0 is one pass. ``cancel`` set between two chunks
        ends the pass there, with the rows done kept in the cache."""
        T = idx.shape[1]
        pos = 0 if cache is None else cache.pos
        if pos + T > self.config.rope_len:
            raise ValueError(
                f"context of {pos + T} tokens exceeds max_position_embeddings ({self.config.rope_len})"
            )
        if cache is not None:
            cache.ensure_capacity(pos + T)
        step = self._chunk_rows(T, cache, last_only) if chunk is None else chunk
        x = F.embedding(idx, self.embed)
        if self.nanochat:
            x = self._rms(x, None)

        def rows(a: int, b: int) -> torch.Tensor:
            h, rope = cut(x, a, b, T), self._rotary(pos + a, b - a)
            for i, layer in enumerate(self.layers):
                h = self._block(h, layer, i, rope, cache)
            return self._rms(h, self.final_norm)

        logits = self._linear(prefill_rows(idx, step, cache, last_only, cancel, rows), self.head)
        cap = self.config.softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def _chunk_rows(self, T: int, cache: KVCache | None, last_only: bool) -> int:
        """Rows per prefill pass (:func:`~desktop.engine.decode.chunked.chunk_step_of_uniform`)."""
        cfg = self.config
        return chunk_step_of_uniform(
            self,
            "layers",
            T,
            cache,
            last_only,
            lambda rows: KVCache(cfg, 1, rows, self.device, self.compute_dtype),
        )
