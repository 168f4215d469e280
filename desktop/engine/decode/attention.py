"""Causal attention with FA3 ``(left, 0)`` sliding windows, over an optional KV cache.

The SDPA path mirrors nanochat's fallback branch for branch (same calls, same masks), so on CPU
float32 it computes the same numbers nanochat does. flash-attn's KV-cache kernel is used on
Hopper when installed (docs/ARCHITECTURE.md, Eras). :func:`inlined_attention` computes the same
function for the compiled twins of small models (engine/decode/compiled_draft.py).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def flash_attn_kvcache_fn():  # pragma: no cover - only on CUDA machines with flash-attn
    """Return flash-attn's ``flash_attn_with_kvcache`` if it is importable, else None."""
    for module in ("flash_attn_interface", "flash_attn"):
        try:
            mod = __import__(module)
            return mod.flash_attn_with_kvcache
        except (ImportError, AttributeError):
            continue
    return None


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """``q``: (B, H, Tq, D); ``k``/``v``: (B, Hkv, Tk, D) holding every key up to the last query.

    A query at absolute position p sees keys ``p - window .. p``.
    """
    tq, tk = q.size(2), k.size(2)
    gqa = bool(q.size(1) != k.size(1))  # a Python bool: SDPA takes no symbolic one (compiled)
    if window >= tq and tq == tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if tq == 1:
        if window < tk:
            start = max(0, tk - (window + 1))
            k, v = k[:, :, start:], v[:, :, start:]
        return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=gqa)
    # A chunk appended to a cache, or a window shorter than the chunk: an explicit offset mask
    # (``is_causal`` would align top-left for Tq != Tk).
    row = (tk - tq) + torch.arange(tq, device=q.device).unsqueeze(1)
    col = torch.arange(tk, device=q.device).unsqueeze(0)
    mask = col <= row
    if window < tk:
        # col >= row - window, not (row - col) <= window: the same mask without a Tq x Tk int64
        # temporary (8 MB at a 1,024-token prefill, per sliding-window layer).
        mask &= col >= row - window
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def inlined_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """What :func:`sdpa_attention` computes (to float rounding), as broadcast products and sums.

    For the compiled twin of a small model only: inductor fuses these into its own loops with
    the ops around them, where SDPA stays a call to its CPU kernel, which costs ~80 us a layer
    for the demo's one-row step, most of the layer (2-core AMD EPYC). Run eagerly, the products
    are materialised: (rows, keys, head size) per head, small for the passes of a few rows a twin
    runs."""
    b, h, tq, d = q.shape
    hkv, tk = k.size(1), k.size(2)
    # Query heads grouped under their key/value head (GQA) instead of repeating the keys.
    q = q.reshape(b, hkv, h // hkv, tq, 1, d)
    k = k.reshape(b, hkv, 1, 1, tk, d)
    v = v.reshape(b, hkv, 1, 1, tk, d)
    scores = (q * k).sum(-1) * d**-0.5  # (b, hkv, group, tq, tk)
    # Query i sits at absolute position tk - tq + i, and sees keys from position - window to itself.
    row = (tk - tq) + torch.arange(tq, device=q.device).unsqueeze(1)
    col = torch.arange(tk, device=q.device).unsqueeze(0)
    seen = (col <= row) & (col >= row - window)
    weights = scores.masked_fill(~seen, float("-inf")).softmax(-1).unsqueeze(-1)
    return (weights * v).sum(-2).reshape(b, h, tq, d)
