"""One hooked forward pass of a nanochat-family ``GPT`` (every era and the fork's variants), and
what it gives at any position: the logit lens, attention rows and direct logit attribution.

The pass is the model's own ``forward`` over the ids (no copy of the model, nothing of its math
redone): for its duration, the methods the model calls through instance attributes are
wrapped (each block's ``forward``, its attention's ``forward`` and ``attend``, its MLP's,
Engram's and mHC's ``forward``, and the model's ``_trunk``) so that each records what it was
given and what it returned; they are put back as they were when the pass ends, even on error.

What is kept (per layer, for the whole pass): the stream each block returns, its attention's
and MLP's outputs, Engram's, the q and k the attention used (after RoPE, QK-norm and scale)
and its per-head output before the output projection. A position's numbers are computed from
those on demand (:class:`NanochatPass`), in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from desktop.engine.inside.recording import Patches, approximate_note, attention_rows
from desktop.engine.inside.yielding import Stop, check
from desktop.engine.kernels.rms_norm import rms_norm as norm
from desktop.engine.nanochat.model import GPT

_EPS = float(torch.finfo(torch.float32).eps)  # what the final RMSNorm adds (F.rms_norm's default)


@dataclass
class _Layer:
    """What one block recorded."""

    out: torch.Tensor | None = None  # (T, C): the stream the block returned
    attn_in: torch.Tensor | None = None  # (T, C): the normed input of attention (value-embedding layers)
    ve: torch.Tensor | None = None  # (T, Hkv*D): the value-embedding rows (value-embedding layers)
    attn: torch.Tensor | None = None  # (T, C): attention's output, after the projection
    q: torch.Tensor | None = None  # (H, T, D), as attention used it
    k: torch.Tensor | None = None  # (Hkv, T, D)
    y: torch.Tensor | None = None  # (H, T, D): each head's output before the projection
    window: int = 0
    mlp: torch.Tensor | None = None  # (T, C)
    engram: torch.Tensor | None = None  # (T, C): Engram's output (its branch minus the block's out)
    # mHC: the mixed stream as (coefficient of out, of the block's input, of out + Engram),
    # fitted over the pass (least squares in float64; the mixer's weights are the same for every row).
    mix: tuple[float, ...] = ()
    branches: list[torch.Tensor] = field(default_factory=list)


def readout_of(model: GPT) -> str:
    """What the lens reads after each block of ``model``, in one line."""
    cfg = model.config
    parts = [
        "the residual stream each block returns, read out through the final RMSNorm, lm_head and "
        f"softcap {float(cfg.softcap):g} (exactly the model's own readout after the last block)"
    ]
    if cfg.has_smear:
        parts.append(
            f"from block {cfg.n_layer // 2} on minus backout_lambda × the stream after block "
            f"{cfg.n_layer // 2}, as the final norm gets it"
        )
    if cfg.mhc:
        parts.append("with mHC, the mixed stream a block returns (what the next block and final norm get)")
    return "; ".join(parts)


def record(model: GPT, ids: Sequence[int], stop: Stop | None = None) -> NanochatPass:
    """One forward pass of ``model`` over ``ids`` with every block's parts recorded; ``stop``
    is asked before each block (:func:`~desktop.engine.inside.recording.check`)."""
    cfg = model.config
    layers = [_Layer() for _ in range(cfg.n_layer)]
    got: dict[str, torch.Tensor | None] = {}
    patches = Patches()

    def trunk(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def wrapped(idx, x, bigram, rope, cache, scalars):  # type: ignore[no-untyped-def]
            got["x0"] = x[0]  # after E7's smear: what the lambdas mix back in
            got["bigram"] = None if bigram is None else bigram[0]
            return original(idx, x, bigram, rope, cache, scalars)

        return wrapped

    for block in model.blocks:
        rec = layers[block.layer]

        def block_forward(original, rec=rec):  # type: ignore[no-untyped-def]
            def wrapped(x, rope, window, cache, ve):  # type: ignore[no-untyped-def]
                check(stop)
                out = original(x, rope, window, cache, ve)
                rec.out = out[0]
                return out

            return wrapped

        def attn_forward(original, rec=rec):  # type: ignore[no-untyped-def]
            def wrapped(x, rope, window, cache, ve):  # type: ignore[no-untyped-def]
                if ve is not None:
                    rec.attn_in, rec.ve = x[0], ve[0]
                out = original(x, rope, window, cache, ve)
                rec.attn = out[0]
                return out

            return wrapped

        def attend(original, rec=rec):  # type: ignore[no-untyped-def]
            def wrapped(q, k, v, window):  # type: ignore[no-untyped-def]
                y = original(q, k, v, window)
                rec.q, rec.k, rec.y, rec.window = q[0], k[0], y[0], int(window)
                return y

            return wrapped

        def one_out(original, slot, rec=rec):  # type: ignore[no-untyped-def]
            def wrapped(*args):  # type: ignore[no-untyped-def]
                out = original(*args)
                setattr(rec, slot, (out[0] if slot == "engram" else out)[0])
                return out

            return wrapped

        def mixer(original, rec=rec):  # type: ignore[no-untyped-def]
            def wrapped(branches):  # type: ignore[no-untyped-def]
                mixed = original(branches)
                rec.branches = [b[0] for b in branches] + [mixed[0]]
                return mixed

            return wrapped

        patches.set(block, "forward", block_forward(block.forward))
        patches.set(block.attn, "forward", attn_forward(block.attn.forward))
        patches.set(block.attn, "attend", attend(block.attn.attend))
        patches.set(block.mlp, "forward", one_out(block.mlp.forward, "mlp"))
        if hasattr(block, "engram"):
            patches.set(block.engram, "forward", one_out(block.engram.forward, "engram"))
        if hasattr(block, "mhc"):
            patches.set(block.mhc, "forward", mixer(block.mhc.forward))
    patches.set(model, "_trunk", trunk(model._trunk))
    idx = torch.tensor([list(ids)], dtype=torch.long, device=model.device)
    try:
        with torch.inference_mode():
            logits = model(idx, None, last_only=True)
    finally:
        patches.restore()
    for rec in layers:
        if rec.branches:
            rec.mix = _fit_mix(rec.branches)
            rec.branches = []
    return NanochatPass(model, tuple(ids), layers, got["x0"], got.get("bigram"), logits[0, -1])


def _fit_mix(recorded: list[torch.Tensor]) -> tuple[float, ...]:
    """The coefficients ``a`` with ``mixed = sum(a[n] * branch[n])`` over every row of the pass."""
    *branches, mixed = recorded
    a = torch.stack([b.reshape(-1).double() for b in branches], 1)
    solution = torch.linalg.lstsq(a, mixed.reshape(-1, 1).double()).solution
    return tuple(float(v) for v in solution[:, 0])


class NanochatPass:
    """A recorded pass (:func:`record`) and a position's numbers from it."""

    def __init__(
        self,
        model: GPT,
        ids: tuple[int, ...],
        layers: list[_Layer],
        x0: torch.Tensor | None,
        bigram: torch.Tensor | None,
        last_logits: torch.Tensor,
    ) -> None:
        self.model = model
        self.ids = ids
        self.layers = layers
        self.x0 = x0
        self.bigram = bigram
        self.last_logits = last_logits  # the model's own logits at the last position of the pass
        cfg = model.config
        self.n_layer, self.n_head = cfg.n_layer, cfg.n_head
        self.vocab = cfg.vocab_size
        self.softcap = float(cfg.softcap)
        self.readout = readout_of(model)
        self.note = approximate_note(model)
        scalars = model._scalars()
        self._backout = scalars["backout_lambda"][0] if cfg.has_smear else None
        self._scalars = {k: [float(v) for v in vs] for k, vs in scalars.items()}

    # -- the lens -------------------------------------------------------------------------------

    def _head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``GPT.logits_of``'s ops on final-normed rows, keeping the logits before softcap too."""
        model = self.model
        logits = (model._lm_head or model.lm_head)(h)
        if logits.size(-1) != self.vocab:
            logits = logits[..., : self.vocab]
        logits = logits.float()
        return logits, model.softcap * torch.tanh(logits / model.softcap)

    def _stream(self, layer: int, position: int) -> torch.Tensor:
        """(1, 1, C): what the final norm would get if the stack ended after ``layer``."""
        out = self.layers[layer].out
        assert out is not None
        x = out[None, position : position + 1]
        half = self.n_layer // 2
        if self._backout is not None and layer >= half:
            kept = self.layers[half].out
            assert kept is not None
            x = x - self._backout * kept[None, position : position + 1]
        return x

    def lens_logits(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, V) logits before and after softcap, after each block. The last layer's row is
        computed as the model computes its own (one row through the same ops), so it is its bits."""
        with torch.inference_mode():
            last = self._head(norm(self._stream(self.n_layer - 1, position)))
            if self.n_layer == 1:
                return last[0][0], last[1][0]
            rows = torch.cat([self._stream(i, position) for i in range(self.n_layer - 1)], dim=1)
            early = self._head(norm(rows))
            return torch.cat([early[0][0], last[0][0]]), torch.cat([early[1][0], last[1][0]])

    # -- attention ------------------------------------------------------------------------------

    def attention_rows(self, layer: int, position: int) -> torch.Tensor:
        """(H, position + 1) float32: the weights from ``position`` to every token up to it, from
        the q and k the model used (:func:`.recording.attention_rows`)."""
        rec = self.layers[layer]
        assert rec.q is not None and rec.k is not None
        return attention_rows(rec.q, rec.k, rec.window, position)

    # -- attribution ----------------------------------------------------------------------------

    def _weight_row(self, token: int) -> torch.Tensor | None:
        """lm_head's row for ``token`` in float64, where the weight is held as a matrix."""
        head = self.model.lm_head
        for weight in (head.weight, getattr(head.__dict__.get("forward"), "weight", None)):
            if (
                isinstance(weight, torch.Tensor)
                and weight.dim() == 2
                and weight.is_floating_point()
                and weight.size(1) == self.model.config.n_embd
            ):
                return weight[token].double()
        return None

    def _dots(self, vectors: torch.Tensor, token: int, w: torch.Tensor | None) -> torch.Tensor:
        """(n,) float64: each row of ``vectors`` (n, C) times lm_head's row for ``token``."""
        if w is not None:
            return vectors.double() @ w
        out = (self.model._lm_head or self.model.lm_head)(vectors.to(self.model.compute_dtype)[None])
        return out[0, :, token].double()

    def _value_embedding_part(self, layer: int, position: int, weights: torch.Tensor) -> torch.Tensor:
        """(C,): the share of the attention output that came through the value embeddings."""
        rec = self.layers[layer]
        attn = self.model.blocks[layer].attn
        assert rec.attn_in is not None and rec.ve is not None
        start = max(0, position - rec.window)
        H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
        x = rec.attn_in[start : position + 1]
        gate = attn.ve_scale * torch.sigmoid(attn.ve_gate(x[..., : attn.ve_channels]))  # (n, Hkv)
        gve = gate.unsqueeze(-1) * rec.ve[start : position + 1].view(-1, Hkv, D)  # (n, Hkv, D)
        w = weights[:, start:].view(Hkv, H // Hkv, -1).to(gve.dtype)  # (Hkv, G, n)
        y = torch.einsum("gqn,ngd->gqd", w, gve).reshape(1, 1, H * D)
        return (attn.proj or attn.c_proj)(y)[0, 0]

    def _head_outputs(self, layer: int, position: int) -> torch.Tensor:
        """(H, C): each head's output at ``position`` through the output projection alone."""
        rec = self.layers[layer]
        attn = self.model.blocks[layer].attn
        assert rec.y is not None
        H, D = rec.y.size(0), rec.y.size(-1)
        y = rec.y[:, position]  # (H, D)
        masked = torch.zeros(H, H, D, dtype=y.dtype, device=y.device)
        masked[torch.arange(H), torch.arange(H)] = y
        return (attn.proj or attn.c_proj)(masked.view(1, H, H * D))[0]

    def attribution(
        self, position: int, token: int
    ) -> tuple[list[tuple[str, int, float]], list[list[float]], float]:
        """(terms as (kind, layer, value), per-layer head shares, the final norm's 1/rms) of
        ``token``'s pre-softcap logit at ``position`` (docs/INSIDE.md, Attribution)."""
        cfg = self.model.config
        with torch.inference_mode():
            final = self._stream(self.n_layer - 1, position)[0, 0].double()
            scale = float(torch.rsqrt((final * final).mean() + _EPS))
            w = self._weight_row(token)
            # (kind, layer, vector, coefficient): the stream at the end is sum(coef * vector).
            comps: list[list[Any]] = []
            wte = self.model.wte.weight
            emb = norm(F.embedding(torch.tensor([[self.ids[position]]], device=wte.device), wte))[0, 0]
            comps.append(["embedding", -1, emb, 1.0])
            if cfg.has_smear and self.x0 is not None:
                comps.append(["smear", -1, self.x0[position] - emb, 1.0])
            if self.bigram is not None:
                comps.append(["bigram", -1, self.bigram[position], 0.0])
            heads_at: list[tuple[int, torch.Tensor]] = []
            lam = self._scalars
            for i, rec in enumerate(self.layers):
                if cfg.has_lambdas:
                    for c in comps:
                        c[3] *= lam["resid_lambdas"][i]
                    for c in comps:
                        if c[0] in ("embedding", "smear"):
                            c[3] += lam["x0_lambdas"][i]
                        elif c[0] == "bigram":
                            c[3] += lam["bigram_lambdas"][i]
                before = len(comps)
                assert rec.attn is not None and rec.mlp is not None
                attn_vec = rec.attn[position]
                if rec.ve is not None:
                    ve_vec = self._value_embedding_part(i, position, self.attention_rows(i, position))
                    comps.append(["attn", i, attn_vec - ve_vec, 1.0])
                    comps.append(["value_embed", i, ve_vec, 1.0])
                else:
                    comps.append(["attn", i, attn_vec, 1.0])
                attn_index = before
                comps.append(["mlp", i, rec.mlp[position], 1.0])
                if rec.engram is not None:
                    comps.append(["engram", i, rec.engram[position], 1.0])
                if rec.mix:
                    a = rec.mix
                    through_out = a[0] + (a[2] if len(a) > 2 else 0.0)
                    for c in comps[:before]:
                        c[3] *= sum(a)
                    for c in comps[before:]:
                        c[3] *= a[2] if c[0] == "engram" else through_out
                heads_at.append((attn_index, self._head_outputs(i, position)))
            vectors = torch.stack([c[2].double() for c in comps])
            dots = self._dots(vectors, token, w)
            terms = [(c[0], c[1], float(c[3] * d * scale)) for c, d in zip(comps, dots.tolist(), strict=True)]
            if self._backout is not None:
                kept = self.layers[self.n_layer // 2].out
                assert kept is not None
                d = float(self._dots(kept[position][None].double(), token, w)[0])
                terms.append(("backout", -1, -float(self._backout) * d * scale))
            heads: list[list[float]] = []
            for index, outputs in heads_at:
                coef = comps[index][3]
                dots = self._dots(outputs.double(), token, w)
                heads.append([float(coef * d * scale) for d in dots.tolist()])
        return terms, heads, scale
