"""Tokenizer loading (restricted unpickling, the fork's C++ tokenizer) and tokenizer selection."""

from __future__ import annotations

import contextlib
import copyreg
import pickle
import re
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from support import hostile_corpus as hostile
from support.tokenizer_factory import (
    CPP_CONTROL_TOKENS,
    SPECIAL_TOKENS,
    make_tiktoken_encoding,
    write_cpp_tokenizer_json,
    write_evil_pickle,
    write_tiktoken_pkl,
    write_wrong_class_pickle,
)
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from desktop.engine.errors import TokenizerError
from desktop.engine.nanochat.tokenizer import load_tokenizer, select_tokenizer

PKL_VOCAB = 512
JSON_VOCAB = 400


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    write_tiktoken_pkl(d, vocab_size=PKL_VOCAB)
    write_cpp_tokenizer_json(d, vocab_size=JSON_VOCAB)
    return d


@pytest.fixture(scope="module")
def tik(tok_dir):
    return load_tokenizer(tok_dir / "tokenizer.pkl")


@pytest.fixture(scope="module")
def cpp(tok_dir):
    return load_tokenizer(tok_dir / "tokenizer.json")


@pytest.fixture(scope="module")
def hf(tok_dir) -> HFTokenizer:
    """The same json read straight through ``tokenizers``, to look ids up independently."""
    return HFTokenizer.from_file(str(tok_dir / "tokenizer.json"))


def _pickle_encoding_state(path: Path, state: object, protocol: int = pickle.DEFAULT_PROTOCOL) -> Path:
    """Write a pickle that says ``tiktoken.core.Encoding`` with an arbitrary ``__setstate__`` state."""

    class Fake:
        __class__ = property(lambda self: tiktoken.Encoding)  # type: ignore[assignment]

        def __reduce_ex__(self, proto):
            return (copyreg.__newobj__, (tiktoken.Encoding,), state)

    path.write_bytes(pickle.dumps(Fake(), protocol=protocol))
    return path


# --- tiktoken tokenizer.pkl ------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [300, PKL_VOCAB])
def test_pkl_has_exact_vocab_and_nanochat_specials_last(tmp_path, vocab):
    tok = load_tokenizer(write_tiktoken_pkl(tmp_path, vocab_size=vocab))
    assert (tok.kind, tok.vocab_size, tok.path) == ("tiktoken", vocab, tmp_path / "tokenizer.pkl")
    first_special = vocab - len(SPECIAL_TOKENS)
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.special_id(name) == first_special + i
        assert tok.special_name(first_special + i) == name
    assert tok.bos_id == tok.special_id("<|bos|>")
    assert tok.stop_ids == {tok.special_id("<|assistant_end|>"), tok.bos_id}
    assert tok.has_chat_tokens and tok.warnings == []


def test_pkl_ordinary_ids_are_not_special(tik):
    assert tik.special_name(ord("a")) is None
    assert tik.special_id("<|endoftext|>") is None


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80))
def test_pkl_round_trips_any_text(tik, text):
    assert tik.decode(tik.encode(text)) == text


def test_pkl_encode_keeps_special_names_as_text(tik):
    text = "hi <|bos|><|assistant_end|> there"
    ids = tik.encode(text)
    assert not set(ids) & {tik.special_id(n) for n in SPECIAL_TOKENS}
    assert tik.decode(ids) == text


def test_protocol_2_pickle_loads(tmp_path):
    enc = make_tiktoken_encoding(300)
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(pickle.dumps(enc, protocol=2))
    tok = load_tokenizer(path)
    assert tok.vocab_size == 300
    assert tok.encode("hello world") == enc.encode_ordinary("hello world")


@pytest.mark.parametrize("disguised", [False, True])
def test_evil_pickle_is_refused_and_never_runs(tmp_path, disguised):
    marker = tmp_path / "pwned"
    path = write_evil_pickle(tmp_path / "tokenizer.pkl", marker, disguised=disguised)
    with pytest.raises(TokenizerError, match=r"refused to unpickle pathlib\.Path\.touch") as err:
        load_tokenizer(path)
    assert str(path) in str(err.value) and "only tiktoken.core.Encoding is allowed" in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("disguised", [False, True])
