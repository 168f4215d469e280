"""Nanoscope: a desktop app to chat with and compare nanochat checkpoints."""

__version__ = "0.1.0"
