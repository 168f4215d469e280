"""int8 and fast mode for every local family: a Hugging Face folder written by transformers and a
KempnerForge run written by KempnerForge's own code load with 8- or 16-bit weights (fp32
activations), compute what fp32 computes within the mode's bound, free their fp32 matrices, say
their precision, and refuse a self-draft (made from fp32 weights they no longer hold) in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.backend_helpers import reply_ids
from support.golden import GOLDEN

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import DeviceError
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

FOLDERS = [GOLDEN / "transformers" / "llama-bf16", GOLDEN / "kempnerforge" / "dense-gqa-qknorm" / "run"]
NAMES = {"int8": "int8 weights", "fast": "fp16 weights"}


def logits(backend, ids: list[int]) -> torch.Tensor:
    model = backend.model
    with torch.inference_mode():
        return model(torch.tensor([ids]), None).float()[0]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.parent.name if p.name == "run" else p.name)
@pytest.mark.parametrize("mode", ["int8", "fast"])
def test_a_packed_mode_loads_computes_and_says_so(folder: Path, mode: str):
    exact = open_backend(folder, LoadOptions(device="cpu", dtype="float32"))
    packed = open_backend(folder, LoadOptions(device="cpu", dtype=mode))
    try:
        assert packed.info().precision == NAMES[mode]
        assert packed.model.kernel_kind == {"int8": "int8", "fast": "fp16"}[mode]
        # Every matrix went through the mode's timing (where fp32 is fastest, a tiny matrix keeps
        # it: a candidate of every lossy mode), and a step reads no more bytes
        # of matrices than fp32's.
        choices = packed.model.kernel_choices()
        assert choices and all(c.mode == packed.model.kernel_kind for c in choices), choices
        products = packed.model._products.values()
        assert sum(p.weight_nbytes for p in products) <= sum(
            p.weight_nbytes for p in exact.model._products.values()
        )
        ids = packed.render("Once upon a time", None).ids
        want, got = logits(exact, list(ids)), logits(packed, list(ids))
        kl = torch.nn.functional.kl_div(
            got.log_softmax(-1), want.log_softmax(-1), log_target=True, reduction="none"
        )
        assert kl.sum(-1).mean().item() < {"int8": 2e-2, "fast": 1e-4}[mode]
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        assert len(reply_ids(packed, ids, greedy)) >= 1
        with pytest.raises(DeviceError, match=r"loaded with \w+ weights: load it in float32"):
            packed.draft("int8")
    finally:
        exact.close()
        packed.close()