def test_evil_fixture_really_runs_code_under_plain_pickle(tmp_path, disguised):
    marker = tmp_path / "pwned"
    path = write_evil_pickle(tmp_path / "tokenizer.pkl", marker, disguised=disguised)
    # The disguised state is not a valid Encoding, but the payload has run by the time that fails.
    with contextlib.suppress(Exception):
        pickle.loads(path.read_bytes())
    assert marker.exists()


def test_wrong_class_is_refused(tmp_path):
    path = write_wrong_class_pickle(tmp_path / "tokenizer.pkl")
    with pytest.raises(TokenizerError, match=r"refused to unpickle datetime\.date"):
        load_tokenizer(path)


def test_pickle_of_plain_data_is_not_an_encoding(tmp_path):
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(pickle.dumps({"name": "rustbpe"}))
    with pytest.raises(TokenizerError, match="holds a dict, not a tiktoken Encoding"):
        load_tokenizer(path)


@pytest.mark.parametrize("data", [b"", b"\x80\x04garbage", pickle.dumps(make_tiktoken_encoding(300))[:-40]])
def test_corrupt_pickle_names_the_file(tmp_path, data):
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(data)
    with pytest.raises(TokenizerError, match="not a valid tokenizer pickle") as err:
        load_tokenizer(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_codecs_encode_is_only_a_latin1_bytes_maker(tmp_path):
    import _codecs

    class Sneaky:
        def __reduce__(self):
            return (_codecs.encode, ("x", "utf-16"))

    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(pickle.dumps(Sneaky()))
    with pytest.raises(TokenizerError, match="only allowed for latin-1"):
        load_tokenizer(path)


def _ranks(n: int = 256) -> dict[bytes, int]:
    return {bytes([b]): b for b in range(n)}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("cl100k_base", "the registered tiktoken encoding 'cl100k_base'"),
        ([1, 2], "state is a list"),
        ({"name": "x"}, "state has keys"),
        ({"name": 1, "pat_str": "a", "mergeable_ranks": _ranks(), "special_tokens": {}}, "non-text name"),
        (
            {"name": "x", "pat_str": "a", "mergeable_ranks": {"a": 0}, "special_tokens": {}},
            "map bytes to int",
        ),
        (
            {"name": "x", "pat_str": "a", "mergeable_ranks": _ranks(), "special_tokens": {"<|bos|>": "1"}},
            "map str to int",
        ),
        (
            {"name": "x", "pat_str": "a", "mergeable_ranks": _ranks(200), "special_tokens": {}},
            "lacks 56 of the 256",
        ),
        (
            {"name": "x", "pat_str": "a", "mergeable_ranks": _ranks(), "special_tokens": {"<|bos|>": 300}},
            "without gaps",
        ),
        (
            {"name": "x", "pat_str": "(", "mergeable_ranks": _ranks(), "special_tokens": {}},
            "tiktoken rejected",
        ),
    ],
)
def test_invalid_encoding_state_is_explained(tmp_path, state, message):
    path = _pickle_encoding_state(tmp_path / "tokenizer.pkl", state)
    with pytest.raises(TokenizerError, match=message):
        load_tokenizer(path)


def test_missing_and_unknown_files(tmp_path):
    with pytest.raises(TokenizerError, match=r"tokenizer\.pkl: tokenizer file not found"):
        load_tokenizer(tmp_path / "tokenizer.pkl")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: tokenizer file not found"):
        load_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(TokenizerError, match="not a tokenizer file"):
        load_tokenizer(tmp_path / "vocab.txt")


# --- the fork's C++ tokenizer.json -----------------------------------------------------------------


@pytest.mark.parametrize("vocab", [300, JSON_VOCAB])
def test_json_has_exact_vocab_and_control_tokens(tmp_path, vocab):
    tok = load_tokenizer(write_cpp_tokenizer_json(tmp_path, vocab_size=vocab))
    assert (tok.kind, tok.vocab_size) == ("cpp", vocab)
    assert tok.bos_id == CPP_CONTROL_TOKENS.index("<BOS>")
    assert tok.stop_ids == {CPP_CONTROL_TOKENS.index("<EOS>"), tok.bos_id}
    assert not tok.has_chat_tokens
    for i, name in enumerate(CPP_CONTROL_TOKENS):
        assert tok.special_name(i) == name
        assert tok.special_id(name) == i


