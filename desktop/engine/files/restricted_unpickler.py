"""The unpickler for every pickle Nanoscope builds values from itself (torch and DCP load their
own files after the scan): it builds only the globals it is handed, by module and name, and
refuses every other, so no pickle can name a function for it to call. Each pickle reaches it
after :mod:`.pickle_scan` has checked its opcodes: a change to either one alone cannot turn a
load into code execution.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import Any


class GlobalRefused(pickle.UnpicklingError):
    """The pickle named a global it was not allowed."""

    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"refused to unpickle {module}.{name}")
        self.module, self.name = module, name


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles ``data`` with ``allowed`` as its only globals (none by default)."""

    def __init__(self, data: bytes, allowed: Mapping[tuple[str, str], Any] | None = None) -> None:
        super().__init__(io.BytesIO(data))
        self._allowed = dict(allowed or {})

    def find_class(self, module: str, name: str) -> Any:
        found = self._allowed.get((module, name))
        if found is None:
            raise GlobalRefused(module, name)
        return found


def loads_plain(data: bytes) -> object:
    """A pickle of plain values (numbers, text, bytes, lists, tuples, dicts, sets): no globals."""
    return RestrictedUnpickler(data).load()
