"""A pass that gives way (torch-free): the recorders ask ``stop`` before each block, so a pass
prepared in the background ends within a block's time when the user asks the model for
something else."""

from __future__ import annotations

from collections.abc import Callable

from desktop.engine.errors import NanoscopeError

Stop = Callable[[], bool]  # asked before each block: True ends the pass (PassYielded)


class PassYielded(NanoscopeError):
    """A pass given up part-way because its ``stop`` said so (a request came for the model)."""


def check(stop: Stop | None) -> None:
    """Before a block: end the pass if ``stop`` says so."""
    if stop is not None and stop():
        raise PassYielded("the Inside pass gave way to a request for the model")