@pytest.mark.parametrize(
    ("alias", "native"),
    [
        ("<|bos|>", "<BOS>"),
        ("<|eos|>", "<EOS>"),
        ("<|pad|>", "<PAD>"),
        ("<|endoftext|>", "<BOS>"),
        ("<|code_start|>", "<CODE_START>"),
        ("<|code_end|>", "<CODE_END>"),
        ("<|query_tool|>", "<QUERY_TOOL>"),
        ("<|thought_start|>", "<THOUGHT_START>"),
        ("<|thought_end|>", "<THOUGHT_END>"),
    ],
)
def test_json_resolves_nanochat_aliases(cpp, alias, native):
    assert cpp.special_id(alias) == CPP_CONTROL_TOKENS.index(native)


def test_json_has_no_nanochat_chat_tokens(cpp):
    assert cpp.special_id("<|user_start|>") is None
    assert cpp.special_id("<|python_start|>") is None


def test_tool_result_falls_back_to_reserved_19_with_one_warning(tmp_path):
    tok = load_tokenizer(write_cpp_tokenizer_json(tmp_path, vocab_size=300))
    assert tok.special_id("<TOOL_RESULT>") == 19
    assert tok.special_id("<|tool_result|>") == 19
    assert len(tok.warnings) == 1 and "<RESERVED_19>" in tok.warnings[0] and str(tok.path) in tok.warnings[0]


def test_tool_result_by_name_needs_no_warning(tmp_path):
    tok = load_tokenizer(write_cpp_tokenizer_json(tmp_path, vocab_size=300, tool_result_token=True))
    assert tok.special_id("<TOOL_RESULT>") == 19 and tok.special_name(19) == "<TOOL_RESULT>"
    assert tok.warnings == []


def test_json_keywords_are_single_tokens_but_not_specials(cpp, hf):
    ids = cpp.encode("int x")
    assert ids[0] == hf.token_to_id("int")
    assert cpp.special_name(ids[0]) is None and cpp.special_id("int") is None


def test_json_encode_does_not_turn_typed_control_names_into_controls(cpp, hf):
    text = "x <BOS> y <CODE_END><RESERVED_19>"
    ids = cpp.encode(text)
    assert not set(ids) & set(range(len(CPP_CONTROL_TOKENS)))
    # Plain HF encoding, by contrast, does make them control tokens.
    assert hf.token_to_id("<BOS>") in hf.encode(text).ids


def _ids(hf: HFTokenizer, *tokens: str) -> list[int]:
    found = [hf.token_to_id(t) for t in tokens]
    assert None not in found, tokens
    return found


@pytest.mark.parametrize(
    ("tokens", "text"),
    [
        (("is", "_", "p", "r", "i", "m", "e"), "is_prime"),  # underscore identifiers keep joining
        (("char", "*"), "char*"),  # declarator after a type keyword
        (("x", "=", "1", ";"), "x = 1;"),  # spaced binary operator, glued semicolon
        (("std", "::", "vector", "<", "int", ">"), "std::vector<int>"),  # scope and template brackets
        (("f", "(", "a", ",", "b", ")", "{"), "f(a, b) {"),  # calls hug parentheses, space before {
        (("x", "\n", "y"), "x\ny"),  # no spaces around newlines
        (("<CODE_START>", "x", "<CODE_END>"), "<CODE_START>x<CODE_END>"),  # nor around control tokens
        (("a", ".", "b", "->", "c"), "a.b->c"),  # member access glues
    ],
)
def test_json_decode_rebuilds_cpp_spacing(cpp, hf, tokens, text):
    assert cpp.decode(_ids(hf, *tokens)) == text


def test_json_decode_of_unknown_id_is_unk(cpp):
    assert cpp.decode([cpp.vocab_size + 7]) == "<UNK>"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, JSON_VOCAB - 1), max_size=40), st.data())
def test_json_decode_only_ever_appends(cpp, ids, data):
    cut = data.draw(st.integers(0, len(ids)))
    assert cpp.decode(ids).startswith(cpp.decode(ids[:cut]))


