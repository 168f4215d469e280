"""Performance profiling for KempnerForge."""

from kempnerforge.profiling.cuda_timer import CUDATimer, CUDATimerCollection
from kempnerforge.profiling.profiler import build_profiler, print_profiler_summary

__all__ = ["CUDATimer", "CUDATimerCollection", "build_profiler", "print_profiler_summary"]
