"""The calculator tool: nanochat's answers where nanochat answers, None for everything hostile."""

from __future__ import annotations

import operator
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desktop.engine import calculator
from desktop.engine.calculator import MAX_INT, calculate


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("15*8", 15 * 8),
        ("1,000*2", 1000 * 2),
        ("10/4", 10 / 4),
        ("10//3", 10 // 3),
        ("-7//2", -7 // 2),
        ("3.5 * 2", 3.5 * 2),
        ("(1 + 2) * (3 - 4)", (1 + 2) * (3 - 4)),
        ("--5", 5),
        ("- 2 + +3", -2 + 3),
        ("1.5", 1.5),
        (".5+5.", 0.5 + 5.0),
        ("(7)", 7),
        ("12,345,678 / 2", 12345678 / 2),
        ("'strawberry'.count('r')", "strawberry".count("r")),
        ('"hello world".count("o")', "hello world".count("o")),
        ("('banana').count('an')", "banana".count("an")),
        ("'straw' 'berry'.count('r')", "strawberry".count("r")),  # implicit concatenation, as eval does
        ("'a,b,c'.count(',')", "abc".count("")),  # nanochat drops every comma before anything else
    ],
)
def test_matches_nanochat_on_what_it_accepts(expr, expected):
    result = calculate(expr)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(
    "expr",
    [
        "1/0",
        "1//0",
        "0.0/0",
        "2 +",
        "1 2",
        "()",
        "(1)(2)",
        "",
        "01",
        "7 % 3",  # % is not in nanochat's arithmetic character set
        "2**10",
        "1e5",
        "0x10",
        "'abc'.upper()",  # no .count(
        "'abc'.count('a', 1)",  # the comma is stripped, leaving a syntax error
        "'abc'.count(1)",
        "(5).count(5)",
        "b'abc'.count(b'a')",
    ],
)
def test_invalid_expressions_give_none(expr):
    assert calculate(expr) is None


HOSTILE = [
    "__import__('os')",
    "__import__('os').system('true')",
    "().__class__",
    "().__class__.__bases__[0].__subclasses__()",
    "'a'*10**10",
    "9**9**9",
    "(" * 500 + "1" + ")" * 500,
    "-" * 900 + "1",
    "+" * 999,
    "lambda: 1",
    "(lambda x: x)(1)",
    "f'{1}'.count('1')",
    "f'abc'.count('a')",
    "x.count('a')",
    "'abc'.count(x)",
    "open('f').count('a')",
    "'abc'.upper().count('A')",  # attribute access other than count
    "'abc'.count.count('a')",
    "'a'.count('a') if True else 0",
    "True",
    "[1, 2].count(1)",
    "print('x').count('x')",
    "'x'.count('x')" + " " * 1000,  # too long
    "9" * 150 + "*" + "9" * 150,  # product far beyond MAX_INT
    "1" + "0" * 101,  # literal beyond MAX_INT
]


def test_hostile_inputs_are_refused_quickly():
    start = time.perf_counter()
    for expr in HOSTILE:
        assert calculate(expr) is None, expr
    assert time.perf_counter() - start < 1.0


def test_integer_bound_is_checked_before_multiplying():
    just_fits = "1" + "0" * 99  # 10**99
    assert calculate(just_fits + "*10") == 10**99 * 10 == MAX_INT
    assert calculate(just_fits + "*100") is None
    assert calculate(just_fits + "0+1") is None


def test_the_step_budget_refuses_evaluation(monkeypatch):
    monkeypatch.setattr(calculator, "MAX_STEPS", 0)
    assert calculate("1+1") is None
    assert calculate("'aa'.count('a')") is None


def test_the_budget_counts_work_not_time(monkeypatch):
    """A result is what the model is forced to read: a busy machine must not change it."""
    monkeypatch.setattr(calculator, "MAX_STEPS", 3)
    assert calculate("1+1") == 2  # three nodes
    assert calculate("1+1+1") is None  # five


def test_concurrent_calls_agree_with_sequential_ones():
    exprs = [f"{i}*{i + 1} - {i}/7" for i in range(200)] + [f"'{'r' * i}x'.count('r')" for i in range(50)]
    sequential = [calculate(e) for e in exprs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(calculate, exprs)) == sequential


_OPS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
}


def _with_commas(n: int, commas: bool) -> str:
    return f"{n:,}" if commas else str(n)


@st.composite
def arithmetic(draw, depth: int = 0):
    """(expression text, value computed with Python's operators or None on division by zero)."""
    if depth >= 3 or draw(st.booleans()):
        n = draw(st.integers(-(10**6), 10**6))
        return _with_commas(n, draw(st.booleans())), n
    left_text, left = draw(arithmetic(depth + 1))
    right_text, right = draw(arithmetic(depth + 1))
    op = draw(st.sampled_from(sorted(_OPS)))
    text = f"({left_text} {op} {right_text})"
    if left is None or right is None:
        return text, None
    try:
        return text, _OPS[op](left, right)
    except ZeroDivisionError:
        return text, None


@settings(max_examples=300, deadline=None)
@given(arithmetic())
def test_random_arithmetic_matches_python(case):
    text, expected = case
    result = calculate(text)
    assert result == expected and type(result) is type(expected)
