"""nanochat's calculator tool without ``eval``: an AST whitelist that runs safely off the main thread.

nanochat's ``use_calculator`` (engine.py) screens the expression with character and substring
checks, then ``eval``\\s it with empty builtins under a 3 s ``SIGALRM``. ``signal`` only works on
the main thread and ``eval`` is one screening bug away from running code, so this module keeps
nanochat's screening verbatim and then evaluates only the two shapes that screening lets
through and ``eval`` can compute:

* arithmetic: int/float literals, unary ``+``/``-``, binary ``+ - * / //`` (``%`` and ``**`` never
  pass the screening), with Python's own semantics;
* ``'literal'.count('literal')``.

Anything else, and any error (division by zero, syntax), gives None, as in nanochat. On top of
that it refuses (None) work nanochat would happily attempt: inputs over ``MAX_CHARS``, deep
nesting, integers beyond ``MAX_INT`` (checked *before* multiplying), and evaluations of more than
``MAX_STEPS`` nodes. Every call builds its own state, so concurrent calls are safe.

The budget counts work, not time: a result becomes the tokens the model is forced to read, so a
deadline a busy machine passed (once it was 0.25 s) would give another reply to the same seed.
"""

from __future__ import annotations

import ast
import operator
import string
from collections.abc import Callable
from typing import Any

MAX_CHARS = 1000
MAX_PAREN_DEPTH = 32  # checked on the text, so the parser never recurses deeply
MAX_OPERATOR_RUN = 4  # e.g. "+-" is fine; "-------1" is not worth a parser's stack
MAX_AST_DEPTH = 200
MAX_INT = 10**100
# Nodes one evaluation visits at most (each takes a character or more, so within MAX_CHARS no
# expression reaches it: it bounds the work should the limits above ever change).
MAX_STEPS = MAX_CHARS

# nanochat's screening, unchanged.
_MATH_CHARS = frozenset("0123456789*+-/.() ")
_STRING_CHARS = frozenset(string.ascii_letters + string.digits + "'\"()._ ")
# fmt: off
_DANGEROUS = (
    "__", "import", "exec", "eval", "compile", "open", "file", "input", "raw_input",
    "globals", "locals", "vars", "dir", "getattr", "setattr", "delattr", "hasattr",
)
# fmt: on

_BINARY_OPS: dict[type[ast.operator], Callable[[object, object], object]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}
_UNARY_OPS: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class _Refused(Exception):
    """The expression is outside what we evaluate; the caller turns this into None."""


def calculate(expr: str) -> int | float | None:
    """Evaluate a calculator expression the way nanochat's tool would, or return None."""
    if not isinstance(expr, str) or len(expr) > MAX_CHARS:
        return None
    expr = expr.replace(",", "")  # nanochat strips thousands separators (and every other comma)
    if all(c in _MATH_CHARS for c in expr):
        if "**" in expr:
            return None
        return _run(expr, _Evaluator.arithmetic)
    if not all(c in _STRING_CHARS for c in expr):
        return None
    lowered = expr.lower()
    if any(p in lowered for p in _DANGEROUS) or ".count(" not in expr:
        return None
    return _run(expr, _Evaluator.count_call)


def _run(expr: str, method: Callable[[_Evaluator, ast.expr], int | float]) -> int | float | None:
    if not _shallow(expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval")
        return method(_Evaluator(MAX_STEPS), tree.body)
    except (_Refused, SyntaxError, ValueError, ArithmeticError, RecursionError, MemoryError):
        return None


def _shallow(expr: str) -> bool:
    """Bound parenthesis nesting and operator runs before handing the text to the parser."""
    depth = run = 0
    for c in expr:
        if c == "(":
            depth += 1
            if depth > MAX_PAREN_DEPTH:
                return False
        elif c == ")":
            depth -= 1
        if c in "+-*/":
            run += 1
            if run > MAX_OPERATOR_RUN:
                return False
        elif c != " ":
            run = 0
    return True


class _Evaluator:
    """One evaluation: a budget of nodes plus the whitelisted node types."""

    def __init__(self, steps: int) -> None:
        self._steps = steps

    def _enter(self, depth: int) -> None:
        self._steps -= 1
        if depth > MAX_AST_DEPTH or self._steps < 0:
            raise _Refused

    def arithmetic(self, node: ast.expr, depth: int = 0) -> int | float:
        self._enter(depth)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return _bounded(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
            return _UNARY_OPS[type(node.op)](self.arithmetic(node.operand, depth + 1))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            left = self.arithmetic(node.left, depth + 1)
            right = self.arithmetic(node.right, depth + 1)
            # A product has at most the sum of its factors' bits; refuse before spending time on it.
            if (
                isinstance(node.op, ast.Mult)
                and type(left) is int
                and type(right) is int
                and left.bit_length() + right.bit_length() > MAX_INT.bit_length() + 1
            ):
                raise _Refused
            return _bounded(_BINARY_OPS[type(node.op)](left, right))
        raise _Refused

    def count_call(self, node: ast.expr) -> int:
        """``'text'.count('sub')`` with both sides string literals; nothing else."""
        self._enter(0)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "count"
            and not node.keywords
            and len(node.args) == 1
        ):
            text, sub = node.func.value, node.args[0]
            if _is_str_literal(text) and _is_str_literal(sub):
                assert isinstance(text, ast.Constant) and isinstance(sub, ast.Constant)  # for mypy
                return str(text.value).count(str(sub.value))
        raise _Refused


def _is_str_literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is str


def _bounded(value: object) -> int | float:
    if type(value) is int:
        if abs(value) > MAX_INT:
            raise _Refused
        return value
    if type(value) is float:
        return value
    raise _Refused
