"""Answers read back from the eval-results store are checked before anything uses them.

The store is a file anyone may have written. A result's dataclass takes whatever it is given,
and a wrong value fails only later, far from the store: a step of ``"x"`` is printed as a step,
a chosen index of 99 is an IndexError when the answer is shown, a text where a count belongs a
TypeError when counts are summed. So each answer built from a row is checked here, every field
against its declared type (the types the sweep itself produces) and every index against the list
it indexes; a row with one answer that fails is refused whole (:class:`RowRefused`), and the
caller logs it and asks the step again.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from desktop.engine.files.numbers import NumberRefused, describe, integer
from desktop.engine.runs.core_bundle import CoreAnswer
from desktop.engine.runs.multiple_choice import LETTERS, Answer

T = TypeVar("T")

# Indices an answer holds, each within the list it points into (-1: none chosen).
_INDICES: dict[type, Callable[[Any], bool]] = {
    Answer: lambda a: (
        len(a.logprobs) <= len(LETTERS)
        and 0 <= a.chosen < len(a.logprobs)
        and 0 <= a.answer < len(a.logprobs)
    ),
    CoreAnswer: lambda a: -1 <= a.chosen < len(a.losses) and 0 <= a.gold < len(a.losses),
}


class RowRefused(ValueError):
    """Why a stored row is not an answer the sweep could have given."""


def checked_result(result: T) -> T:
    """``result`` (a dataclass built from a stored row) when every field holds what the sweep
    puts there; RowRefused naming the first field that does not."""
    hints = _hints(type(result))  # type: ignore[arg-type]  # a dataclass type is hashable
    for field in dataclasses.fields(result):  # type: ignore[arg-type]
        value = getattr(result, field.name)
        if not _fits(value, hints[field.name]):
            raise RowRefused(f"{type(result).__name__}.{field.name} is {describe(value)}")
    fits = _INDICES.get(type(result))
    if fits is not None and not fits(result):
        raise RowRefused(f"{type(result).__name__} holds an index out of range")
    return result


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fits(value: object, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` names: str, bool, int (a count or an index, -1
    for none), float (not NaN; a loss with nothing to score is infinite), ``X | None`` and
    ``tuple[X, ...]``."""
    if isinstance(hint, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        (kind, _) = typing.get_args(hint)
        return isinstance(value, tuple) and all(_fits(v, kind) for v in value)
    if hint is int:
        try:
            integer(value, lo=-1)
        except NumberRefused:
            return False
        return True
    if hint is float:
        return type(value) is float and not math.isnan(value)
    if hint is bool or hint is str or hint is type(None):
        return type(value) is hint
    return False
