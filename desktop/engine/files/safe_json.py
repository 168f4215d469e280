"""Parse JSON that came from a file someone else wrote, with bounds (metas, tokenizer.json, settings).

``json.loads`` itself raises ``RecursionError`` on deep nesting, ``ValueError`` on an integer of
more than 4300 digits, and accepts ``NaN``, ``Infinity`` and ``1e999`` (which is inf). Here each of
those is a :class:`JsonRefused` with one readable line. Nesting is measured on the text before
parsing (the C parser recurses once per level, and a worker thread's stack can be small), and is
bounded well below the interpreter's recursion limit, so walking the result cannot recurse too
deep either.
"""

from __future__ import annotations

import json
import math
import re
import sys
from itertools import accumulate
from typing import Any

MAX_DEPTH = 64


class JsonRefused(ValueError):
    """Why a JSON text was refused: a phrase to put after "not valid JSON" and the file name."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonRefused(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise JsonRefused(f"{name} is not a JSON value")


# Two substitutions, left to right at C speed, each reading every byte once: strings go (escapes
# included; a quote that opens no complete string takes the rest of the text with it, which
# json.loads then refuses as unterminated), then everything that is not a bracket. A pattern
# without that second alternative re-read the rest of the text from every quote of an
# unterminated string (minutes for 200 KB of backslash-quotes); a findall of every string, a
# replacement that refers to a group (a Python call per string) or a regex for the non-brackets
# cost 2-5x json.loads itself.
_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|"[\s\S]*')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def text_depth(text: str) -> int:
    """How deep brackets nest in a JSON text, strings left out."""
    rest = _STRINGS.sub("", text).encode("utf-8", "surrogatepass")
    return max(accumulate(_STEP[b] for b in rest.translate(None, _NOT_BRACKETS)), default=0)


def loads_bounded(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)``, refusing NaN/Infinity, huge numbers and nesting deeper than ``max_depth``."""
    if text_depth(text) > max_depth:
        raise JsonRefused(f"nested deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except JsonRefused:
        raise
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated string"):
            raise JsonRefused(f"a string is never closed (line {exc.lineno})") from None
        raise JsonRefused(f"{exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise JsonRefused(f"nested deeper than {max_depth} levels") from None
    except ValueError:  # int() of a number with more digits than the interpreter converts
        limit = sys.get_int_max_str_digits()
        raise JsonRefused(f"a number has more than {limit} digits") from None
    return value
