"""Device and precision choice: CUDA -> MPS -> CPU; "auto" precision is bf16 on CUDA SM80+ and fp32
elsewhere, as nanochat runs (docs/ARCHITECTURE.md, Eras: Loading).

Precisions the user can ask for:

* ``float32`` (exact): nanochat's own numbers, bit for bit on CPU;
* ``bfloat16`` / ``float16``: weights and compute in that type, except that on an x86 CPU
  ``float16`` keeps fp32 activations and packs only the weights for fbgemm (see :mod:`.gemv`);
* ``fast``: the quickest 16-bit form for the device: bf16 on CUDA and MPS, fp16-packed weights on
  x86 CPUs, bf16 elsewhere;
* ``int8`` (x86 CPUs): int8 weights, activations quantised per product.

torch is imported inside the functions: the command line lists these names without paying for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import DeviceError

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
PRECISIONS = ("auto", *DTYPE_NAMES, "fast", "int8")


@dataclass(frozen=True)
class Precision:
    compute: torch.dtype  # activations, embeddings and every weight no packed kernel holds
    gemv: str  # the matrix-vector kernels (gemv.GEMV_KINDS)
    name: str  # shown to the user: "float32", "bfloat16", "fp16 weights", "int8 weights"


def pick_device(preference: str = "auto") -> torch.device:
    import torch

    if preference not in DEVICES:
        raise DeviceError(f"unknown device {preference!r} (choose from {', '.join(DEVICES)})")
    if preference == "cuda" and not torch.cuda.is_available():
        raise DeviceError("CUDA was requested but torch sees no CUDA device")
    if preference == "mps" and not torch.backends.mps.is_available():
        raise DeviceError("MPS was requested but this torch build or machine has no MPS")
    if preference != "auto":
        return torch.device(preference)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(device: torch.device, preference: str = "auto") -> torch.dtype:
    import torch

    if preference != "auto":
        if preference not in DTYPE_NAMES:
            raise DeviceError(f"unknown dtype {preference!r} (choose from auto, {', '.join(DTYPE_NAMES)})")
        return getattr(torch, preference)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0):
        return torch.bfloat16
    return torch.float32


def pick_precision(device: torch.device, preference: str = "auto") -> Precision:
    import torch

    from .gemv import fbgemm_available

    if preference not in PRECISIONS:
        raise DeviceError(f"unknown precision {preference!r} (choose from {', '.join(PRECISIONS)})")
    cpu_packed = device.type == "cpu" and fbgemm_available()
    if preference == "int8":
        if not cpu_packed:
            raise DeviceError("int8 runs on the CPU of x86 machines only (torch's fbgemm kernels)")
        return Precision(torch.float32, "int8", "int8 weights")
    if preference == "fast":
        preference = "float16" if cpu_packed else "bfloat16"
    if preference == "float16" and cpu_packed:
        return Precision(torch.float32, "fp16", "fp16 weights")
    dtype = pick_dtype(device, preference)
    return Precision(dtype, "exact", dtype_name(dtype))


def describe_device(device: torch.device) -> str:
    import torch

    if device.type == "cuda":
        return f"CUDA: {torch.cuda.get_device_name(device)}"
    if device.type == "mps":
        return "MPS (Apple GPU)"
    return f"CPU · {torch.get_num_threads()} threads"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
