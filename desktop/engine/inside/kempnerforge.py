"""One hooked forward pass of a KempnerForge model (:class:`~desktop.engine.kempnerforge.model.
KFTransformer`, its dense ``Transformer``), and what it gives at any position (docs/INSIDE.md).

The pass is the model's own call, recorded as the Hugging Face family's is
(:func:`desktop.engine.inside.hf.run_recorded`: its ``_block``, ``_attention``, ``_attend`` and
``_mlp`` wrapped for one call). KempnerForge has no softcap; its final norm is an RMSNorm or a
LayerNorm (whose centring and bias the attribution follows). Its head computes the logits of
every position of a prefill, so the last layer's lens at the pass's last position is the row it
returned (a product's rows may round otherwise by their count); other rows go through the same
norm and head one layer's stream at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from desktop.engine.inside.hf import StackPass, run_recorded
from desktop.engine.inside.yielding import Stop
from desktop.engine.kempnerforge.model import KFTransformer


class KFPass(StackPass):
    """A recorded pass of a KempnerForge model."""

    def __init__(self, model: KFTransformer, *args: Any) -> None:
        super().__init__(model, *args)
        norm = "RMSNorm" if model.config.norm_type == "rmsnorm" else "LayerNorm"
        self.readout = (
            f"the residual stream each block returns, read out through the final {norm} and the "
            "output head, no softcap (exactly the model's own readout after the last block)"
        )

    def final_norm(self, rows: torch.Tensor) -> torch.Tensor:
        return self.model._norm(rows, self.model.norm)

    def head(self) -> torch.Tensor:
        return self.model.output

    def norm_parts(self) -> tuple[torch.Tensor | None, torch.Tensor | None, float, bool]:
        n = self.model.norm
        layer_norm = self.model.config.norm_type != "rmsnorm"
        return n.weight, n.bias if layer_norm else None, float(self.model.config.norm_eps), layer_norm

    def out_proj(self, layer: int) -> torch.Tensor:
        return self.model.blocks[layer].o

    def use_own_last_row(self) -> bool:
        return True


def record(model: KFTransformer, ids: Sequence[int], stop: Stop | None = None) -> KFPass:
    """One forward pass of ``model`` over ``ids`` with every block's parts recorded."""
    layers, x0, last = run_recorded(model, ids, model.config.n_layers, stop)
    return KFPass(model, tuple(ids), layers, x0, last)
