"""Model architectures for KempnerForge."""

from kempnerforge.model.transformer import Transformer, TransformerBlock

__all__ = ["Transformer", "TransformerBlock"]
