"""A stage-log record's words: split as ``shlex.split`` splits them (the grammar nanochat's records
are written in), in time linear in the line. The valid controls are the golden experiment's logs,
written by nanochat's own code."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.golden import EXPERIMENT_CASES

from desktop.engine.files.log_lines import shell_words

# What a shell word can be made of: quotes, backslashes, the four whitespace characters shlex
# splits on, and a few that it does not (a vertical tab, a no-break space).
PIECES = st.text(st.sampled_from("ab=.5 \t\r\n'\"\\\x0b\xa0é"), max_size=40)


def both(text: str) -> tuple[object, object]:
    """What shlex and shell_words make of ``text`` ("error" for a ValueError)."""
    out = []
    for split in (shlex.split, shell_words):
        try:
            out.append(split(text))
        except ValueError:
            out.append("error")
    return out[0], out[1]


@settings(max_examples=2000, deadline=None, database=None)
@given(PIECES)
def test_any_text_splits_as_shlex_splits_it(text):
    ours, theirs = both(text)
    assert ours == theirs


@settings(max_examples=500, deadline=None, database=None)
@given(st.lists(st.text(max_size=20), max_size=12))
def test_words_quoted_as_a_writer_quotes_them_come_back(words):
    assert shell_words(" ".join(shlex.quote(w) for w in words)) == words


def test_every_line_of_the_golden_logs_splits_as_shlex_splits_it():
    logs = sorted(EXPERIMENT_CASES[0].rglob("*.log"))
    lines = [line for log in logs for line in log.read_text(encoding="utf-8").splitlines()]
    assert len(logs) >= 2 and any("=" in line for line in lines)
    for line in lines:
        assert both(line)[0] == both(line)[1], line


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("k='a b' " * 8000, ["k=a b"] * 8000),  # 64 KB of quoted words
        ("a" * 60_000 + '"' + "b" * 4000, None),  # a quote never closed, after a long word
        ('"' + "\\x" * 30_000, None),  # backslashes in a double quote never closed
        ("'" * 60_000 + " x", ["", "x"]),  # 30,000 empty quotes make one empty word
    ],
    ids=["quoted", "unclosed", "escapes", "quotes"],
)
def test_a_long_hostile_line_is_split_or_refused_as_shlex_would(line, words):
    # no part of a line is tried two ways (see log_lines._PIECE): these would backtrack for hours
    # through a pattern that allowed it; shlex itself is the judge on a piece it can take
    assert both(line[:2000])[0] == both(line[:2000])[1]
    if words is None:
        with pytest.raises(ValueError, match="no closing quotation"):
            shell_words(line)
    else:
        assert shell_words(line) == words