def test_corrupt_json_names_the_file(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("{not json")
    with pytest.raises(TokenizerError, match=r"not a valid tokenizer\.json") as err:
        load_tokenizer(path)
    assert str(err.value).startswith(str(path))


def test_json_without_bos_is_not_the_fork_tokenizer(tmp_path):
    path = tmp_path / "tokenizer.json"
    HFTokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>")).save(str(path))
    with pytest.raises(TokenizerError, match="no <BOS> token"):
        load_tokenizer(path)


# --- select_tokenizer ------------------------------------------------------------------------------


def test_select_prefers_pkl_for_upstream_and_json_for_fork(tmp_path):
    write_tiktoken_pkl(tmp_path, vocab_size=300)
    write_cpp_tokenizer_json(tmp_path, vocab_size=300)
    up = select_tokenizer([tmp_path], 300, is_fork=False)
    assert up.kind == "tiktoken" and any("also has tokenizer.json" in w for w in up.warnings)
    fork = select_tokenizer([tmp_path], 300, is_fork=True)
    assert fork.kind == "cpp" and any("also has tokenizer.pkl" in w for w in fork.warnings)


def test_select_prefers_the_file_whose_vocab_matches(tmp_path):
    write_tiktoken_pkl(tmp_path, vocab_size=PKL_VOCAB)
    write_cpp_tokenizer_json(tmp_path, vocab_size=300)
    assert select_tokenizer([tmp_path], 300, is_fork=False).kind == "cpp"
    assert select_tokenizer([tmp_path], PKL_VOCAB, is_fork=True).kind == "tiktoken"


def test_select_searches_directories_in_order(tmp_path):
    first, second, third = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_tiktoken_pkl(first, vocab_size=PKL_VOCAB)  # wrong size: skipped
    write_tiktoken_pkl(second, vocab_size=300)
    write_tiktoken_pkl(third, vocab_size=300)
    dirs = [tmp_path / "missing", first, second, third]
    assert select_tokenizer(dirs, 300, is_fork=False).path == second / "tokenizer.pkl"


def test_select_reports_nothing_found_with_the_places_looked(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    with pytest.raises(TokenizerError, match=r"no tokenizer found \(looked in: .*a, .*b\)"):
        select_tokenizer([a, b], 300, is_fork=False)


def test_select_reports_vocab_mismatch(tmp_path):
    path = write_tiktoken_pkl(tmp_path, vocab_size=300)
    with pytest.raises(TokenizerError) as err:
        select_tokenizer([tmp_path], 320, is_fork=False)
    assert str(err.value).startswith(f"{path}: tokenizer vocab 300 does not match the model's vocab_size 320")
    other = write_cpp_tokenizer_json(tmp_path, vocab_size=JSON_VOCAB)
    with pytest.raises(TokenizerError, match=re.escape(f"(also checked: {other})")):
        select_tokenizer([tmp_path], 320, is_fork=False)


def test_select_explicit_file_wins_and_must_match(tmp_path):
    write_tiktoken_pkl(tmp_path / "dir", vocab_size=300)
    explicit = write_cpp_tokenizer_json(tmp_path / "mine", vocab_size=300)
    assert select_tokenizer([tmp_path / "dir"], 300, is_fork=False, explicit=explicit).path == explicit
    with pytest.raises(TokenizerError, match="tokenizer vocab 300 does not match the model's vocab_size 512"):
        select_tokenizer([tmp_path / "dir"], 512, is_fork=False, explicit=explicit)
    with pytest.raises(TokenizerError, match=r"nope\.json: tokenizer file not found"):
        select_tokenizer([tmp_path / "dir"], 300, is_fork=False, explicit=tmp_path / "nope.json")


def test_select_explicit_directory_is_searched_first(tmp_path):
    write_tiktoken_pkl(tmp_path / "dir", vocab_size=300)
    explicit = write_tiktoken_pkl(tmp_path / "mine", vocab_size=300).parent
    tok = select_tokenizer([tmp_path / "dir"], 300, is_fork=False, explicit=explicit)
    assert tok.path == explicit / "tokenizer.pkl"


def test_select_raises_on_an_unsafe_pickle_instead_of_skipping_it(tmp_path):
    marker = tmp_path / "pwned"
    write_evil_pickle(tmp_path / "tokenizer.pkl", marker)
    write_cpp_tokenizer_json(tmp_path, vocab_size=300)
    with pytest.raises(TokenizerError, match="refused to unpickle"):
        select_tokenizer([tmp_path], 300, is_fork=False)
    # A fork checkpoint takes the matching json first and never unpickles anything.
    assert select_tokenizer([tmp_path], 300, is_fork=True).kind == "cpp"
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# the pickle pre-scan and the split pattern: refused before the unpickler or tiktoken runs


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (hostile.deep_tuples(), "refused to unpickle: the pickle nests containers deeper than 32 levels"),
        (hostile.deep_frozensets(), "refused to unpickle: the pickle opens more than 32 nested MARKs"),
        (
            hostile.bytearray_bomb(),
            "refused to unpickle builtins.bytearray (only tiktoken.core.Encoding is allowed)",
        ),
        (
            hostile.declared_string(),
            "not a valid tokenizer pickle (the pickle is cut off (expected 4600000000 bytes in a "
            "unicodestring8, but only 4 remain))",
        ),
        (
            hostile.missing_memo(),
            "not a valid tokenizer pickle (the pickle reads memo slot 5, which was never written)",
        ),
        (hostile.empty_stack(), "not a valid tokenizer pickle (TUPLE1 at byte 2 finds too few items)"),
        (hostile.text_persistent_id(), "not a valid tokenizer pickle (text persistent ids are not allowed)"),
    ],
)
def test_hostile_tokenizer_pickles_are_refused_by_the_scan(tmp_path, body, message):
    path = hostile.write_pickle(tmp_path / "tokenizer.pkl", body)
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(path)
    assert str(err.value) == f"{path}: {message}"


