"""Numbers read from files, bounded: the one way a number someone else wrote becomes a float or
a count here (metas, stage logs, training TOMLs, configs, the app's own state).

Parsers hand back Python ints of any size (JSON, TOML and YAML all do), and ``float()`` or
``math.isfinite`` of a 400-digit one raises OverflowError, which no reader expects. Here every
such value is checked before it is converted, and what is not a finite number or a count is a
:class:`NumberRefused` whose text says why after the value's name ("is inf", "is a 400-digit
number, too large for a float"); the caller puts the file and the name in front.
"""

from __future__ import annotations

import math
import re

# Steps and other counts: exact as a float, so a count drawn on an axis is the count written.
MAX_COUNT = 1 << 53
_INTEGER = re.compile(r"[+-]?\d+")
_DIGIT = re.compile(r"\d")


class NumberRefused(ValueError):
    """Why a value is not a usable number: a phrase to follow its name ("is nan")."""


class NotANumber(NumberRefused):
    """A word, a list or a boolean where a number may stand (a label, in some records)."""


def describe(value: object) -> str:
    """A value for a message, as Python shows it, but never a 4,000-digit number or a megabyte
    of text."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"a {_digits(abs(value))}-digit number"
    return _cut(repr(value))


def _written(text: str) -> str:
    """A number as a line of text writes it, for a message (unquoted, controls escaped)."""
    digits = len(_DIGIT.findall(text)) if len(text) > 40 else 0
    if digits > 30:
        return f"a {digits}-digit number"
    return _cut(text if text.isprintable() else repr(text)[1:-1])


def _cut(text: str) -> str:
    return text if len(text) <= 40 else text[:39] + "…"


def _digits(n: int) -> int:
    """How many decimal digits ``n`` > 0 has, without str() (refused past 4,300 digits)."""
    digits = int((n.bit_length() - 1) * math.log10(2)) + 1  # exact, or one short
    return digits + (n >= 10**digits)


def finite_float(value: object) -> float:
    """A parsed number (int or float, not a bool) as a finite float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NotANumber("is not a number")
    try:
        number = float(value)
    except OverflowError:  # an int past 1.8e308
        raise NumberRefused(f"is {describe(value)}, too large for a float") from None
    if not math.isfinite(number):
        raise NumberRefused(f"is {number}")
    return number


def integer(value: object, lo: int = 0, hi: int = MAX_COUNT - 1) -> int:
    """A parsed int (not a bool) from ``lo`` to ``hi``; by default a count (a step, tokens)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise NotANumber(f"is {describe(value)}, not an integer")
    if not lo <= value <= hi:
        raise NumberRefused(f"is {describe(value)}, not an integer from {lo:,} to {hi:,}")
    return value


def parse_float(text: str) -> float:
    """A number as a line of text writes it (``1.5``, ``3``, ``2e-4``) as a finite float.
    Digits that overflow a float are named as such, not read as the infinity float() makes of
    them; ``inf`` and ``nan`` written out are refused as what they are."""
    try:
        number = float(text)
    except ValueError:
        raise NotANumber("is not a number") from None
    if math.isinf(number) and _DIGIT.search(text):
        raise NumberRefused(f"is {_written(text)}, too large for a float")
    if not math.isfinite(number):
        raise NumberRefused(f"is {number}")
    return number


def parse_count(text: str, hi: int = MAX_COUNT - 1) -> int:
    """A count as a line of text writes it (decimal digits); its length is checked before
    ``int()`` runs, which is quadratic in the digits and refuses more than 4,300 of them."""
    if not _INTEGER.fullmatch(text):
        raise NotANumber(f"is {_written(text)}, not a count")
    if len(text.lstrip("+-0")) > len(str(hi)):
        raise NumberRefused(f"is {_written(text)}, not an integer from 0 to {hi:,}")
    return integer(int(text), 0, hi)
