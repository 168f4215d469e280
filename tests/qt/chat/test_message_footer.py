"""A reply's footer says what speculative decoding did (issue #40): "speculative" only where tokens
were drafted, else why the chosen draft drafted nothing, as the engine said it; nothing when
speculative decoding was off. Chat's footer and Compare's pane footer say the same."""

from __future__ import annotations

import pytest

from desktop.qt.chat.message_footer import RENEWED, SPECULATIVE_NOTE, format_stats
from desktop.qt.compare.pane_view import format_pane_stats

DONE = {"new_tokens": 24, "decode_tok_s": 30.0, "ttft_ms": 80.0, "stopped": "max_tokens"}
NOT_FASTER = "int8 copy not faster on this CPU: drafted nothing"
CASES = [
    # (draft, stats, what the footer says of the draft, or None for nothing, whether it drafted)
    ("int8", {**DONE, "drafted": 48, "accepted": 44}, "speculative (int8) · 92% of 48 drafted kept", True),
    ("int8", {**DONE, "drafted": 0, "accepted": 0, "draft_skipped": NOT_FASTER}, NOT_FASTER, False),
    ("int8", {**DONE, "drafted": 0, "accepted": 0}, "int8 draft: drafted nothing", False),  # saved before
    ("", {**DONE, "drafted": 0, "accepted": 0, "draft_skipped": ""}, None, False),
]


@pytest.mark.parametrize(("draft", "stats", "said", "drafted"), CASES, ids=["kept", "skipped", "old", "off"])
def test_the_footer_says_speculative_only_where_tokens_were_drafted(draft, stats, said, drafted):
    line, tip = format_stats({"stats": stats, **({"draft": draft} if draft else {})})
    pane = "\n".join(format_pane_stats({**stats, **({"draft": draft} if draft else {})}))
    for text in (line, pane):
        assert ("speculative" in text) == drafted
        if said is None:
            assert "draft" not in text
        else:
            assert said in text
    assert (SPECULATIVE_NOTE in tip) == drafted


def test_a_failed_reply_names_its_error_and_no_draft():
    line, _ = format_stats({"draft": "int8", "error": "draft int8: out of memory", "stats": {}})
    assert line == "⚠ draft int8: out of memory"
    assert format_pane_stats({"error": "draft int8: out of memory", "draft": "int8"}) == [
        "⚠ draft int8: out of memory"
    ]


def test_a_pane_asked_not_to_draft_says_why():
    lines = format_pane_stats({**DONE, "draft_skipped": "decoded plainly: it is the draft"})
    assert lines[1] == "decoded plainly: it is the draft" and "speculative" not in "".join(lines)


def test_a_reply_that_was_not_asked_to_draft_says_why():
    """A draft chosen for a model that cannot draft here (a served one): the footer says so."""
    why = "draft not used: speculative decoding runs on the server, not here"
    line, tip = format_stats({"draft_skipped": why, "stats": DONE})
    assert why in line and "speculative (" not in line and "drafted" not in line
    assert SPECULATIVE_NOTE not in tip


def test_a_reply_after_kernels_were_chosen_anew_says_so_in_chat_and_in_a_pane():
    renewed = {"new_tokens": 5, "decode_tok_s": 10.0, "choices_renewed": True}
    assert RENEWED in format_stats({"stats": renewed})[0]
    assert RENEWED in format_pane_stats(renewed)
    kept = {**renewed, "choices_renewed": False}
    assert RENEWED not in format_stats({"stats": kept})[0]
    assert format_pane_stats(kept) == ["10.0 tok/s  ·  5 tokens"]
