"""fbgemm's dynamic int8 and fp16 products as torch operators that ``torch.compile`` can trace.

fbgemm keeps a packed weight in a TorchScript object, which dynamo cannot pass to an operator
(it stops the trace: "Failed to convert args/kwargs to proxy"). So a compiled step (decode/
compiled_step.py) whose tuner chose fbgemm for some shape ran eagerly ("could not compile
here"). These operators take the product's handle (an int, a constant of the compiled code)
instead of the object; the compiled code calls fbgemm through them, the same kernel and the
same numbers as the eager step. The handle table holds the products weakly: closing a model
frees its packed weights.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

_products: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_handles = itertools.count()


def register(product: Any) -> int:
    """A handle for ``product`` (an object with a ``_packed`` fbgemm weight) while it lives."""
    handle = next(_handles)
    _products[handle] = product
    return handle


@torch.library.custom_op("nanoscope_fbgemm::int8_linear", mutates_args=())
def int8_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    """``quantized.linear_dynamic`` (int8 weights, activations quantised per call) of ``x``."""
    return torch.ops.quantized.linear_dynamic(x, _products[handle]._packed)


@torch.library.custom_op("nanoscope_fbgemm::fp16_linear", mutates_args=())
def fp16_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    """``quantized.linear_dynamic_fp16`` (fp16 weights, fp32 in and out) of ``x``."""
    return torch.ops.quantized.linear_dynamic_fp16(x, _products[handle]._packed)


@int8_linear.register_fake
def _int8_shape(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


@fp16_linear.register_fake
def _fp16_shape(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)
