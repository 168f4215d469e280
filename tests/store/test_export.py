"""desktop.store.export: Markdown for reading, versioned JSON that round-trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desktop import __version__
from desktop.engine.errors import NanoscopeError
from desktop.engine.messages import (
    PART_KINDS,
    PYTHON,
    PYTHON_OUTPUT,
    TEXT,
    THOUGHT,
    TOOL_QUERY,
    Message,
    Part,
)
from desktop.store.export import FORMAT, VERSION, ExportFormatError, from_json, to_json, to_markdown

CALC = [
    Message.of_text("system", "Be brief."),
    Message.of_text("user", "What is 12*12?"),
    Message(
        "assistant",
        [
            Part(TEXT, "Let me check. "),
            Part(PYTHON, "12*12"),
            Part(PYTHON_OUTPUT, "144"),
            Part(TEXT, "It is 144."),
        ],
        {
            "checkpoint": "/ckpt/d20",
            "step": 650,
            "seed": 42,
            "sampling": {"temperature": 0.8},
            "tokens_per_s": 31.5,
        },
    ),
]


def test_markdown_shows_roles_text_and_tool_blocks() -> None:
    md = to_markdown("Squares", CALC)
    assert md.startswith("# Squares\n")
    assert md.index("## System") < md.index("## User") < md.index("## Assistant")
    assert "Let me check." in md and "It is 144." in md
    assert "```python\n12*12\n```" in md
    # The forced calculator result is labelled as output, not shown as code the model wrote.
    assert "Output:\n\n```output\n144\n```" in md
    assert md.index("```python") < md.index("```output") < md.index("It is 144.")


def test_markdown_fence_outgrows_backticks_inside() -> None:
    code = "print('```')"
    md = to_markdown("t", [Message("assistant", [Part(PYTHON, code)])])
    assert f"````python\n{code}\n````" in md


def test_markdown_thoughts_quoted_and_other_tools_fenced() -> None:
    msg = Message("assistant", [Part(THOUGHT, "step one\n\nstep two"), Part(TOOL_QUERY, "search(x)")])
    md = to_markdown("", [msg])
    assert md.startswith("# Untitled conversation")
    assert "> step one\n>\n> step two" in md
    assert "```tool-call\nsearch(x)\n```" in md


def test_json_is_versioned_and_keeps_per_message_meta() -> None:
    doc = json.loads(to_json("Squares", CALC, {"kind": "chat"}))
    assert doc["format"] == FORMAT and doc["version"] == VERSION
    assert doc["app_version"] == __version__
    assert doc["meta"] == {"kind": "chat"}
    assert doc["messages"][2]["meta"] == CALC[2].meta
    assert doc["messages"][2]["parts"][1] == {"kind": PYTHON, "text": "12*12"}


def test_json_round_trip() -> None:
    back = from_json(to_json("Squares", CALC, {"kind": "compare", "left": "d20"}))
    assert back.title == "Squares"
    assert back.messages == CALC
    assert back.meta == {"kind": "compare", "left": "d20"}


parts = st.builds(Part, st.sampled_from(PART_KINDS), st.text())
messages = st.builds(
    Message,
    st.sampled_from(["system", "user", "assistant"]),
    st.lists(parts, max_size=4),
    st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.floats(allow_nan=False), st.text())),
)


@settings(max_examples=60, deadline=None, database=None)
@given(title=st.text(), msgs=st.lists(messages, max_size=5))
def test_json_round_trips_any_text(title: str, msgs: list[Message]) -> None:
    back = from_json(to_json(title, msgs))
    assert (back.title, back.messages, back.meta) == (title, msgs, {})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{oops", "invalid JSON"),
        (json.dumps({"format": "something else"}), "not a conversation export"),
        (json.dumps({"format": FORMAT, "version": VERSION + 1, "messages": []}), "newer"),
        (json.dumps({"format": FORMAT, "version": VERSION, "messages": [{"parts": []}]}), "malformed"),
        (json.dumps({"format": FORMAT, "version": VERSION, "messages": [{"role": "robot"}]}), "unknown role"),
    ],
)
def test_bad_files_give_one_readable_line(text: str, problem: str) -> None:
    with pytest.raises(ExportFormatError, match=problem) as err:
        from_json(text)
    assert isinstance(err.value, NanoscopeError) and "\n" not in str(err.value)
