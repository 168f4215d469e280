"""How much memory the machine has free, whether a set of checkpoints fits in it, and memory the
engine takes only as it is written (:func:`zeros_on_demand`) or gives back (:func:`release_freed_memory`).

The Compare view loads one model per pane, so a user picking four 1.9B checkpoints should hear
*before* loading that they need ~30 GB. Estimates come from :class:`CheckpointSummary` (meta and
tensor shapes, no weights). Free RAM comes from psutil (no torch import); GPU memory is asked of
torch only when torch is already imported (the worker threads import it), because importing it
here would cost the GUI thread seconds.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import mmap
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    import torch

    from desktop.engine.discovery import CheckpointSummary

logger = logging.getLogger(__name__)

# Bytes per parameter by precision. On the CPU "float16", "fast" and "int8" pack weights from
# the fp32 file (see engine.device), so loading passes through 4 bytes a parameter.
_GPU_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fast": 2}
_CPU_BYTES = {"float32": 4, "bfloat16": 2}


def available_ram() -> int | None:
    """Bytes of RAM a new allocation can get without swapping, or None when the OS will not say.

    psutil's ``available`` is the OS's own estimate on every platform (Linux ``MemAvailable``,
    macOS free + inactive pages, Windows available physical memory), never the total installed.
    """
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, psutil.Error) as error:
        logger.warning("Cannot read the free memory, so the memory check is off: %s", error)
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (macOS and musl return freed memory differently)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Give the pages of freed allocations back to the OS.

    A prefill's activations (tens of MB at a thousand tokens) come from the C heap, and glibc
    keeps freed heap memory mapped for reuse, so without this the process stays that much bigger
    after every long prompt. Costs about a millisecond; call it when a request ends."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# Below this, zeros come from torch.zeros: a mapping of its own costs a system call and an entry in
# the process's memory map, which a few kilobytes are not worth.
ON_DEMAND_FROM = 1 << 20


def zeros_on_demand(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor whose memory is taken as it is written.

    ``torch.zeros`` writes every byte at once, so a KV cache made for a whole reply was resident
    from the start: streaming 2,048 positions after a 1,024-token prompt held the 1,024 positions
    the reply had not yet reached while the prompt's activations were at their peak, 205 MB at
    depth 20 (docs/PERFORMANCE.md, Loading and memory). On the CPU the tensor lives in an
    anonymous private mapping instead, which every OS fills with zeros a page at a time, on
    first touch; the values are the same zeros. Elsewhere (a GPU's own memory), and for small
    tensors, it is ``torch.zeros``.

    Always a normal tensor, never an inference tensor, wherever it is made: a cache made or
    grown inside ``torch.inference_mode`` is written outside it too (an inference tensor refuses
    that), and a compiled draft's code is guarded on the kind of every cache tensor it reads
    (engine/decode/compiled_draft.py)."""
    import torch

    with torch.inference_mode(False):
        return _zeros_on_demand(shape, dtype, device)


def _zeros_on_demand(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    import torch

    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    # Every path gives a view of a flat tensor, so that a cache's tensors look alike whatever
    # its size (a compiled draft is guarded on their bases' shapes too).
    if torch.device(device).type != "cpu" or nbytes < ON_DEMAND_FROM:
        return torch.zeros(count, dtype=dtype, device=device).view(tuple(shape))
    # Private: a child process started later (a fork) must not share the cache's pages.
    private = {} if sys.platform == "win32" else {"flags": mmap.MAP_PRIVATE}
    try:
        pages = mmap.mmap(-1, nbytes, **private)
    except (OSError, ValueError) as error:  # the OS refused the mapping: the plain allocation
        logger.info("no on-demand mapping of %d bytes (%s); zeros written up front", nbytes, error)
        return torch.zeros(count, dtype=dtype, device=device).view(tuple(shape))
    # The tensor holds a reference to the mapping, which is unmapped when the last view goes.
    return torch.frombuffer(pages, dtype=dtype, count=count).view(tuple(shape))


def available_vram() -> int | None:
    """Free bytes on the current CUDA device, or None (no torch imported yet, or no CUDA)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    except (RuntimeError, AttributeError):
        return None


def resolve_device(device: str) -> str:
    """The device to measure: "auto" is "cuda" when torch (already imported) sees CUDA, else "cpu".

    MPS shares the machine's RAM, so it is measured as RAM either way.
    """
    if device != "auto":
        return device.split(":")[0]
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return "cuda"
    except (RuntimeError, AttributeError):
        pass
    return "cpu"


def bytes_per_param(device: str, dtype: str = "auto") -> int:
    """The compute precision's size: "auto" is bf16 on CUDA and float32 elsewhere (as the loader picks)."""
    on_gpu = resolve_device(device) == "cuda"
    if dtype == "auto":
        return 2 if on_gpu else 4
    return (_GPU_BYTES if on_gpu else _CPU_BYTES).get(dtype, 4)


def human(n: float) -> str:
    """Binary units with one decimal: 1_288_490_188 → "1.2 GB"."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def fits(
    summaries: Iterable[CheckpointSummary],
    device: str = "auto",
    dtype: str = "auto",
    loaded: Iterable[CheckpointSummary] = (),
    drafts: Iterable[CheckpointSummary] = (),
) -> tuple[bool, int, int, str]:
    """(ok, needed bytes, available bytes, message) for holding every summary at once on ``device``.

    ``loaded`` are models already in memory (they count in ``summaries`` too): their estimate is
    added back to the free memory, so a set that is already loaded does not warn about itself.
    ``drafts``: copies of a checkpoint that other panes load as their draft, needed on top.
    Summaries that could not be read are left out (their pane shows its own error). When the
    free memory cannot be measured the answer is ok, with available 0 and an empty message.
    """
    usable = [s for s in summaries if not s.error]
    copies = [s for s in drafts if not s.error]
    dev = resolve_device(device)
    per_param = bytes_per_param(dev, dtype)
    needed = sum(s.memory_estimate(per_param) for s in (*usable, *copies))
    measured = available_vram() if dev == "cuda" else available_ram()
    if measured is None:
        return True, needed, 0, ""
    available = measured + sum(s.memory_estimate(per_param) for s in loaded if not s.error)
    if needed <= available:
        return True, needed, available, ""
    where = "GPU memory" if dev == "cuda" else "RAM"
    precision = "bfloat16" if per_param == 2 else "float32"
    count = len(usable)
    subject = f"These {count} checkpoints" if count > 1 else "This checkpoint"
    if copies:
        named = "a draft copy of one" if len(copies) == 1 else f"{len(copies)} draft copies of one"
        subject = f"{subject} and {named} need"
    else:
        subject += " need" if count > 1 else " needs"
    advice = ("Turn Speculative off, unload" if copies else "Unload") + " a pane or pick smaller checkpoints"
    advice += ", or switch to bf16." if per_param == 4 else "."
    message = (
        f"{subject} about {human(needed)} of {where} as {precision}; {human(available)} is free. {advice}"
    )
    return False, needed, available, message
