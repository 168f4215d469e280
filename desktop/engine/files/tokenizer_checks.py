"""Checks on tokenizer files before a Rust tokenizer library sees them, and a guard around its calls.

Both tokenizer libraries are Rust. Some inputs abort the process outright (a ``tokenizer.json``
padding length of 1e10 fails an allocation: SIGABRT), some run for minutes and take tens of GB
(padding to 3e8, a normalizer that grows every character 10 000-fold), and some raise pyo3's
``PanicException``, which derives from ``BaseException`` and so slips past ``except Exception``
(a split pattern that matches the empty string in tiktoken, a regex that exhausts Oniguruma's
retry limit in ``tokenizers``). So:

* :func:`checked_tokenizer_json` reads a ``tokenizer.json`` as plain JSON first and refuses, or
  drops, what cannot be run safely;
* :func:`pattern_problem` looks at a split regex for nested repetition (exponential
  backtracking) and, for tiktoken, for matches of the empty string;
* :func:`rust_errors` turns a panic (or any library error) inside a call into a
  :class:`TokenizerError`;
* :func:`text_chunks` cuts a long text where neither tokenizer's pieces can cross, so a pattern
  that is quadratic in the length of what it scans costs linear time, and encoding can stop
  between chunks when asked to.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from desktop.engine.errors import TokenizerError
from desktop.engine.files.bounded import FileMissing, FileRefused, read_text
from desktop.engine.files.safe_json import JsonRefused, loads_bounded
from desktop.engine.text_lines import error_text

MAX_VOCAB = 1 << 22
MAX_LENGTH = 1 << 20  # padding / truncation lengths beyond this are not a real setting
MAX_EXPANSION = 256  # how many times longer the normalizers may make a text, at worst
MAX_PATTERN_CHARS = 4096
MAX_ADDED_TOKEN_CHARS = 4096

# Worst-case growth, in characters, of one pass of each normalizer (Unicode: NFKC/NFKD of U+FDFA
# is 18 characters; full case mapping at most 3; BERT's CJK spacing triples a character; byte-level
# maps each of up to 4 UTF-8 bytes to a character).
_GROWTH = {
    "NFC": 3,
    "NFD": 4,
    "NFKC": 18,
    "NFKD": 18,
    "Lowercase": 3,
    "Strip": 1,
    "StripAccents": 1,
    "Nmt": 1,
    "BertNormalizer": 9,
    "ByteLevel": 4,
}

# Probes for a tiktoken split pattern: a pattern that matches the empty string anywhere here
# makes tiktoken panic; these cover letters, digits, spaces, newlines, punctuation and non-ASCII.
_PROBES = ("", "a", " ", "\n", "1", "!", "hello world\n\n  x = 12;\r\n", "héllo 世界 😀", "'s 's\t\t.")


class TokenizerLibraryError(TokenizerError):
    """The tokenizer library failed (or panicked) on an input."""


class EncodingCancelled(TokenizerError):
    """Stop was pressed while a long prompt was being encoded."""


# Texts longer than this are encoded a chunk at a time.
CHUNK_CHARS = 4096
# A line break followed by a non-space character. Neither nanochat's split pattern (GPT-4 style:
# no piece runs from a newline into a following non-space character) nor the fork's (its newline
# tokens are whole runs of line breaks, its words never span one) puts a piece across it, and
# encoding restarts there in the same state, so chunked and whole encodings are the same ids.
_BOUNDARY = re.compile(r"\n(?=\S)")


def rust_tokenizer_digest(tokenizer: Any) -> str:
    """What a ``tokenizers`` tokenizer is, by content: the hash of its own serialization (the
    vocabulary in id order, merges, added tokens, normalizer, pre-tokenizer and decoder), so two
    files that give ids the same meaning agree whatever their names, whitespace or key order."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


def text_chunks(text: str) -> Iterator[str]:
    """``text`` in pieces of about :data:`CHUNK_CHARS`, cut only at a :data:`_BOUNDARY`.

    A text with no such boundary (one enormous line) stays whole.
    """
    start = 0
    while len(text) - start > 2 * CHUNK_CHARS:
        found = _BOUNDARY.search(text, start + CHUNK_CHARS)
        if found is None:
            break
        yield text[start : found.end()]
        start = found.end()
    yield text[start:]


def encode_in_chunks(
    encode: Callable[[str], list[int]], text: str, cancel: threading.Event | None, path: Path
) -> list[int]:
    """``encode`` over :func:`text_chunks`, checking ``cancel`` between chunks."""
    ids: list[int] = []
    for i, chunk in enumerate(text_chunks(text)):
        if i and cancel is not None and cancel.is_set():
            raise EncodingCancelled(f"{path}: stopped while encoding the prompt")
        ids.extend(encode(chunk))
    return ids


