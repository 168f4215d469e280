"""What bounds an Inside pass (docs/INSIDE.md, Cost): it gives way before any block when asked,
leaving the model as it was, and it refuses in one line, before running, to keep more of the
free memory than its share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.golden import GOLDEN

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.inside import PassYielded, inspect_all, kept_bytes
from desktop.engine.registry import open_backend

DEMO = Path(__file__).resolve().parents[3] / "resources" / "demo" / "chatsft_checkpoints"
TARGETS = {
    "nanochat": next(p for p in DEMO.iterdir() if p.is_dir()),
    "hf": sorted(p.parent for p in (GOLDEN / "transformers").glob("*/golden.json"))[0],
}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def backend(request):
    opened = open_backend(TARGETS[request.param], LoadOptions(device="cpu", dtype="float32"))
    yield opened
    opened.close()


def ids_for(backend, n: int) -> list[int]:
    vocab = backend.info().vocab_size
    return [(13 * i + 1) % vocab for i in range(n)]


def own_logits(backend, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return backend.model(torch.tensor([ids]), None, last_only=True)[0, -1].clone()


@pytest.mark.parametrize("after", [0, 1])
def test_a_pass_asked_to_stop_gives_way_before_the_next_block(backend, after):
    ids = ids_for(backend, 40)
    before = own_logits(backend, ids)
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > after

    with pytest.raises(PassYielded, match="gave way"):
        inspect_all(backend, ids, stop)
    assert len(asked) == after + 1  # asked before each block, and no block ran after a True
    assert torch.equal(own_logits(backend, ids), before)  # the model's own methods are back
    assert inspect_all(backend, ids, lambda: False).at(10).produced == ids[11]


def test_a_pass_that_would_keep_too_much_is_refused_in_one_line(backend):
    ids = ids_for(backend, 40)
    with pytest.raises(NanoscopeError) as refused:
        inspect_all(backend, ids, memory_share=1e-12)
    line = str(refused.value)
    assert "40 tokens" in line and "free" in line and "\n" not in line


def test_what_a_pass_keeps_grows_with_the_sequence(backend):
    one = kept_bytes(backend.model, 100)
    assert one > 0 and kept_bytes(backend.model, 1000) == 10 * one
