"""Device and precision choice: CUDA -> MPS -> CPU, then the precision for that device.

Precisions the user can ask for:

* ``auto``: nanochat's own rule (its ``COMPUTE_DTYPE``): bf16 on CUDA SM80+, fp32 everywhere
  else, MPS included;
* ``float32`` (exact): nanochat's own numbers, bit for bit on CPU;
* ``bfloat16`` / ``float16``: weights and compute in that type, except that on an x86 CPU
  ``float16`` keeps fp32 activations and packs only the weights for fbgemm (see :mod:`.gemv`);
* ``fast``: the quickest 16-bit form for the device (:func:`choose_precision` says why each);
  on a CPU, whichever 16-bit weight kernel is timed fastest there (:mod:`.kernel_tuning`);
* ``int8`` (CPUs): 8-bit weights, by whichever int8 kernel is timed fastest there.

The rules are pure functions of a :class:`Hardware` record, so they are tested against faked
GPUs (no GPU has been available to this project); :func:`hardware` is the only place that asks
torch what the machine has. torch is imported inside the functions: the command line lists
these names without paying for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from desktop.engine.errors import DeviceError

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
PRECISIONS = ("auto", *DTYPE_NAMES, "fast", "int8")
# What the user is shown for a CPU's packed kinds (fp32 activations, 8- or 16-bit weights).
PACKED_NAMES = {"fp16": "fp16 weights", "int8": "int8 weights"}
AMPERE = (8, 0)  # the first CUDA compute capability with bf16 tensor cores


@dataclass(frozen=True)
class Precision:
    compute: torch.dtype  # activations, embeddings and every weight no packed kernel holds
    gemv: str  # the matrix-vector kernels (gemv.GEMV_KINDS)
    name: str  # shown to the user: "float32", "bfloat16", "fp16 weights", "int8 weights"


@dataclass(frozen=True)
class Hardware:
    """What the precision rules depend on."""

    kind: str  # the torch device type: "cpu", "cuda" or "mps"
    sm: tuple[int, int] = (0, 0)  # CUDA compute capability
    fbgemm: bool = False  # a CPU whose torch has fbgemm's packed fp16/int8 kernels (x86 builds)
    mps_bf16: bool = False  # MPS on macOS 14+: Metal has no bf16 before Sonoma, torch refuses it

    @property
    def cuda_bf16(self) -> bool:
        return self.kind == "cuda" and self.sm >= AMPERE


def hardware(device: torch.device) -> Hardware:
    """Ask torch what ``device`` can do (the one place that does)."""
    import torch

    from desktop.engine.kernels.gemv import fbgemm_available

    if device.type == "cuda":
        return Hardware("cuda", sm=torch.cuda.get_device_capability(device))
    if device.type == "mps":
        # is_macos_or_newer raises without an MPS backend: asked only for an MPS device.
        return Hardware("mps", mps_bf16=torch.backends.mps.is_macos_or_newer(14, 0))
    return Hardware(device.type, fbgemm=device.type == "cpu" and fbgemm_available())


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


def choose_dtype(hw: Hardware, preference: str = "auto") -> torch.dtype:
    """The compute dtype for ``auto`` or a dtype name.

    ``auto`` is nanochat's rule: bf16 where CUDA has bf16 tensor cores (SM80+), fp32 elsewhere.
    On MPS that keeps fp32 although macOS 14 runs bf16: nanochat leaves bf16 on MPS an opt-in
    (its common.py) and casts bf16 checkpoints to fp32 for MPS, so "auto" gives the numbers
    nanochat gives there; ``fast`` is the 16-bit choice.
    """
    import torch

    if preference == "auto":
        return torch.bfloat16 if hw.cuda_bf16 else torch.float32
    if preference not in DTYPE_NAMES:
        raise DeviceError(f"unknown dtype {preference!r} (choose from auto, {', '.join(DTYPE_NAMES)})")
    if preference == "bfloat16" and hw.kind == "mps" and not hw.mps_bf16:
        raise DeviceError("bfloat16 on MPS needs macOS 14 or newer; pick float16 or float32")
    return getattr(torch, preference)


def fast_dtype(hw: Hardware) -> torch.dtype:
    """The 16-bit dtype ``fast`` computes in where no packed CPU kernel applies.

    bf16 first: nanochat trains in bf16, so its activations are known to fit bf16's range
    (fp32's), which nothing promises of fp16's (max 65504; the residual stream is not normed).
    Where bf16 is not native, fp16 still halves the bytes a decode step reads:

    * CUDA before SM80 (T4 is SM75, V100 SM70): torch accepts bf16 there but has no bf16 tensor
      cores, so bf16 products run emulated on the fp32 units while fp16 has tensor cores;
    * MPS before macOS 14, which has no bf16 at all.

    On MPS with macOS 14, bf16. Not measured: M1/M2 GPUs lack bf16 arithmetic (bf16 is widened
    to fp32, a shift), but decoding one token is bound by the bytes streamed, which bf16 halves
    there too. (CPUs do not use this: :func:`choose_precision` gives them 16-bit weights with fp32
    activations, by the kernel timed fastest on the machine.)
    """
    import torch

    if hw.kind == "cuda":
        return torch.bfloat16 if hw.cuda_bf16 else torch.float16
    if hw.kind == "mps" and not hw.mps_bf16:
        return torch.float16
    return torch.bfloat16


def choose_precision(hw: Hardware, preference: str = "auto") -> Precision:
    """The precision ``preference`` means on ``hw``.

    On a CPU, "fast" and "int8" name a contract, not a kernel: fp32 activations, and weights in
    whichever 16-bit (or 8-bit) form this machine multiplies fastest within the mode's error
    bound, found by timing them (:mod:`.kernel_tuning`: fbgemm where torch has it (x86), torch's
    fp16 ``F.linear`` and weight-only int8 elsewhere too). Off the CPU no packed kernel exists."""
    import torch

    if preference not in PRECISIONS:
        raise DeviceError(f"unknown precision {preference!r} (choose from {', '.join(PRECISIONS)})")
    cpu = hw.kind == "cpu"
    if preference == "int8":
        if not cpu:
            raise DeviceError(f"int8 runs on the CPU only, not on {hw.kind.upper()}; pick fast")
        return Precision(torch.float32, "int8", PACKED_NAMES["int8"])
    if cpu and (preference == "fast" or (preference == "float16" and hw.fbgemm)):
        # 16-bit weights, fp32 activations and sums: half the bytes, ~1e-7 next-token KL (bf16
        # compute costs ~1e-4). An explicit float16 without fbgemm computes in fp16 as asked.
        return Precision(torch.float32, "fp16", PACKED_NAMES["fp16"])
    dtype = fast_dtype(hw) if preference == "fast" else choose_dtype(hw, preference)
    return Precision(dtype, "exact", dtype_name(dtype))


def pick_dtype(device: torch.device, preference: str = "auto") -> torch.dtype:
    return choose_dtype(hardware(device), preference)


def pick_precision(device: torch.device, preference: str = "auto") -> Precision:
    return choose_precision(hardware(device), preference)


def describe_device(device: torch.device) -> str:
    import torch

    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"CUDA: {torch.cuda.get_device_name(device)} (SM {major}.{minor})"
    if device.type == "mps":
        return "MPS (Apple GPU)"
    return f"CPU · {torch.get_num_threads()} threads"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