def utf8_encodable(text: str) -> str:
    """``text`` with lone surrogates (which no UTF-8 encoder accepts) replaced by U+FFFD, the way
    tiktoken itself repairs them; anything else is returned unchanged. For what a tokenizer
    encodes (line breaks and all); what is shown goes through ``text_lines.one_line`` instead."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


@contextmanager
def rust_errors(path: Path, doing: str) -> Iterator[None]:
    """Run a tokenizer-library call; a panic or library error becomes one :class:`TokenizerError`.

    ``PanicException`` is a ``BaseException``: left alone it ends the worker thread without any
    signal. KeyboardInterrupt and SystemExit still pass through.
    """
    try:
        yield
    except TokenizerError:
        raise
    except Exception as exc:
        raise TokenizerLibraryError(
            f"{path}: the tokenizer failed while {doing} ({error_text(exc)})"
        ) from None
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise TokenizerLibraryError(
            f"{path}: the tokenizer crashed while {doing} ({error_text(exc)})"
        ) from None


def nested_repetition(pattern: str) -> bool:
    """True when a repeated group contains a repetition, as in ``(a+)+`` or ``(\\s*x*)*``.

    Such patterns backtrack exponentially on a near-match. Possessive quantifiers (``a++``) and
    atomic groups (``(?>...)``) never backtrack into, so they do not count. A rough parse: escapes
    and character classes are skipped, groups are tracked by parentheses.
    """
    inner: list[bool] = [False]  # per open group: does it contain a backtracking repetition?
    atomic: list[bool] = [False]
    last_group: bool | None = None  # the previous atom was a group; did it repeat inside?
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            if i < n + 1 and pattern[i - 1 : i] in ("p", "P", "x", "u", "N") and pattern[i : i + 1] == "{":
                i = pattern.find("}", i) + 1 or n
            last_group = None
            continue
        if c == "[":
            i = _class_end(pattern, i)
            last_group = None
            continue
        if c == "(":
            inner.append(False)
            atomic.append(pattern.startswith("(?>", i))
            i += 1
            last_group = None
            continue
        if c == ")" and len(inner) > 1:
            repeats, was_atomic = inner.pop(), atomic.pop()
            last_group = repeats and not was_atomic
            inner[-1] = inner[-1] or last_group
            i += 1
            continue
        repeat, width = _quantifier(pattern, i)
        if width:
            possessive = pattern[i + width : i + width + 1] == "+"
            if repeat and not possessive:
                if last_group:
                    return True
                inner[-1] = True
            i += width + possessive
            last_group = None
            continue
        last_group = None
        i += 1
    return False


def _class_end(pattern: str, i: int) -> int:
    """Index just past the character class starting at ``pattern[i] == "["``."""
    j = i + 1
    if pattern[j : j + 1] == "^":
        j += 1
    if pattern[j : j + 1] == "]":
        j += 1
    depth = 1
    while j < len(pattern) and depth:
        if pattern[j] == "\\":
            j += 2
            continue
        if pattern[j] == "[":
            depth += 1
        elif pattern[j] == "]":
            depth -= 1
        j += 1
    return j


def _quantifier(pattern: str, i: int) -> tuple[bool, int]:
    """(does it repeat more than once, its length) of a quantifier at ``i``, or (False, 0)."""
    c = pattern[i]
    if c in "*+":
        return True, 1 + (pattern[i + 1 : i + 2] == "?")
    if c == "?":
        return False, 1
    if c == "{":
        end = pattern.find("}", i)
        body = pattern[i + 1 : end] if end > 0 else ""
        low, comma, high = body.partition(",")
        if low.strip().isdigit() and (not high.strip() or high.strip().isdigit()):
            repeats = (bool(comma) and (not high.strip() or int(high) > 1)) or int(low) > 1
            return repeats, end - i + 1 + (pattern[end + 1 : end + 2] == "?")
    return False, 0


def pattern_problem(pattern: object, *, empty_matches_crash: bool) -> str | None:
    """Why ``pattern`` (a split regex) cannot be used, or None.

    ``empty_matches_crash``: tiktoken panics on an empty match, so probe for one there.
    """
    if not isinstance(pattern, str):
        return "the split pattern is not text"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"the split pattern is {len(pattern)} characters long (limit {MAX_PATTERN_CHARS})"
    if nested_repetition(pattern):
        return "the split pattern repeats a group that itself repeats, which can take exponential time"
    if empty_matches_crash:
        import regex  # tiktoken's own dependency, with the same \\p{..} and possessive syntax

        try:
            compiled = regex.compile(pattern)
        except regex.error:
            return None  # its own syntax: the load-time probe through tiktoken decides
        for probe in _PROBES:
            if any(m.end() == m.start() for m in compiled.finditer(probe)):
                return "the split pattern can match the empty string, which crashes tiktoken"
    return None


# --- tokenizer.json -----------------------------------------------------------------------------


class _Refused(Exception):
    pass


def _int_in(value: Any, name: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise _Refused(f"{name} is {str(value)[:40]}, outside 0..{limit}")
    return value


def _sequence_growth(node: dict[str, Any], where: str, key: str, measure: Any) -> int:
    """The product of a ``Sequence``'s children's growth (stopping once it passes the limit)."""
    children = node.get(key)
    if not isinstance(children, list):
        raise _Refused(f"{where}.{key} is not a list")
    factor = 1
    for i, child in enumerate(children):
        factor *= measure(child, f"{where}.{key}[{i}]")
        if factor > MAX_EXPANSION:
            break
    return factor


def _replace_growth(node: dict[str, Any], where: str, *, empty_matches_crash: bool) -> int:
    """How much longer a ``Replace`` can make a text: by the ratio of its texts for a literal
    (the empty literal is refused: it matches between every two characters), by its content's
    length plus one for a regex that may match one character (or, where allowed, nothing)."""
    content, pattern = node.get("content"), node.get("pattern")
    if not isinstance(content, str) or not isinstance(pattern, dict):
        raise _Refused(f"{where} (Replace) needs a pattern and a text")
    literal = pattern.get("String")
    if isinstance(literal, str):
        if not literal:
            raise _Refused(f"{where} (Replace) replaces the empty text")
        return max(1, -(-len(content) // len(literal)))
    problem = pattern_problem(pattern.get("Regex"), empty_matches_crash=empty_matches_crash)
    if problem:
        raise _Refused(f"{where} (Replace): {problem}")
    return len(content) + 1


def _expansion(node: Any, where: str) -> int:
    """Worst-case growth factor of a normalizer (tree)."""
    if node is None:
        return 1
    if not isinstance(node, dict):
        raise _Refused(f"{where} is not an object")
    kind = node.get("type")
    if kind == "Sequence":
        return _sequence_growth(node, where, "normalizers", _expansion)
    if kind in _GROWTH:
        return _GROWTH[kind]
    if kind == "Replace":
        return _replace_growth(node, where, empty_matches_crash=False)
    if kind == "Prepend":
        prepend = node.get("prepend")
        if not isinstance(prepend, str) or len(prepend) > MAX_ADDED_TOKEN_CHARS:
            raise _Refused(f"{where} (Prepend) has no short prepend text")
        return 1 + len(prepend)  # at most once per character, if split first
    raise _Refused(f"{where} has normalizer type {str(kind)[:40]!r}, which Nanoscope does not run")


def _check_pre_tokenizer(node: Any, where: str) -> None:
    if node is None:
        return
    if not isinstance(node, dict):
        raise _Refused(f"{where} is not an object")
    kind = node.get("type")
    if kind == "Sequence":
        children = node.get("pretokenizers")
        if not isinstance(children, list):
            raise _Refused(f"{where}.pretokenizers is not a list")
        for i, child in enumerate(children):
            _check_pre_tokenizer(child, f"{where}.pretokenizers[{i}]")
    elif kind == "Split":
        pattern = node.get("pattern")
        if not isinstance(pattern, dict):
            raise _Refused(f"{where} (Split) has no pattern")
        if "Regex" in pattern:
            problem = pattern_problem(pattern["Regex"], empty_matches_crash=False)
            if problem:
                raise _Refused(f"{where} (Split): {problem}")
        elif not isinstance(pattern.get("String"), str) or len(pattern["String"]) > MAX_PATTERN_CHARS:
            raise _Refused(f"{where} (Split) has no usable pattern")
    elif kind == "Metaspace":
        replacement = node.get("replacement")
        if not isinstance(replacement, str) or len(replacement) > 8:
            raise _Refused(f"{where} (Metaspace) replacement must be a short text")


# Decoders that keep or shrink a token's text, or grow it by a bounded amount.
_PLAIN_DECODERS = frozenset(
    {"ByteLevel", "Metaspace", "WordPiece", "BPEDecoder", "CTC", "Fuse", "Strip", "ByteFallback"}
)


def _decoder_expansion(node: Any, where: str) -> int:
    """Worst-case growth factor of a decoder (tree): ``Replace`` of the empty text, or of one
    character by a long one, makes a decode take gigabytes (the process aborts)."""
    if node is None:
        return 1
    if not isinstance(node, dict):
        raise _Refused(f"{where} is not an object")
    kind = node.get("type")
    if kind == "Sequence":
        return _sequence_growth(node, where, "decoders", _decoder_expansion)
    if kind in _PLAIN_DECODERS:
        return 1
    if kind == "Replace":
        return _replace_growth(node, where, empty_matches_crash=True)
    raise _Refused(f"{where} has decoder type {str(kind)[:40]!r}, which Nanoscope does not run")


def _ignored_lengths(doc: dict[str, Any], warnings: list[str]) -> bool:
    """Padding and truncation are dropped: prompts are encoded whole and unpadded. Absurd values
    are refused all the same (they betray a broken or hostile file). True when there were any."""
    padding, truncation = doc.get("padding"), doc.get("truncation")
    if padding is not None:
        if not isinstance(padding, dict):
            raise _Refused("padding is not an object")
        strategy = padding.get("strategy")
        if isinstance(strategy, dict):
            _int_in(strategy.get("Fixed"), "the padding length", MAX_LENGTH)
        if padding.get("pad_to_multiple_of") is not None:
            _int_in(padding["pad_to_multiple_of"], "padding's pad_to_multiple_of", MAX_LENGTH)
        warnings.append("tokenizer.json asks for padding; Nanoscope encodes prompts unpadded and ignores it")
    if truncation is not None:
        if not isinstance(truncation, dict):
            raise _Refused("truncation is not an object")
        length = _int_in(truncation.get("max_length"), "the truncation length", MAX_LENGTH)
        _int_in(truncation.get("stride", 0), "truncation's stride", MAX_LENGTH)
        warnings.append(
            f"tokenizer.json truncates encodings to {length} tokens; Nanoscope never cuts a prompt "
            "there and ignores it"
        )
    doc["padding"] = None
    doc["truncation"] = None
    return padding is not None or truncation is not None


def id_space(tok: Any) -> int:
    """One past the largest id a ``tokenizers`` tokenizer can produce: its vocabulary size, or
    more when an id is out of sequence. An id beyond a model's embedding fails in the forward."""
    ids = tok.get_vocab(with_added_tokens=True).values()
    return max(len(ids), max(ids, default=-1) + 1)


