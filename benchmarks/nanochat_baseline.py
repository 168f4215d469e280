"""A faithful stand-in for nanochat's own ``Engine.generate`` on CPU, used as the speed baseline.

It mirrors how upstream nanochat (master, E7 architecture) runs a decode step: separate q/k/v
projections, an FA3-layout KV cache whose position is read with ``.item()`` in every layer,
the SDPA fallback with its masks, logits over every prefill position, and a Python-level
state machine per token. It is the yardstick the issue's baseline table was measured with, and
the reference exact mode is tested against bit for bit (``tests/test_exact_mode.py``); ``trace``
hands named intermediates to ``benchmarks/check_exact.py``, which finds the first that differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.shape[3] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3)


def _sdpa(q, k, v, window: int):
    tq, tk = q.size(2), k.size(2)
    gqa = q.size(1) != k.size(1)
    if (window < 0 or window >= tq) and tq == tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if tq == 1:
        if 0 <= window < tk:
            start = max(0, tk - (window + 1))
            k, v = k[:, :, start:], v[:, :, start:]
        return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=gqa)
    row = (tk - tq) + torch.arange(tq).unsqueeze(1)
    col = torch.arange(tk).unsqueeze(0)
    mask = col <= row
    if 0 <= window < tk:
        mask = mask & ((row - col) <= window)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class _Cache:
    def __init__(self, L: int, B: int, T: int, H: int, D: int) -> None:
        self.k = torch.zeros(L, B, T, H, D)
        self.v = torch.zeros(L, B, T, H, D)
        self.seqlens = torch.zeros(B, dtype=torch.int32)
        self.prev_embedding: torch.Tensor | None = None

    def pos(self) -> int:
        return int(self.seqlens[0].item())


class NanochatE7:
    """nanochat's current GPT (E7: lambdas, VE, smear, backout) over a plain state dict."""

    def __init__(self, ckpt_dir: Path, step: int) -> None:
        self.w = torch.load(ckpt_dir / f"model_{step:06d}.pt", map_location="cpu", weights_only=True)
        self.w = {k.removeprefix("_orig_mod."): v.float() for k, v in self.w.items()}
        mc = json.loads((ckpt_dir / f"meta_{step:06d}.json").read_text())["model_config"]
        self.cfg = mc
        self.L, self.H, self.Hkv, self.C = mc["n_layer"], mc["n_head"], mc["n_kv_head"], mc["n_embd"]
        self.hd = self.C // self.H
        self.V = mc["vocab_size"]
        seq = mc["sequence_len"]
        short = -(-seq // 4 // 128) * 128
        pattern = mc.get("window_pattern", "L")
        self.windows = [seq if pattern[i % len(pattern)] == "L" else short for i in range(self.L)]
        self.windows[-1] = seq
        inv = 1.0 / (100000.0 ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        freqs = torch.outer(torch.arange(10 * seq, dtype=torch.float32), inv)
        self.cos, self.sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]
        # Called with (name, tensor) at the points check_exact compares; None: no tracing.
        self.trace: Callable[[str, torch.Tensor], None] | None = None

    def _note(self, name: str, t: torch.Tensor) -> None:
        if self.trace is not None:
            self.trace(name, t)

    def new_cache(self, capacity: int) -> _Cache:
        return _Cache(self.L, 1, capacity, self.Hkv, self.hd)

    def _lin(self, x, key):
        return F.linear(x, self.w[key])

    def forward(self, idx: torch.Tensor, cache: _Cache) -> torch.Tensor:
        w, B, T = self.w, *idx.shape
        T0 = cache.pos()
        cos, sin = self.cos[:, T0 : T0 + T], self.sin[:, T0 : T0 + T]
        x = _norm(F.embedding(idx, w["transformer.wte.weight"]))
        lam = w["smear_lambda"]
        pre_smear = x[:, -1:]
        if T > 1:
            gate = torch.sigmoid(self._lin(x[:, 1:, :24], "smear_gate.weight"))
            x = torch.cat([x[:, :1], x[:, 1:] + lam * gate * x[:, :-1]], dim=1)
        elif cache.prev_embedding is not None:
            gate = torch.sigmoid(self._lin(x[:, :, :24], "smear_gate.weight"))
            x = x + lam * gate * cache.prev_embedding
        cache.prev_embedding = pre_smear
        x0, xb = x, None
        for i in range(self.L):
            x = w["resid_lambdas"][i] * x + w["x0_lambdas"][i] * x0
            p = f"transformer.h.{i}."
            h = _norm(x)
            q = self._lin(h, p + "attn.c_q.weight").view(B, T, self.H, self.hd)
            k = self._lin(h, p + "attn.c_k.weight").view(B, T, self.Hkv, self.hd)
            v = self._lin(h, p + "attn.c_v.weight").view(B, T, self.Hkv, self.hd)
            for name, t in (("q", q), ("k", k), ("v", v)):
                self._note(f"layer {i} {name}", t)
            if f"value_embeds.{i}.weight" in w:
                ve = F.embedding(idx, w[f"value_embeds.{i}.weight"]).view(B, T, self.Hkv, self.hd)
                v = v + 3 * torch.sigmoid(self._lin(h[..., :12], p + "attn.ve_gate.weight"))[..., None] * ve
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            q, k = _norm(q) * 1.2, _norm(k) * 1.2
            pos = cache.pos()
            cache.k[i, :, pos : pos + T] = k
            cache.v[i, :, pos : pos + T] = v
            y = _sdpa(
                q.transpose(1, 2),
                cache.k[i, :, : pos + T].transpose(1, 2),
                cache.v[i, :, : pos + T].transpose(1, 2),
                self.windows[i],
            ).transpose(1, 2)
            if i == self.L - 1:
                cache.seqlens += T
            y = y.contiguous().view(B, T, -1)
            self._note(f"layer {i} attention output", y)
            proj = self._lin(y, p + "attn.c_proj.weight")
            self._note(f"layer {i} attn.c_proj", proj)
            x = x + proj
            hm = self._lin(_norm(x), p + "mlp.c_fc.weight")
            self._note(f"layer {i} mlp.c_fc", hm)
            mlp = self._lin(F.relu(hm).square(), p + "mlp.c_proj.weight")
            self._note(f"layer {i} mlp.c_proj", mlp)
            x = x + mlp
            self._note(f"layer {i} output", x)
            if i == self.L // 2:
                xb = x
        x = _norm(x - w["backout_lambda"] * xb)
        head = self._lin(x, "lm_head.weight")
        self._note("lm_head", head)
        logits = head[..., : self.V].float()
        logits = 15 * torch.tanh(logits / 15)
        self._note("logits", logits)
        return logits

    @torch.inference_mode()
    def generate(self, tokens: list[int], max_tokens: int, temperature: float, top_k: int, seed: int = 42):
        rng = torch.Generator()
        rng.manual_seed(seed)
        pre = _Cache(self.L, 1, len(tokens), self.Hkv, self.hd)
        logits = self.forward(torch.tensor([tokens], dtype=torch.long), pre)[:, -1, :]
        cache = _Cache(self.L, 1, len(tokens) + max_tokens, self.Hkv, self.hd)
        p = pre.pos()
        cache.k[:, :, :p], cache.v[:, :, :p] = pre.k[:, :, :p], pre.v[:, :, :p]
        cache.seqlens.fill_(p)
        cache.prev_embedding = pre.prev_embedding
        for _ in range(max_tokens):
            if temperature == 0:
                nxt = torch.argmax(logits, dim=-1, keepdim=True)
            else:
                vals, idx = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1)
                probs = F.softmax(vals / temperature, dim=-1)
                nxt = idx.gather(1, torch.multinomial(probs, 1, generator=rng))
            token = nxt[:, 0].tolist()[0]
            yield token
            logits = self.forward(torch.tensor([token], dtype=torch.long).unsqueeze(1), cache)[:, -1, :]


def count_bytes_per_step(model: NanochatE7) -> int:
    w = model.w
    lin = sum(
        t.numel() * 4 for k, t in w.items() if t.dim() == 2 and "wte" not in k and "value_embeds" not in k
    )
    emb = sum(t.shape[1] * 4 for k, t in w.items() if "wte" in k or "value_embeds" in k)
    return lin + emb
