"""The seed fork's multi-token-prediction head, as a draft for speculative decoding (issue #22).

With ``mtp_enabled`` the fork (nanochat/mtp.py and gpt.py at 7e9ffe4; DeepSeek-V3's MTP at depth
1) trains a head that predicts token i+2 from the trunk's state at i and the token at i+1::

    x = proj([norm(h_i); norm(wte(t_i+1))])   h_i: the trunk's output after its final norm
    x = Block(x)      a plain block (no Engram, no mHC, the trunk's MLP), full causal attention
                      (the fork's window (-1, 0)) over the head's own positions, RoPE at i
    logits = softcap(lm_head(norm(x)))        the trunk's own lm_head, sliced to the vocab

The fork trains with it and decodes without it. As a draft it proposes the next token from the
target's hidden state at the token before the last and the last token (the one just sampled).
The state at the token it proposes is the verifying pass's to compute, so it proposes one token
a round (``Draft.cap``), and only once the sequence holds two tokens (``Draft.needs``).

Its cache (:class:`HeadCache`) holds the head block's keys and values and reads the hidden states
the target writes into its own cache (``KVCache.keep_hidden``, turned on by :func:`follow`); the
two roll back together after a rejection, and are kept between requests as the target's is.
The head's weights are read from the checkpoint when the draft is first named (the loader leaves
them out of the model: most replies never use them), checked as the trunk's are.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from desktop.engine.decode.drafts import no_head
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.errors import CheckpointError
from desktop.engine.files.finite import check_finite
from desktop.engine.nanochat import checkpoint as ckpt
from desktop.engine.nanochat.classify import Shape, expected_shapes
from desktop.engine.nanochat.config import ModelConfig
from desktop.engine.nanochat.loader import LoadedModel
from desktop.engine.nanochat.model import GPT, Block, norm

PREFIX = "mtp."


def head_config(cfg: ModelConfig) -> ModelConfig:
    """The head's one block as the fork builds it: the trunk's sizes and MLP, without Engram, mHC
    or DSA (its cache has this one layer)."""
    return replace(
        cfg,
        n_layer=1,
        engram_layers=(),
        engram_orders=(),
        engram_dim=0,
        mhc=False,
        dsa_layers=(),
        ve_layers=(),
        has_bigram=False,
        has_smear=False,
        has_mtp=False,
    )


def head_shapes(cfg: ModelConfig) -> dict[str, Shape]:
    """The head's keys in the checkpoint and their shapes: ``mtp.proj.weight [C, 2C]`` and the
    block's attention and MLP (spec 2.1)."""
    C = cfg.n_embd
    shapes: dict[str, Shape] = {PREFIX + "proj.weight": (C, 2 * C)}
    for key, shape in expected_shapes(head_config(cfg)).items():
        part = key.removeprefix("transformer.h.0.")
        if part != key and part.startswith(("attn.", "mlp.")):
            shapes[PREFIX + "block." + part] = shape
    return shapes


class MTPHead(nn.Module):
    """The head's weights, named as the checkpoint names them after ``mtp.``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = head_config(cfg)
        self.proj = nn.Linear(2 * cfg.n_embd, cfg.n_embd, bias=False)
        self.block = Block(self.config, 0)

    def prepare(self, target: GPT, gemv: str) -> None:
        """Frozen, with the target's kernels of ``gemv`` (chosen by its tuner)."""
        self.requires_grad_(False)
        tuner = target.tuner
        assert tuner is not None, "the target is prepared first"
        self.block.attn.bind(gemv, tuner)
        self.block.mlp.bind(gemv, tuner)
        tuner.install(self.proj, gemv)