def test_code_in_a_tokenizer_pickle_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = hostile.write_pickle(tmp_path / "tokenizer.pkl", hostile.code_payload(marker))
    with pytest.raises(TokenizerError, match=re.escape("refused to unpickle os.system")):
        load_tokenizer(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        (r"\s*|\w+", "the split pattern can match the empty string, which crashes tiktoken"),
        (r"(?=x)|\w+", "the split pattern can match the empty string, which crashes tiktoken"),
        (
            r"(\w+)+!",
            "the split pattern repeats a group that itself repeats, which can take exponential time",
        ),
        ("a" * 5000, "the split pattern is 5000 characters long (limit 4096)"),
    ],
)
def test_split_patterns_that_crash_or_hang_tiktoken_are_refused(tmp_path, pattern, problem):
    path = hostile.encoding_state_pickle(tmp_path / "tokenizer.pkl", pattern)
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(path)
    assert str(err.value) == f"{path}: {problem}"


def test_the_scanned_pickle_is_the_one_tiktoken_builds(tmp_path):
    from support.tokenizer_factory import SPLIT_PATTERN

    path = hostile.encoding_state_pickle(tmp_path / "tokenizer.pkl", SPLIT_PATTERN)
    assert load_tokenizer(path).encode("hello world") == make_tiktoken_encoding(300).encode_ordinary(
        "hello world"
    )


# ---------------------------------------------------------------------------------------------------
# tokenizer.json is read as JSON and checked before the Rust library sees it


def _edited_json(tmp_path: Path, edit) -> Path:
    path = write_cpp_tokenizer_json(tmp_path / "t", vocab_size=JSON_VOCAB)
    return hostile.edit_tokenizer_json(path, edit)


def _padding(length):
    return lambda d: d.update(
        padding={
            "strategy": {"Fixed": length},
            "direction": "Right",
            "pad_id": 0,
            "pad_type_id": 0,
            "pad_token": "<PAD>",
            "pad_to_multiple_of": None,
        }
    )


def _normalizer(node):
    return lambda d: d.update(normalizer=node)


