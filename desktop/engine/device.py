"""Device and dtype choice: CUDA -> MPS -> CPU, bf16 on CUDA SM80+ and fp32 elsewhere (spec §5.3)."""

from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(preference: str = "auto") -> torch.device:
    if preference not in DEVICES:
        raise ValueError(f"unknown device {preference!r} (choose from {', '.join(DEVICES)})")
    if preference == "cuda" and not torch.cuda.is_available():
        raise ValueError("CUDA was requested but torch sees no CUDA device")
    if preference == "mps" and not torch.backends.mps.is_available():
        raise ValueError("MPS was requested but this torch build or machine has no MPS")
    if preference != "auto":
        return torch.device(preference)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(device: torch.device, preference: str = "auto") -> torch.dtype:
    if preference != "auto":
        if preference not in DTYPES:
            raise ValueError(f"unknown dtype {preference!r} (choose from auto, {', '.join(DTYPES)})")
        return DTYPES[preference]
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0):
        return torch.bfloat16
    return torch.float32


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"CUDA: {torch.cuda.get_device_name(device)}"
    if device.type == "mps":
        return "MPS (Apple GPU)"
    return f"CPU · {torch.get_num_threads()} threads"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