def load_head(loaded: LoadedModel) -> MTPHead:
    """The checkpoint's MTP head on the target's device, in its dtype and kernels; one line when it
    has none or its keys do not fit."""
    cfg, path = loaded.config, loaded.model_file
    if not cfg.has_mtp:
        raise no_head(path)
    # Mapped: only the head's bytes are read, then copied to private memory.
    sd = ckpt.load_state_dict(path, mmap=True)
    found = {k: v for k, v in sd.items() if k.startswith(PREFIX)}
    want = head_shapes(cfg)
    wrong = sorted(k for k in found.keys() & want.keys() if tuple(found[k].shape) != want[k])
    odd = sorted(found.keys() ^ want.keys())
    if wrong or odd:
        raise CheckpointError(f"{path}: the MTP head does not fit the model: {', '.join([*odd, *wrong][:6])}")
    check_finite(found, path)
    state = {
        k.removeprefix(PREFIX): v.to(device=loaded.device, dtype=loaded.precision.compute, copy=True)
        for k, v in found.items()
    }
    del sd, found
    with torch.device("meta"):
        head = MTPHead(cfg)
    head.load_state_dict(state, strict=True, assign=True)
    head.prepare(loaded.model, loaded.precision.gemv)
    return head.eval()


class HeadCache:
    """The head block's keys and values and the tokens the head has read. ``pos`` counts tokens:
    the head's position j is token j+1 read with the target's hidden state at j (token 0 is read
    with nothing to compute). ``target``: the target's cache, whose hidden states it reads."""

    def __init__(self, cfg: ModelConfig, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        self.kv = KVCache(cfg, 1, capacity, device, dtype)
        self.tokens = torch.zeros(1, capacity, dtype=torch.long, device=device)
        self.pos = 0
        self.target: KVCache | None = None

    def truncate(self, n: int) -> None:
        """Forget every token from ``n`` on (and the head's positions made from them)."""
        if not 0 <= n <= self.pos:
            raise ValueError(f"cannot truncate a cache at {self.pos} to {n}")
        self.pos = n
        self.kv.truncate(max(n - 1, 0))

    def record(self, ids: torch.Tensor) -> None:
        end = self.pos + ids.size(1)
        if end > self.tokens.size(1):
            grown = torch.zeros(1, max(end, 2 * self.tokens.size(1)), dtype=torch.long, device=ids.device)
            grown[:, : self.pos] = self.tokens[:, : self.pos]
            self.tokens = grown
        self.tokens[:, self.pos : end] = ids
        self.pos = end


def follow(cache: HeadCache, target: KVCache) -> None:
    """``Draft.follow``: the target keeps its hidden states (a cache that had none forgets what it
    held and is prefilled again), and the head reads them."""
    target.keep_hidden(True)
    cache.target = target


class HeadDraft:
    """The head as the decode loop calls a draft: ``model(ids, cache, last_only)`` gives the logits
    for the token after ``ids``, which continue what ``cache`` holds."""

    def __init__(self, target: GPT, head: MTPHead) -> None:
        self.target = target
        self.head = head
        self.config = head.config
        # The fork's window (-1, 0): every earlier position (no context reaches the rotary table's end).
        self.window = head.config.rope_len

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.target.compute_dtype

    def new_cache(self, capacity: int) -> HeadCache:
        return HeadCache(self.config, capacity, self.device, self.compute_dtype)

    def __call__(
        self,
        ids: torch.Tensor,
        cache: HeadCache | None = None,
        last_only: bool = False,
        cancel: threading.Event | None = None,  # one pass: nothing to stop between
    ) -> torch.Tensor:
        if cache is None:
            raise ValueError("the MTP head decodes with its cache: it reads the target's states there")
        start, end = cache.pos, cache.pos + ids.size(1)
        first = max(start, 1)  # the first token the head computes at (its position first - 1)
        held = cache.target
        if first >= end:
            raise ValueError("the MTP head reads a token after the first")
        if held is None or held.hidden is None or held.pos < end - 1:
            raise ValueError("the target has not computed the hidden states the MTP head reads")
        kv, at = cache.kv, first - 1
        assert kv.pos == at
        h = held.hidden[:, at : end - 1]
        e = F.embedding(ids[:, first - start :], self.target.wte.weight)
        # The fork norms the trunk's (already final-normed) state again, as here.
        x = self.head.proj(torch.cat([norm(h), norm(e)], dim=-1))
        kv.ensure_capacity(end - 1)
        rope = self.target.rotation[:, at : end - 1]
        x = self.head.block.forward(x, rope, self.window, kv, None)
        kv.pos = end - 1
        cache.record(ids)
        x = norm(x)
        if last_only:
            x = x[:, -1:]
        return self.target.logits_of(x)
