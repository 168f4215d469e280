"""Fault tolerance and resilience for KempnerForge."""

from kempnerforge.resilience.elastic import (
    SLURMInfo,
    get_slurm_info,
    is_slurm_job,
    is_slurm_requeue,
    log_job_info,
    resolve_resume_path,
)
from kempnerforge.resilience.health import (
    NaNDetector,
    NaNState,
    check_gpu_health,
    check_nccl_health,
)
from kempnerforge.resilience.signal_handler import ShutdownHandler

__all__ = [
    "NaNDetector",
    "NaNState",
    "SLURMInfo",
    "ShutdownHandler",
    "check_gpu_health",
    "check_nccl_health",
    "get_slurm_info",
    "is_slurm_job",
    "is_slurm_requeue",
    "log_job_info",
    "resolve_resume_path",
]
