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


class DeviceError(NanoscopeError, ValueError):
    """The device or precision asked for is unknown or not available on this machine."""


class ContextError(NanoscopeError):
    """A prompt does not fit the model's context."""


class OutOfMemoryError(NanoscopeError):
    """An allocation failed (CPU RAM or GPU memory)."""


OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """torch reports allocation failures as RuntimeError subclasses with these phrases."""
    return isinstance(exc, MemoryError) or any(m in str(exc).lower() for m in OOM_MARKERS)
