"""fbgemm's int8 and fp16 products inside compiled code (kernels/fbgemm_ops.py): dynamo traces a
step whose tuner chose them, through a handle, and the compiled code computes the eager numbers;
a product closed frees its packed weight."""

from __future__ import annotations

import gc

import pytest
import torch

from desktop.engine.kernels import fbgemm_ops, gemv

pytestmark = pytest.mark.skipif(not gemv.fbgemm_available(), reason="this torch has no fbgemm")
PRODUCTS = [gemv.Int8Linear, gemv.PackedFp16Linear]


@pytest.mark.parametrize("product", PRODUCTS, ids=["int8", "fp16"])
def test_a_compiled_step_calls_fbgemm_and_gets_its_numbers(product):
    g = torch.Generator().manual_seed(0)
    first, second = product(torch.randn(96, 64, generator=g)), product(torch.randn(64, 96, generator=g))

    def step(x: torch.Tensor) -> torch.Tensor:  # two products with work between them, as a block
        return second(torch.relu(first(x)).square()) + x

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")  # fullgraph: no eager fallback
    for rows in (1, 3):
        x = torch.randn(1, rows, 64, generator=g)
        with torch.inference_mode():
            assert torch.equal(compiled(x), step(x))


def test_a_product_let_go_frees_its_packed_weight():
    product = gemv.Int8Linear(torch.randn(32, 16))
    handle = product._handle
    assert fbgemm_ops._products[handle] is product
    del product
    gc.collect()
    assert handle not in fbgemm_ops._products