def checked_tokenizer_json(path: Path) -> tuple[str, list[str]]:
    """The JSON text to give ``tokenizers`` for ``path`` and the warnings to show, or a
    :class:`TokenizerError` naming what cannot be run."""
    try:
        text = read_text(path, "tokenizer")
        doc = loads_bounded(text)
    except FileMissing:
        raise TokenizerError(f"{path}: tokenizer file not found") from None
    except FileRefused as exc:
        raise TokenizerError(str(exc)) from None
    except JsonRefused as exc:
        raise TokenizerError(f"{path}: not a valid tokenizer.json ({exc})") from None
    warnings: list[str] = []
    try:
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            raise _Refused("it has no model object")
        edited = _ignored_lengths(doc, warnings)
        growth = _expansion(doc.get("normalizer"), "the normalizer")
        if growth > MAX_EXPANSION:
            raise _Refused(f"the normalizer can make a text over {MAX_EXPANSION} times longer")
        _check_pre_tokenizer(doc.get("pre_tokenizer"), "the pre_tokenizer")
        if _decoder_expansion(doc.get("decoder"), "the decoder") > MAX_EXPANSION:
            raise _Refused(f"the decoder can make a text over {MAX_EXPANSION} times longer")
        vocab = doc["model"].get("vocab")
        if isinstance(vocab, (dict, list)) and len(vocab) > MAX_VOCAB:
            raise _Refused(f"its vocabulary has {len(vocab)} entries (limit {MAX_VOCAB})")
        added = doc.get("added_tokens", [])
        if not isinstance(added, list) or len(added) > MAX_VOCAB:
            raise _Refused("added_tokens is not a list of tokens")
        for token in added:
            content = token.get("content") if isinstance(token, dict) else None
            if not isinstance(content, str) or len(content) > MAX_ADDED_TOKEN_CHARS:
                raise _Refused("an added token has no short text")
    except _Refused as exc:
        raise TokenizerError(f"{path}: refused tokenizer.json: {exc}") from None
    if not edited:
        return text, warnings  # the text that was checked, as it is
    import json

    return json.dumps(doc, ensure_ascii=False), warnings
