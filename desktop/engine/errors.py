"""User-facing error types. ``str(err)`` is always one readable line naming the file and the problem."""

from __future__ import annotations


class NanoscopeError(Exception):
    """Base class: a problem we can explain to the user (no traceback needed)."""


class CheckpointError(NanoscopeError):
    """A checkpoint is missing, corrupt, inconsistent or of an unsupported kind."""


class UnsupportedFormatError(CheckpointError):
    """A recognised but unsupported format or architecture variant."""


class TokenizerError(NanoscopeError):
    """A tokenizer file is missing, unsafe, or does not fit the model."""


class ContextError(NanoscopeError):
    """A prompt does not fit the model's context."""
