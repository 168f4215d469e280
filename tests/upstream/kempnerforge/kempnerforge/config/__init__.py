"""Configuration system for KempnerForge."""

from kempnerforge.config.checkpoint import CheckpointConfig
from kempnerforge.config.data import DataConfig
from kempnerforge.config.distributed import DistributedConfig
from kempnerforge.config.eval import EvalConfig
from kempnerforge.config.job import JobConfig
from kempnerforge.config.loader import load_config
from kempnerforge.config.metrics import MetricsConfig
from kempnerforge.config.model import ModelConfig
from kempnerforge.config.optimizer import OptimizerConfig
from kempnerforge.config.profiling import ProfilingConfig
from kempnerforge.config.registry import registry
from kempnerforge.config.scheduler import SchedulerConfig
from kempnerforge.config.training import TrainConfig

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "DistributedConfig",
    "EvalConfig",
    "JobConfig",
    "MetricsConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ProfilingConfig",
    "SchedulerConfig",
    "TrainConfig",
    "load_config",
    "registry",
]
