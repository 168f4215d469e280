"""KempnerForge: PyTorch-native framework for distributed training of foundation models."""

__version__ = "0.1.0"
