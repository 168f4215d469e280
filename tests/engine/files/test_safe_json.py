"""The bounded JSON parser measures nesting on the text exactly as the parsed value nests, whatever
the strings hold (brackets, quotes, escapes), refuses what json.loads would recurse on or convert
badly, and reads an unterminated string in linear time."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from desktop.engine.files.safe_json import JsonRefused, loads_bounded, text_depth

tricky_text = st.text(alphabet=st.sampled_from(list('[]{}"\\ab:,\n\u65e5')), max_size=12)
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=30,
)


def depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@given(values, st.integers(0, 2))
def test_the_text_nests_as_the_value_does(value, indent):
    text = json.dumps(value, indent=indent or None, ensure_ascii=indent == 2)
    assert text_depth(text) == depth(value)
    assert loads_bounded(text) == json.loads(text)


@given(st.integers(1, 200))
def test_nesting_past_the_bound_is_refused_before_parsing(extra):
    text = "[" * (64 + extra) + "]" * (64 + extra)
    try:
        loads_bounded(text)
    except JsonRefused as exc:
        assert str(exc) == "nested deeper than 64 levels"
    else:
        raise AssertionError("accepted")


def test_an_unterminated_string_of_escaped_quotes_is_one_line():
    try:
        loads_bounded('"' + '\\"' * 200_000)
    except JsonRefused as exc:
        assert str(exc) == "a string is never closed (line 1)"
    else:
        raise AssertionError("accepted")
