"""Streaming detokenization: pushes + flush always equal one whole decode, with bounded work."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.tokenizer_factory import (
    CPP_NEWLINES,
    SPECIAL_TOKENS,
    write_cpp_tokenizer_json,
    write_tiktoken_pkl,
)
from tokenizers import Tokenizer as HFTokenizer

from desktop.engine.decode.detokenize import CONTEXT, StreamDecoder
from desktop.engine.nanochat.tokenizer import load_tokenizer

PKL_VOCAB = 512
JSON_VOCAB = 400
FFFD = "\ufffd"


@pytest.fixture(scope="module")
def tik(tmp_path_factory):
    return load_tokenizer(write_tiktoken_pkl(tmp_path_factory.mktemp("pkl"), vocab_size=PKL_VOCAB))


@pytest.fixture(scope="module")
def cpp_path(tmp_path_factory):
    return write_cpp_tokenizer_json(tmp_path_factory.mktemp("json"), vocab_size=JSON_VOCAB)


@pytest.fixture(scope="module")
def cpp(cpp_path):
    return load_tokenizer(cpp_path)


def _stream(tok, ids, prefix=()) -> list[str]:
    dec = StreamDecoder(tok, prefix)
    return [dec.push(i) for i in ids] + [dec.flush()]


def _check_stream(tok, ids, prefix=()):
    pieces = _stream(tok, ids, prefix)
    full_prefix = tok.decode(list(prefix))
    expected = tok.decode([*prefix, *ids])[len(full_prefix) :]
    assert "".join(pieces) == expected
    if FFFD not in expected:
        assert not any(FFFD in p for p in pieces)
    # Everything emitted so far is always a prefix of the final text (nothing is ever taken back).
    emitted = ""
    for p in pieces:
        emitted += p
        assert expected.startswith(emitted)


# Ids weighted towards raw bytes >= 0x80, so multi-byte characters split across tokens a lot.
_tik_ids = st.lists(st.one_of(st.integers(0x80, 0xFF), st.integers(0, PKL_VOCAB - 1)), max_size=120)


@settings(max_examples=200, deadline=None)
@given(_tik_ids)
def test_tiktoken_stream_equals_whole_decode(tik, ids):
    _check_stream(tik, ids)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=150))
def test_tiktoken_stream_of_real_text_never_shows_replacement_chars(tik, text):
    _check_stream(tik, tik.encode(text))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_byte_by_byte_stream_rebuilds_emoji_and_cjk(tik, text):
    # The factory's first 256 ids are the single bytes, so this splits every character apart.
    ids = list(text.encode("utf-8"))
    assert tik.decode(ids) == text
    _check_stream(tik, ids)


def test_emoji_split_over_tokens_appears_whole(tik):
    text = "ok 😀🎉 世界"
    ids = list(text.encode("utf-8"))
    pieces = _stream(tik, ids)
    assert "".join(pieces) == text
    assert "😀" in pieces and "世" in pieces  # each character appears in one piece, once complete


def test_tiktoken_prefix_is_context_only(tik):
    prefix = [*tik.encode("Hello"), tik.special_id("<|assistant_start|>")]
    ids = tik.encode("World 😀")
    assert "".join(_stream(tik, ids, prefix)) == tik.decode(ids)


def test_flush_releases_an_incomplete_character(tik):
    dec = StreamDecoder(tik)
    assert dec.push(ord("a")) == "a"
    assert dec.push(0xF0) == ""  # first byte of a 4-byte character
    assert dec.flush() == FFFD == tik.decode([0xF0])


def test_special_tokens_stream_as_their_names(tik):
    ids = [*tik.encode("hi"), PKL_VOCAB - len(SPECIAL_TOKENS) + SPECIAL_TOKENS.index("<|python_start|>")]
    assert "".join(_stream(tik, ids)) == tik.decode(ids)


@pytest.fixture(scope="module")
def cpp_pool(cpp_path) -> list[int]:
    """Ids that exercise the spacing state: short lowercase fragments, underscores, keywords, newlines."""
    vocab = HFTokenizer.from_file(str(cpp_path)).get_vocab()
    wanted = {
        "_",
        "<",
        ">",
        "*",
        "&",
        "::",
        "(",
        ")",
        ":",
        ".",
        "{",
        "}",
        ";",
        "=",
        "<BOS>",
        *CPP_NEWLINES,
        "const",
        "int",
        "char",
        "vector",
        "s",
        "d",
        "po",
    }
    return sorted(i for t, i in vocab.items() if t in wanted or (t.isalpha() and t.islower() and len(t) <= 7))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_cpp_stream_equals_whole_decode(cpp, cpp_pool, data):
    pool = st.one_of(st.sampled_from(cpp_pool), st.integers(0, JSON_VOCAB + 3))
    ids = data.draw(st.lists(pool, max_size=120))
    prefix = data.draw(st.lists(pool, max_size=20))
    _check_stream(cpp, ids)
    _check_stream(cpp, ids, prefix)


class _CountingTokenizer:
    """Wraps a tokenizer and records how many ids each decode call was given."""

    def __init__(self, tok) -> None:
        self._tok = tok
        self.kind = tok.kind
        self.sizes: list[int] = []

    def decode(self, ids):
        self.sizes.append(len(ids))
        return self._tok.decode(ids)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("tik", "The quick brown fox 😀 jumps over the lazy dog. 中文文本：你好，世界！" * 60),
        ("cpp", "int main() { std::vector<int> v; return v.size() > 3 ? 0 : 1; }\n" * 60),
    ],
)
def test_stream_decodes_only_a_bounded_window(request, name, text):
    tok = request.getfixturevalue(name)
    counting = _CountingTokenizer(tok)
    ids = tok.encode(text)
    assert len(ids) > 20 * CONTEXT
    dec = StreamDecoder(counting)
    out = "".join(dec.push(i) for i in ids) + dec.flush()
    assert out == tok.decode(ids)
    # Independent of the reply's length: a cut is retried each push until one is safe.
    assert max(counting.sizes) <= 3 * CONTEXT
