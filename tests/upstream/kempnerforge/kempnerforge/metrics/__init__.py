"""Metrics, MFU computation, memory tracking, and logging for KempnerForge."""

from kempnerforge.metrics.logger import format_metrics, get_logger
from kempnerforge.metrics.memory import (
    DeviceMemoryMonitor,
    format_memory_stats,
    get_memory_stats,
    get_memory_utilization,
    reset_peak_memory,
)
from kempnerforge.metrics.mfu import (
    compute_mfu,
    estimate_model_flops_per_token,
    get_gpu_peak_tflops,
)
from kempnerforge.metrics.tracker import MetricsTracker, StepMetrics

__all__ = [
    "DeviceMemoryMonitor",
    "MetricsTracker",
    "StepMetrics",
    "compute_mfu",
    "estimate_model_flops_per_token",
    "format_memory_stats",
    "format_metrics",
    "get_gpu_peak_tflops",
    "get_logger",
    "get_memory_stats",
    "get_memory_utilization",
    "reset_peak_memory",
]
