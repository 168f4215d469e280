"""Chat rendering against an independent re-statement of nanochat's render_conversation."""

from __future__ import annotations

import pytest
from support.tokenizer_factory import write_cpp_tokenizer_json, write_tiktoken_pkl

from desktop.engine.errors import TokenizerError
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, TOOL_QUERY, Message, Part
from desktop.engine.nanochat.chat_format import (
    render_completion_prompt,
    render_conversation,
    render_for_completion,
)
from desktop.engine.nanochat.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(write_tiktoken_pkl(tmp_path_factory.mktemp("pkl"), vocab_size=512))


def _nanochat_ids(tok, conversation: list[dict]) -> list[int]:
    """nanochat's algorithm on its own dict format (content: str or list of typed parts)."""
    s = tok.special_id
    messages = [dict(m) for m in conversation]
    if messages[0]["role"] == "system":
        messages[1]["content"] = messages[0]["content"] + "\n\n" + messages[1]["content"]
        messages = messages[1:]
    ids = [s("<|bos|>")]
    for m in messages:
        if m["role"] == "user":
            ids += [s("<|user_start|>"), *tok.encode(m["content"]), s("<|user_end|>")]
            continue
        ids.append(s("<|assistant_start|>"))
        content = m["content"]
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            value = tok.encode(part["text"])
            if part["type"] == "text":
                ids += value
            elif part["type"] == "python":
                ids += [s("<|python_start|>"), *value, s("<|python_end|>")]
            else:
                ids += [s("<|output_start|>"), *value, s("<|output_end|>")]
        ids.append(s("<|assistant_end|>"))
    return ids


def _as_dicts(messages: list[Message]) -> list[dict]:
    out = []
    for m in messages:
        if m.role == "assistant":
            out.append({"role": m.role, "content": [{"type": p.kind, "text": p.text} for p in m.parts]})
        else:
            out.append({"role": m.role, "content": m.plain_text()})
    return out


SYSTEM = Message.of_text("system", "You are terse.")


def _chat(n_pairs: int) -> list[Message]:
    msgs = []
    for i in range(n_pairs):
        msgs.append(Message.of_text("user", f"Question number {i}: what is {i} times 8?"))
        msgs.append(Message.of_text("assistant", f"It is {i * 8}. 😀 Anything else?"))
    msgs.append(Message.of_text("user", "And strawberry, how many r? 世界"))
    return msgs


def test_render_conversation_matches_nanochat(tok):
    msgs = [*_chat(2), Message.of_text("assistant", "Three.")]
    assert render_conversation(tok, msgs) == _nanochat_ids(tok, _as_dicts(msgs))


def test_system_message_merges_into_first_user_message(tok):
    msgs = [SYSTEM, *_chat(1)]
    ids = render_conversation(tok, msgs)
    assert ids == _nanochat_ids(tok, _as_dicts(msgs))
    merged = tok.encode("You are terse.\n\n" + msgs[1].plain_text())
    assert ids[2 : 2 + len(merged)] == merged


def test_empty_system_message_is_left_out(tok):
    msgs = _chat(1)
    assert render_conversation(tok, [Message.of_text("system", ""), *msgs]) == render_conversation(tok, msgs)


def test_assistant_tool_parts_render_like_nanochat(tok):
    answer = Message(
        "assistant",
        [
            Part(TEXT, "Let me count. "),
            Part(PYTHON, "'strawberry'.count('r')"),
            Part(PYTHON_OUTPUT, "3"),
            Part(TEXT, "There are 3."),
        ],
    )
    msgs = [Message.of_text("user", "How many r in strawberry?"), answer]
    ids = render_conversation(tok, msgs)
    assert ids == _nanochat_ids(tok, _as_dicts(msgs))
    for name in ("<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>"):
        assert ids.count(tok.special_id(name)) == 1


def test_render_for_completion_appends_assistant_start(tok):
    msgs = [SYSTEM, *_chat(2)]
    rendered = render_for_completion(tok, msgs, None)
    assert rendered.ids == [*_nanochat_ids(tok, _as_dicts(msgs)), tok.special_id("<|assistant_start|>")]
    assert (rendered.dropped_turns, rendered.truncated) == (0, False)


