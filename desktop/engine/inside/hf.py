"""One hooked forward pass of a Hugging Face model (:class:`~desktop.engine.hf.model.HFCausalLM`:
Llama-style and transformers' NanoChat), and what it gives at any position: the logit lens,
attention rows and direct logit attribution (docs/INSIDE.md).

As for nanochat (:mod:`desktop.engine.inside.nanochat`), the pass is the model's own call over
the ids, nothing copied or redone: for its duration the model's ``_block`` (one decoder layer),
``_attention``, ``_attend`` (its attention function, given q and k as the layer used them) and
``_mlp`` are wrapped, as instance attributes, to record what they were given and returned, and
put back when the pass ends, even on error.

:class:`StackPass` is the part every pre-norm stack of identical layers shares (this family and
KempnerForge's, :mod:`desktop.engine.inside.kempnerforge`): the stream is the embedding plus each
layer's attention and MLP outputs, read out through a final norm and an output head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from desktop.engine.hf.model import FULL_WINDOW, HFCausalLM
from desktop.engine.inside.recording import Patches, approximate_note, attention_rows
from desktop.engine.inside.yielding import Stop, check


@dataclass
class Layer:
    """What one layer recorded over the pass."""

    out: torch.Tensor | None = None  # (T, C): the stream the layer returned
    attn: torch.Tensor | None = None  # (T, C): attention's output, after the projection
    mlp: torch.Tensor | None = None  # (T, C)
    q: torch.Tensor | None = None  # (H, T, D), as attention used it
    k: torch.Tensor | None = None  # (Hkv, T, D), before GQA's sharing
    y: torch.Tensor | None = None  # (H, T, D): each head's output before the projection
    window: int = FULL_WINDOW


def run_recorded(
    model: Any, ids: Sequence[int], n_layer: int, stop: Stop | None = None
) -> tuple[list[Layer], torch.Tensor, torch.Tensor]:
    """The model's own ``model(ids, None, last_only=True)`` with its ``_block``, ``_attention``,
    ``_attend`` and ``_mlp`` recorded: (the layers, the stream the first layer got, the model's
    logits at the last position). Those four methods take the layer index or its weights as
    their arguments, so the layer a call belongs to is the one ``_block`` is running."""
    layers = [Layer() for _ in range(n_layer)]
    current: list[int] = [0]
    got: dict[str, torch.Tensor] = {}
    patches = Patches()

    block, attention, attend, mlp = model._block, model._attention, model._attend, model._mlp

    def block_wrapped(h, layer, index, *args):  # type: ignore[no-untyped-def]
        check(stop)
        if index == 0:
            got["x0"] = h[0]
        current[0] = index
        out = block(h, layer, index, *args)
        layers[index].out = out[0]
        return out

    def attention_wrapped(*args):  # type: ignore[no-untyped-def]
        out = attention(*args)
        layers[current[0]].attn = out[0]
        return out

    def attend_wrapped(q, k, v, *args):  # type: ignore[no-untyped-def]
        y = attend(q, k, v, *args)
        rec = layers[current[0]]
        rec.q, rec.k, rec.y = q[0], k[0], y[0]
        return y

    def mlp_wrapped(*args):  # type: ignore[no-untyped-def]
        out = mlp(*args)
        layers[current[0]].mlp = out[0]
        return out

    patches.set(model, "_block", block_wrapped)
    patches.set(model, "_attention", attention_wrapped)
    patches.set(model, "_attend", attend_wrapped)
    patches.set(model, "_mlp", mlp_wrapped)
    idx = torch.tensor([list(ids)], dtype=torch.long, device=model.device)
    try:
        with torch.inference_mode():
            logits = model(idx, None, last_only=True, chunk=0)
    finally:
        patches.restore()
    return layers, got["x0"], logits[0, -1]


class StackPass:
    """A recorded pass of a pre-norm stack (embedding, then layers each adding attention's and
    the MLP's outputs to the stream, then a final norm and an output head) and a position's
    numbers from it. A family gives its final norm, head and softcap (the methods below)."""

    softcap = 0.0
    readout = ""

    def __init__(
        self,
        model: Any,
        ids: tuple[int, ...],
        layers: list[Layer],
        x0: torch.Tensor,
        last_logits: torch.Tensor,
    ) -> None:
        self.model = model
        self.ids = ids
        self.layers = layers
        self.x0 = x0  # (T, C): the stream the first layer got
        self.last_logits = last_logits  # the model's own logits at the last position of the pass
        self.n_layer = len(layers)
        q = layers[0].q
        assert q is not None
        self.n_head = q.size(0)
        self.note = approximate_note(model)

    # -- what a family gives ----------------------------------------------------------------------

    def final_norm(self, rows: torch.Tensor) -> torch.Tensor:
        """The model's own final norm of ``rows`` (1, n, C)."""
        raise NotImplementedError

    def head(self) -> torch.Tensor:
        """The output head's matrix (vocab, C), the key its product is looked up by."""
        raise NotImplementedError

    def norm_parts(self) -> tuple[torch.Tensor | None, torch.Tensor | None, float, bool]:
        """The final norm's (weight, bias, eps, centred: a LayerNorm rather than an RMSNorm)."""
        raise NotImplementedError

    def out_proj(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s attention output projection (C, H*D)."""
        raise NotImplementedError

    def use_own_last_row(self) -> bool:
        """Whether the last layer's lens at the pass's last position is the logits the model
        returned (its head ran over more rows than one: a product's rows may round by count)."""
        return False

    # -- the lens -------------------------------------------------------------------------------

    def _readout(self, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head on final-normed rows, as the model's call runs it: (before softcap, after)."""
        logits = self.model._linear(normed, self.head())
        if self.softcap:
            return logits.float(), (torch.tanh(logits / self.softcap) * self.softcap).float()
        logits = logits.float()
        return logits, logits

    def _stream(self, layer: int, position: int) -> torch.Tensor:
        out = self.layers[layer].out
        assert out is not None
        return out[None, position : position + 1]

    def lens_logits(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, V) logits before and after softcap, after each layer. The last layer's row is
        the model's own computation of that row, so it is its bits."""
        with torch.inference_mode():
            if self.use_own_last_row() and position == len(self.ids) - 1:
                own = self.last_logits.float()[None]  # no softcap in the families that use it
                last = (own, own)
            else:
                last_raw, last_capped = self._readout(
                    self.final_norm(self._stream(self.n_layer - 1, position))
                )
                last = (last_raw[0], last_capped[0])
            if self.n_layer == 1:
                return last
            rows = torch.cat([self._stream(i, position) for i in range(self.n_layer - 1)], dim=1)
            early = self._readout(self.final_norm(rows))
            return torch.cat([early[0][0], last[0]]), torch.cat([early[1][0], last[1]])

    # -- attention ------------------------------------------------------------------------------

    def attention_rows(self, layer: int, position: int) -> torch.Tensor:
        """(H, position + 1) float32: the weights from ``position`` to every token up to it, from
        the q and k the model used (:func:`.recording.attention_rows`)."""
        rec = self.layers[layer]
        assert rec.q is not None and rec.k is not None
        return attention_rows(rec.q, rec.k, rec.window, position)

    # -- attribution ----------------------------------------------------------------------------

    def _dots(self, vectors: torch.Tensor, token: int) -> torch.Tensor:
        """(n,) float64: each row of ``vectors`` (n, C) through the final norm's linear part (its
        weight; a LayerNorm's centring) at a scale of 1, times the head's row for ``token``."""
        weight, _bias, _eps, centred = self.norm_parts()
        v = vectors.double()
        if centred:
            v = v - v.mean(-1, keepdim=True)
        if weight is not None:
            v = v * weight.double()
        head = self.head()
        if head.dim() == 2 and head.numel() > 0:  # fast and int8 modes may hold it in their own form
            return v @ head[token].double()
        out = self.model._linear(v.to(self.model.compute_dtype)[None], head)
        return out[0, :, token].double()

    def _head_outputs(self, layer: int, position: int) -> torch.Tensor:
        """(H, C): each head's output at ``position`` through the output projection alone."""
        rec = self.layers[layer]
        assert rec.y is not None
        H, D = rec.y.size(0), rec.y.size(-1)
        y = rec.y[:, position]
        masked = torch.zeros(H, H, D, dtype=y.dtype, device=y.device)
        masked[torch.arange(H), torch.arange(H)] = y
        return self.model._linear(masked.view(1, H, H * D), self.out_proj(layer))[0]

    def attribution(
        self, position: int, token: int
    ) -> tuple[list[tuple[str, int, float]], list[list[float]], float]:
        """(terms as (kind, layer, value), per-layer head shares, the final norm's scale) of
        ``token``'s pre-softcap logit at ``position`` (docs/INSIDE.md, Attribution)."""
        _weight, bias, eps, centred = self.norm_parts()
        with torch.inference_mode():
            final = self._stream(self.n_layer - 1, position)[0, 0].double()
            if centred:
                final = final - final.mean()
            scale = float(torch.rsqrt((final * final).mean() + eps))
            vectors: list[torch.Tensor] = [self.x0[position]]
            names: list[tuple[str, int]] = [("embedding", -1)]
            for i, rec in enumerate(self.layers):
                assert rec.attn is not None and rec.mlp is not None
                vectors += [rec.attn[position], rec.mlp[position]]
                names += [("attn", i), ("mlp", i)]
            dots = self._dots(torch.stack(vectors), token)
            terms = [
                (kind, layer, float(d) * scale) for (kind, layer), d in zip(names, dots.tolist(), strict=True)
            ]
            if bias is not None:  # a LayerNorm's bias reaches the head as it is
                head = self.head()
                if head.dim() == 2 and head.numel() > 0:
                    b = float(bias.double() @ head[token].double())
                else:
                    b = float(
                        self.model._linear(bias.to(self.model.compute_dtype)[None, None], head)[0, 0, token]
                    )
                terms.append(("final_norm_bias", -1, b))
            heads = [
                [float(d) * scale for d in self._dots(self._head_outputs(i, position), token).tolist()]
                for i in range(self.n_layer)
            ]
        return terms, heads, scale


class HFPass(StackPass):
    """A recorded pass of a Hugging Face model."""

    def __init__(self, model: HFCausalLM, *args: Any) -> None:
        super().__init__(model, *args)
        cfg = model.config
        self.softcap = float(cfg.softcap or 0.0)
        parts = [
            "the final RMSNorm" + (" (with its weight)" if model.final_norm is not None else ""),
            "lm_head",
        ]
        parts += [f"softcap {self.softcap:g}"] if self.softcap else []
        self.readout = (
            f"the residual stream each layer returns, read out through {', '.join(parts[:-1])} and "
            f"{parts[-1]} (exactly the model's own readout after the last layer)"
        )

    def final_norm(self, rows: torch.Tensor) -> torch.Tensor:
        return self.model._rms(rows, self.model.final_norm)

    def head(self) -> torch.Tensor:
        return self.model.head

    def norm_parts(self) -> tuple[torch.Tensor | None, torch.Tensor | None, float, bool]:
        return self.model.final_norm, None, float(self.model.config.rms_norm_eps), False

    def out_proj(self, layer: int) -> torch.Tensor:
        return self.model.layers[layer].o


def record(model: HFCausalLM, ids: Sequence[int], stop: Stop | None = None) -> HFPass:
    """One forward pass of ``model`` over ``ids`` with every layer's parts recorded."""
    layers, x0, last = run_recorded(model, ids, model.config.n_layer, stop)
    return HFPass(model, tuple(ids), layers, x0, last)
