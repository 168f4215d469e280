"""A served reply that ends inside a UTF-8 character ends as the tokenizer's own decode of its ids.

The server here streams what a server with a holding detokenizer streams: the text a real
tokenizer's ``DecodeStream`` releases token by token (``transformers serve`` streams exactly
that), so an unfinished character at the end is never sent. Where the server also gives each
token's bytes (chat ``logprobs`` entries, as vLLM and llama-server do), Nanoscope's reply must
equal ``Tokenizer.decode`` of the same ids to the last character; where it gives nothing but
text, the reply is what the server sent.
"""

from __future__ import annotations

import pytest
from support.openai_fault_server import Reply, chat_chunk, sse
from test_remote_backend import chat, fault, open_fault, run, scripted, text_of  # noqa: F401 (fixture)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.decoders import DecodeStream

END = "<|end|>"
CORPUS = "héllo wörld, naïve café. 日本語のテキスト ünïcode ☃ snow " * 8


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """Byte-level BPE with few merges: the rarer characters stay split over byte tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=290,
        special_tokens=[END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer)
    return tok


def token_bytes(tok: Tokenizer, token_id: int) -> list[int]:
    """A token's bytes as a server reports them: the byte-level alphabet mapped back to bytes."""
    if token_id == tok.token_to_id(END):
        return list(END.encode())
    alphabet = {ch: b for b, ch in enumerate(byte_alphabet())}
    return [alphabet[ch] for ch in tok.id_to_token(token_id)]


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> character table, in byte order (what ByteLevel's vocabulary spells)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def holding_server(tok: Tokenizer, ids: list[int], finish: str, with_bytes: bool):
    """The chunks of a reply of ``ids``: each token's text as DecodeStream releases it (nothing
    while a character is unfinished, nothing held at the end), and its bytes if ``with_bytes``."""
    stream, pieces, pending = DecodeStream([], skip_special_tokens=True), [], []
    for token_id in ids:
        pending.append(token_id)
        text = stream.step(tok, token_id)
        if text is None:
            continue
        entries = [{"token": "", "logprob": -0.5, "bytes": token_bytes(tok, t)} for t in pending]
        extra = {"logprobs": {"content": entries}} if with_bytes else {}
        pieces.append(chat_chunk(text, **extra))
        pending = []
    if pending and with_bytes:  # the unfinished character's tokens are reported, not spelled
        entries = [{"token": "", "logprob": -0.5, "bytes": token_bytes(tok, t)} for t in pending]
        pieces.append(chat_chunk("", logprobs={"content": entries}))
    pieces += [chat_chunk(None, finish), sse("[DONE]")]
    return Reply(200, pieces)


def probe(with_bytes: bool) -> Reply:
    extra = {"logprobs": {"content": [{"token": "a", "logprob": -1.0, "bytes": [97]}]}} if with_bytes else {}
    return Reply(200, [chat_chunk("a", **extra), chat_chunk(None, "length")])


def cut_inside_a_character(tok: Tokenizer) -> list[list[int]]:
    """Every prefix of a reply's ids whose decode ends in U+FFFD (it stops mid-character)."""
    ids = tok.encode("ok 日本語 ☃ café").ids
    cuts = [ids[:n] for n in range(1, len(ids)) if tok.decode(ids[:n]).endswith("\ufffd")]
    assert len(cuts) >= 3
    return cuts


def reply_text(fault, tok, ids, finish="length", with_bytes=True) -> str:  # noqa: F811
    fault.script = scripted(holding_server(tok, ids, finish, with_bytes), probe=probe(with_bytes))
    backend = open_fault(fault)
    try:
        events, _stats, err = run(backend, chat("hi"))
    finally:
        backend.close()
    assert err is None
    return text_of(events)


def test_a_reply_cut_inside_a_character_ends_as_the_tokenizer_decodes(fault, tokenizer):  # noqa: F811
    for ids in cut_inside_a_character(tokenizer):
        assert reply_text(fault, tokenizer, ids) == tokenizer.decode(ids), ids
    assert fault.requests[-1][1]["logprobs"] is True  # asked for on every reply: the bytes are in them


def test_a_stop_token_after_an_unfinished_character(fault, tokenizer):  # noqa: F811
    ids = cut_inside_a_character(tokenizer)[0]
    got = reply_text(fault, tokenizer, [*ids, tokenizer.token_to_id(END)], finish="stop")
    assert got == tokenizer.decode(ids)


def test_a_reply_that_ends_cleanly_is_left_as_sent(fault, tokenizer):  # noqa: F811
    ids = tokenizer.encode("ok 日本語 café").ids
    assert reply_text(fault, tokenizer, ids) == tokenizer.decode(ids)
    got = reply_text(fault, tokenizer, [*ids, tokenizer.token_to_id(END)], finish="stop")
    assert got == tokenizer.decode(ids)


def test_without_bytes_the_reply_is_what_the_server_sent(fault, tokenizer):  # noqa: F811
    """transformers serve gives neither ids nor bytes: what it kept back cannot be known."""
    ids = cut_inside_a_character(tokenizer)[-1]
    sent = tokenizer.decode(ids).rstrip("\ufffd")
    assert reply_text(fault, tokenizer, ids, with_bytes=False) == sent
