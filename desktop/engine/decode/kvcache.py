"""KV cache plus the per-position state some eras need to decode incrementally.

Besides keys and values (nanochat's ``(B, T, H, D)`` layout, so the SDPA path sees the same
tensors nanochat's does), the cache keeps per-position histories that make chunk appends and
rollbacks exact (docs/ARCHITECTURE.md, Eras):

* E7 smear needs the *pre-smear* embedding of the previous token;
* E4 bigram needs the previous token id;
* Engram needs the last ``max_order - 1`` bottleneck activations of each engram layer;
* the fork's MTP head, drafting, reads the trunk's final hidden state at each position
  (:meth:`keep_hidden`; off unless a draft asks, so plain decoding writes nothing more).

Keeping whole histories (not ring buffers) lets :meth:`truncate` roll back to any position,
which the prefix cache uses when a conversation is edited or a reply regenerated.

On the CPU every tensor takes memory as positions are written (``zeros_on_demand``): a cache
made for a whole reply holds the positions reached so far, not all of them from the start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from desktop.engine.kernels.memory import zeros_on_demand

if TYPE_CHECKING:
    import torch

    from desktop.engine.decode.protocols import CacheShape


class KVCache:
    def __init__(
        self, cfg: CacheShape, batch: int, capacity: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        import torch

        self.cfg = cfg
        self.batch = batch
        self.capacity = capacity
        self.device = device
        self.dtype = dtype
        self.pos = 0  # a Python int: reading it never syncs with the device
        shape = (cfg.n_layer, batch, capacity, cfg.n_kv_head, cfg.head_dim)
        self.k = zeros_on_demand(shape, dtype, device)
        self.v = zeros_on_demand(shape, dtype, device)
        self._split_layers()
        self.tokens = zeros_on_demand((batch, capacity), torch.long, device)
        self.embeds = zeros_on_demand((batch, capacity, cfg.n_embd), dtype, device) if cfg.has_smear else None
        engram = (batch, capacity, cfg.engram_dim)
        self.engram = {i: zeros_on_demand(engram, dtype, device) for i in cfg.engram_layers}
        self.hidden: torch.Tensor | None = None  # (B, capacity, n_embd) when kept

    def keep_hidden(self, keep: bool) -> None:
        """Keep each position's final hidden state from now on (the model writes it), or stop.

        Positions held before have none, so turning it on forgets them: the next pass prefills."""
        if not keep:
            self.hidden = None
        elif self.hidden is None:
            shape = (self.batch, self.capacity, self.cfg.n_embd)
            self.hidden = zeros_on_demand(shape, self.dtype, self.device)
            self.pos = 0

    def _split_layers(self) -> None:
        # Per-layer views made once: indexing ``k[layer]`` would make a new view every step.
        self.k_layers, self.v_layers = list(self.k.unbind(0)), list(self.v.unbind(0))

    def _tensors(self) -> dict[str, torch.Tensor]:
        out = {"k": self.k, "v": self.v, "tokens": self.tokens}
        if self.embeds is not None:
            out["embeds"] = self.embeds
        if self.hidden is not None:
            out["hidden"] = self.hidden
        return out

    def ensure_capacity(self, needed: int) -> None:
        """Grow (doubling) so that ``needed`` positions fit; existing content is kept."""
        if needed <= self.capacity:
            return
        new_cap = max(needed, 2 * self.capacity)

        def grown(t: torch.Tensor, time_dim: int) -> torch.Tensor:
            shape = list(t.shape)
            shape[time_dim] = new_cap
            out = zeros_on_demand(shape, t.dtype, t.device)
            out.narrow(time_dim, 0, self.pos).copy_(t.narrow(time_dim, 0, self.pos))
            return out

        self.k = grown(self.k, 2)
        self.v = grown(self.v, 2)
        self._split_layers()
        self.tokens = grown(self.tokens, 1)
        if self.embeds is not None:
            self.embeds = grown(self.embeds, 1)
        if self.hidden is not None:
            self.hidden = grown(self.hidden, 1)
        self.engram = {i: grown(z, 1) for i, z in self.engram.items()}
        self.capacity = new_cap

    def record(self, ids: torch.Tensor) -> None:
        """``ids`` (B, n), whose keys and values a pass just wrote from ``pos`` on: hold them."""
        n = ids.size(1)
        self.tokens[:, self.pos : self.pos + n] = ids
        self.pos += n

    def truncate(self, n: int) -> None:
        """Forget everything from position ``n`` on (exact for every era thanks to the histories)."""
        if not 0 <= n <= self.pos:
            raise ValueError(f"cannot truncate a cache at {self.pos} to {n}")
        self.pos = n

    def replicate(self, batch: int) -> KVCache:
        """A new cache of ``batch`` rows, each a copy of row 0 up to ``pos`` (one prefill, many samples)."""
        other = KVCache(self.cfg, batch, self.capacity, self.device, self.dtype)
        p = self.pos
        other.k[:, :, :p] = self.k[:, :1, :p]
        other.v[:, :, :p] = self.v[:, :1, :p]
        other.tokens[:, :p] = self.tokens[:1, :p]
        if self.embeds is not None and other.embeds is not None:
            other.embeds[:, :p] = self.embeds[:1, :p]
        if self.hidden is not None:
            other.keep_hidden(True)
            assert other.hidden is not None
            other.hidden[:, :p] = self.hidden[:1, :p]
        for i, z in self.engram.items():
            other.engram[i][:, :p] = z[:1, :p]
        other.pos = p
        return other

    def same_as(self, other: object) -> bool:
        """Whether both hold the same positions with the same bits: keys, values, tokens and the
        histories (an exact comparison, for checking that two ways of filling a cache agree)."""
        import torch

        p = self.pos
        if not isinstance(other, KVCache) or other.pos != p or self.engram.keys() != other.engram.keys():
            return False
        mine, theirs = self._tensors(), other._tensors()
        if mine.keys() != theirs.keys():
            return False
        pairs = [(self.k[:, :, :p], other.k[:, :, :p]), (self.v[:, :, :p], other.v[:, :, :p])]
        pairs += [(t[:, :p], theirs[name][:, :p]) for name, t in mine.items() if name not in ("k", "v")]
        pairs += [(z[:, :p], other.engram[i][:, :p]) for i, z in self.engram.items()]
        return all(torch.equal(a, b) for a, b in pairs)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self._tensors().values(), *self.engram.values()])