def _split_regex(pattern):
    def edit(d):
        d["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}

    return edit


_REPLACE_A = {"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_padding(10**10), "the padding length is 10000000000, outside 0..1048576"),
        (_padding(3 * 10**8), "the padding length is 300000000, outside 0..1048576"),
        (
            lambda d: d.update(truncation={"max_length": 10**12, "stride": 0, "strategy": "LongestFirst"}),
            "the truncation length is 1000000000000, outside 0..1048576",
        ),
        (
            _normalizer({"type": "Replace", "pattern": {"String": "a"}, "content": "x" * 10_000}),
            "the normalizer can make a text over 256 times longer",
        ),
        (
            _normalizer({"type": "Sequence", "normalizers": [_REPLACE_A] * 40}),
            "the normalizer can make a text over 256 times longer",
        ),
        (
            _normalizer({"type": "Precompiled", "precompiled_charsmap": "AAAA"}),
            "the normalizer has normalizer type 'Precompiled', which Nanoscope does not run",
        ),
        (
            _split_regex(r"(\w+)+;"),
            "the pre_tokenizer.pretokenizers[0] (Split): the split pattern repeats a group that itself "
            "repeats, which can take exponential time",
        ),
        (lambda d: d.pop("model"), "it has no model object"),
    ],
)
def test_tokenizer_json_settings_that_abort_or_explode_are_refused(tmp_path, edit, problem):
    path = _edited_json(tmp_path, edit)
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(path)
    assert str(err.value) == f"{path}: refused tokenizer.json: {problem}"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (hostile.deep_json(), "nested deeper than 64 levels"),
        (hostile.huge_int_json(), "a number has more than 4300 digits"),
        ('{"model": {"dropout": NaN}}', "NaN is not a JSON value"),
    ],
)
def test_tokenizer_json_that_python_would_choke_on(tmp_path, text, problem):
    path = tmp_path / "tokenizer.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(path)
    assert str(err.value) == f"{path}: not a valid tokenizer.json ({problem})"


def test_padding_and_truncation_are_ignored_with_a_warning(tmp_path, cpp):
    path = _edited_json(
        tmp_path,
        lambda d: (
            _padding(64)(d),
            d.update(truncation={"max_length": 3, "stride": 0, "strategy": "LongestFirst"}),
        ),
    )
    tok = load_tokenizer(path)
    text = "int main ( ) { return 0 ; }"
    assert tok.encode(text) == cpp.encode(text)
    assert tok.warnings == [
        "tokenizer.json asks for padding; Nanoscope encodes prompts unpadded and ignores it",
        "tokenizer.json truncates encodings to 3 tokens; Nanoscope never cuts a prompt there and ignores it",
    ]


def test_a_panic_inside_the_library_is_a_tokenizer_error(tmp_path, monkeypatch):
    """A PanicException is a BaseException: uncaught, it used to end the worker thread without a
    signal. The load-time check refuses the nested pattern that causes this one, so the library
    object is swapped in behind the check's back."""
    tok = load_tokenizer(write_cpp_tokenizer_json(tmp_path / "t", vocab_size=JSON_VOCAB))
    raw = _edited_json(tmp_path / "raw", _split_regex(r"(a+)+;"))
    monkeypatch.setattr(tok, "_hf", HFTokenizer.from_file(str(raw)))
    with pytest.raises(TokenizerError) as err:
        tok.encode("a" * 5000)
    assert str(err.value).startswith(f"{tok.path}: the tokenizer crashed while encoding (Onig: ")


def test_a_lone_surrogate_encodes_as_the_replacement_character(cpp, tik):
    for tok in (cpp, tik):
        assert tok.encode("int a\ud800b;") == tok.encode("int a\ufffdb;")


_LINES = st.lists(
    st.text(alphabet=st.sampled_from(list("abc xyz(){};=+\n\t 12é世")), max_size=60),
    min_size=300,
    max_size=400,
)


@settings(max_examples=15, deadline=None)
@given(lines=_LINES)
def test_long_texts_encode_in_chunks_to_the_same_ids(tik, cpp, lines):
    from desktop.engine.files.tokenizer_checks import CHUNK_CHARS, text_chunks

    unit = "\n".join(lines) + "\nend;\n"
    text = unit * (2 * CHUNK_CHARS // len(unit) + 2)
    assert len(list(text_chunks(text))) > 1
    assert "".join(text_chunks(text)) == text
    whole = tik._enc.encode_ordinary(text)
    assert tik.encode(text) == whole
    assert cpp.encode(text) == cpp._encode(text)


def test_stop_reaches_a_long_encoding(tik):
    import threading

    from desktop.engine.files.tokenizer_checks import EncodingCancelled

    cancel = threading.Event()
    cancel.set()
    text = "word word\n" * 5000
    with pytest.raises(EncodingCancelled):
        tik.encode(text, cancel)
    assert tik.encode("short text", cancel) == tik._enc.encode_ordinary("short text")
