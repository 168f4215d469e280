"""Load nanochat's ``tokenizer.pkl`` without running arbitrary pickle code.

nanochat saves its tokenizer as ``pickle.dump(tiktoken.Encoding)``. A plain ``pickle.load`` of a
file someone sent you can execute anything, so this module unpickles with the restricted
unpickler (:mod:`.restricted_unpickler`) given exactly one global, ``tiktoken.core.Encoding``,
mapped to a harmless stub that only records the state dict ``Encoding.__getstate__`` wrote. Once
the state is validated, the real encoding is built with ``tiktoken.Encoding(**state)``.

Protocol 2 pickles spell bytes as ``_codecs.encode(text, "latin1")``; that one call is replaced by
a local function that can do nothing but turn latin-1 text back into bytes.

Before that unpickler runs, :mod:`.pickle_scan` walks the opcodes (nesting, sizes, memo, the same
two names), so a pickle that would crash or exhaust the C unpickler is refused first. The split
pattern is checked before tiktoken compiles it (:mod:`.tokenizer_checks`), and the finished
encoding encodes a probe text, so a pattern that makes tiktoken panic fails here, at load time.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import tiktoken

from desktop.engine.errors import TokenizerError
from desktop.engine.files.pickle_policy import TOKENIZER_POLICY
from desktop.engine.files.pickle_scan import PickleRefused, scan_tokenizer_pickle
from desktop.engine.files.restricted_unpickler import GlobalRefused, RestrictedUnpickler
from desktop.engine.files.tokenizer_checks import pattern_problem, rust_errors
from desktop.engine.text_lines import error_text

# A real 2**17-token pickle is a few MB; anything far bigger is not a tokenizer.
MAX_PICKLE_BYTES = TOKENIZER_POLICY.max_bytes
PROBE_TEXT = "Hello, world! 12345 \n\n  héllo 世界 😀 it's <|bos|>\t."

_STATE_KEYS = frozenset({"name", "pat_str", "mergeable_ranks", "special_tokens"})


class _EncodingStub:
    """Stands in for ``tiktoken.core.Encoding`` while unpickling: it only stores the state."""

    def __init__(self) -> None:
        # Never called by NEWOBJ; defining it with no arguments makes a REDUCE-style
        # ``Encoding(evil...)`` call fail instead of doing anything.
        self.state: object = None

    def __setstate__(self, state: object) -> None:
        self.state = state


def _latin1_bytes(text: object, encoding: object = "latin1", errors: object = "strict") -> bytes:
    """The only thing protocol 2 asks ``_codecs.encode`` for: latin-1 text back to bytes."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise pickle.UnpicklingError("_codecs.encode is only allowed for latin-1 bytes")
    return text.encode("latin-1")


# The only globals a tokenizer pickle may name.
_GLOBALS = {("tiktoken.core", "Encoding"): _EncodingStub, ("_codecs", "encode"): _latin1_bytes}


def _validate_state(path: Path, state: object) -> dict[str, Any]:
    """Check the recorded state has exactly the types ``tiktoken.Encoding(**state)`` expects."""
    if isinstance(state, str):
        # tiktoken pickles its registered encodings (cl100k_base...) by name; building one of those
        # could download files, and nanochat never writes them.
        raise TokenizerError(
            f"{path}: pickle names the registered tiktoken encoding {state!r}, not a nanochat one"
        )
    if not isinstance(state, dict):
        raise TokenizerError(f"{path}: tokenizer pickle state is a {type(state).__name__}, not a dict")
    if set(state) != _STATE_KEYS:
        keys = ", ".join(sorted(map(repr, state)))
        raise TokenizerError(
            f"{path}: tokenizer pickle state has keys {keys}, expected {sorted(_STATE_KEYS)}"
        )
    if not isinstance(state["name"], str) or not isinstance(state["pat_str"], str):
        raise TokenizerError(f"{path}: tokenizer pickle has a non-text name or split pattern")
    ranks, specials = state["mergeable_ranks"], state["special_tokens"]
    if not isinstance(ranks, dict) or not all(type(k) is bytes and type(v) is int for k, v in ranks.items()):
        raise TokenizerError(f"{path}: mergeable_ranks must map bytes to int")
    if not isinstance(specials, dict) or not all(
        type(k) is str and type(v) is int for k, v in specials.items()
    ):
        raise TokenizerError(f"{path}: special_tokens must map str to int")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        # tiktoken silently drops text it cannot spell with its byte tokens.
        raise TokenizerError(f"{path}: mergeable_ranks lacks {len(missing)} of the 256 single-byte tokens")
    ids = sorted([*ranks.values(), *specials.values()])
    if ids != list(range(len(ids))):
        raise TokenizerError(f"{path}: token ids are not exactly 0..{len(ids) - 1} without gaps or repeats")
    return state


def load_tiktoken_pickle(path: Path) -> tiktoken.Encoding:
    """Build the ``tiktoken.Encoding`` stored in a nanochat ``tokenizer.pkl``, refusing anything else.

    Raises :class:`TokenizerError` (naming ``path``) for a missing, oversized, corrupt or unsafe file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise TokenizerError(f"{path}: tokenizer file not found") from None
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read tokenizer file ({error_text(exc)})") from exc
    if size > MAX_PICKLE_BYTES:
        raise TokenizerError(f"{path}: {size} bytes is too large for a tokenizer pickle")
    try:
        data = scan_tokenizer_pickle(path)
        obj = RestrictedUnpickler(data, _GLOBALS).load()
    except GlobalRefused as exc:
        raise TokenizerError(
            f"{path}: refused to unpickle {exc.module}.{exc.name} (only tiktoken.core.Encoding is allowed)"
        ) from None
    except PickleRefused as exc:
        raise TokenizerError(_refusal(path, exc)) from None
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read tokenizer file ({error_text(exc)})") from None
    except Exception as exc:  # corrupt data raises many kinds (UnpicklingError, EOFError, ValueError...)
        raise TokenizerError(f"{path}: not a valid tokenizer pickle ({error_text(exc)})") from exc
    if not isinstance(obj, _EncodingStub):
        raise TokenizerError(f"{path}: pickle holds a {type(obj).__name__}, not a tiktoken Encoding")
    state = _validate_state(path, obj.state)
    problem = pattern_problem(state["pat_str"], empty_matches_crash=True)
    if problem:
        raise TokenizerError(f"{path}: {problem}")
    with rust_errors(path, "building the encoding"):  # a panic while compiling the pattern
        try:
            enc = tiktoken.Encoding(**state)
        except Exception as exc:  # e.g. a split pattern the regex engine rejects
            raise TokenizerError(
                f"{path}: tiktoken rejected the stored encoding ({error_text(exc)})"
            ) from exc
    with rust_errors(path, "encoding a test text"):
        enc.encode_ordinary(PROBE_TEXT)
    return enc


def _refusal(path: Path, exc: PickleRefused) -> str:
    if exc.kind == "global":
        return f"{path}: refused to unpickle {exc.name} (only tiktoken.core.Encoding is allowed)"
    if exc.kind == "corrupt":
        return f"{path}: not a valid tokenizer pickle ({exc.reason})"
    return f"{path}: refused to unpickle: {exc.reason}"
