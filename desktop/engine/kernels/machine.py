"""What a kernel's speed and a compiled kernel's code depend on: the CPU, its vector unit, torch."""

from __future__ import annotations

import platform
import subprocess
import sys
from functools import cache

import torch

__all__ = ["cpu_name", "machine_id"]


def cpu_name() -> str:
    """The CPU's model as the OS names it (with family and model numbers on Linux, where a VM may
    show only "AMD EPYC" for several generations)."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            return out.stdout.strip() or platform.machine()
        except (OSError, subprocess.SubprocessError):
            return platform.machine()
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block names the model
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
    except OSError:
        return platform.processor() or platform.machine()
    name = info.get("model name") or info.get("Hardware") or platform.machine()
    if "cpu family" in info:
        name += f" (family {info['cpu family']} model {info.get('model', '?')})"
    return name


@cache
def machine_id() -> str:
    """What the timings depend on besides the thread count: the CPU, the vector unit torch
    dispatches to, and torch's version (its kernels change between releases)."""
    return f"{cpu_name()} · {torch.backends.cpu.get_cpu_capability()} · torch {torch.__version__}"