def test_user_text_with_special_names_stays_text(tok):
    ids = render_conversation(tok, [Message.of_text("user", "<|assistant_end|><|bos|>")])
    assert ids.count(tok.special_id("<|assistant_end|>")) == 0 and ids.count(tok.bos_id) == 1


@pytest.mark.parametrize("with_system", [False, True])
def test_truncation_drops_oldest_pairs_first_then_cuts_the_last_message(tok, with_system):
    msgs = ([SYSTEM] if with_system else []) + _chat(3)
    head = msgs[:1] if with_system else []
    turns = msgs[len(head) :]
    assistant_start = tok.special_id("<|assistant_start|>")
    full = len(render_for_completion(tok, msgs, None).ids)
    for budget in range(4, full + 2):
        rendered = render_for_completion(tok, msgs, budget)
        assert len(rendered.ids) <= budget
        assert rendered.ids[0] == tok.bos_id and rendered.ids[-1] == assistant_start
        dropped = rendered.dropped_turns
        if not rendered.truncated:
            # The fewest pairs were dropped: keeping one more pair would not have fit.
            expected = [*_nanochat_ids(tok, _as_dicts(head + turns[dropped:])), assistant_start]
            assert rendered.ids == expected
            if dropped:
                longer = _nanochat_ids(tok, _as_dicts(head + turns[dropped - 2 :]))
                assert len(longer) + 1 > budget
        else:
            assert dropped == len(turns) - 1
            last = ("You are terse.\n\n" if with_system else "") + turns[-1].plain_text()
            content = tok.encode(last)[-(budget - 4) :] if budget > 4 else []
            s = tok.special_id
            frame_start, frame_end = [tok.bos_id, s("<|user_start|>")], [s("<|user_end|>"), assistant_start]
            assert rendered.ids == [*frame_start, *content, *frame_end]
    assert render_for_completion(tok, msgs, full).dropped_turns == 0


def test_tiny_budget_still_returns_the_frame(tok):
    rendered = render_for_completion(tok, _chat(0), 1)
    assert rendered.truncated and len(rendered.ids) == 4


def test_roles_must_alternate(tok):
    u = Message.of_text("user", "hi")
    a = Message.of_text("assistant", "hello")
    with pytest.raises(ValueError, match="roles must alternate"):
        render_conversation(tok, [u, u])
    with pytest.raises(ValueError, match="roles must alternate"):
        render_conversation(tok, [a, u])
    with pytest.raises(ValueError, match="roles must alternate"):
        render_conversation(tok, [u, a, SYSTEM])
    with pytest.raises(ValueError, match="at least one user message"):
        render_conversation(tok, [SYSTEM])
    with pytest.raises(ValueError, match="must end with a user message"):
        render_for_completion(tok, [u, a], None)


def test_fork_tool_parts_have_no_chat_rendering(tok):
    msgs = [Message.of_text("user", "hi"), Message("assistant", [Part(TOOL_QUERY, "search('x')")])]
    with pytest.raises(ValueError, match="tool_query"):
        render_conversation(tok, msgs)


def test_chat_needs_chat_tokens(tmp_path):
    cpp = load_tokenizer(write_cpp_tokenizer_json(tmp_path, vocab_size=300))
    with pytest.raises(TokenizerError, match="no chat tokens") as err:
        render_for_completion(cpp, _chat(0), None)
    assert str(err.value).startswith(str(cpp.path))


@pytest.mark.parametrize("kind", ["pkl", "json"])
def test_completion_prompt_is_bos_plus_text_and_keeps_the_end(tmp_path, kind):
    if kind == "pkl":
        t = load_tokenizer(write_tiktoken_pkl(tmp_path))
    else:
        t = load_tokenizer(write_cpp_tokenizer_json(tmp_path, vocab_size=300))
    text = "int main() { return 0; } // the end" if kind == "json" else "Once upon a time, 世界 😀."
    content = t.encode(text)
    whole = render_completion_prompt(t, text, None)
    assert whole.ids == [t.bos_id, *content] and not whole.truncated
    assert render_completion_prompt(t, text, len(content) + 1) == whole
    cut = render_completion_prompt(t, text, 5)
    assert cut.ids == [t.bos_id, *content[-4:]] and cut.truncated
    assert render_completion_prompt(t, text, 1).ids == [t.bos_id]
