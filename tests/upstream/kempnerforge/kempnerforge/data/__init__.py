"""Data pipeline for KempnerForge.

Public API:
  - MemoryMappedDataset / HuggingFaceDataset: Dataset implementations
  - DistributedSampler: Rank-aware, deterministic sampling
  - StatefulDataLoader: Checkpoint-resumable data loading
"""

from kempnerforge.data.dataloader import StatefulDataLoader
from kempnerforge.data.dataset import HuggingFaceDataset, MemoryMappedDataset
from kempnerforge.data.sampler import DistributedSampler

__all__ = [
    "DistributedSampler",
    "HuggingFaceDataset",
    "MemoryMappedDataset",
    "StatefulDataLoader",
]
