"""The tokenizer interface generation and the UI use, plus finding the right file for a checkpoint.

Two kinds exist in the nanochat family (docs/ARCHITECTURE.md, Eras: Tokenizers):

* ``"tiktoken"``: upstream's ``tokenizer.pkl``, a pickled ``tiktoken.Encoding`` whose last nine ids
  are the chat special tokens. It is loaded through :mod:`.safe_pickle`, never plain ``pickle``.
* ``"cpp"``: the fork's HuggingFace ``tokenizer.json`` for C++ code (see :mod:`.cpp_tokenizer`).

Both sit behind :class:`Tokenizer` so generation never branches on the kind, except to ask
:meth:`Tokenizer.special_id` for the tokens its state machine reacts to.

Both are Rust libraries: every call goes through :func:`.tokenizer_checks.rust_errors`, so a
panic is a :class:`TokenizerError` (never a ``BaseException`` that ends the worker), and long
texts are encoded a chunk at a time (:func:`.tokenizer_checks.encode_in_chunks`).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

import tiktoken

from desktop.engine.decode.protocols import Tokenizer
from desktop.engine.errors import TokenizerError
from desktop.engine.files.safe_pickle import load_tiktoken_pickle
from desktop.engine.files.tokenizer_checks import encode_in_chunks, rust_errors, utf8_encodable
from desktop.engine.nanochat.cpp_tokenizer import CppTokenizer
from desktop.engine.nanochat.special_tokens import ASSISTANT_END, BOS, CHAT_TOKENS

PKL_NAME = "tokenizer.pkl"
JSON_NAME = "tokenizer.json"


class TiktokenTokenizer:
    """nanochat's own tokenizer: byte-level BPE through tiktoken."""

    kind = "tiktoken"

    def __init__(self, enc: tiktoken.Encoding, path: Path) -> None:
        self.path = path
        self.warnings: list[str] = []
        self._enc = enc
        self._specials = {name: enc.encode_single_token(name) for name in enc.special_tokens_set}
        self._names = {i: name for name, i in self._specials.items()}
        self.vocab_size = enc.n_vocab
        # nanochat calls it <|bos|>; tiktoken's stock encodings call the same role <|endoftext|>.
        bos = self._specials.get(BOS, self._specials.get("<|endoftext|>"))
        if bos is None:
            raise TokenizerError(f"{path}: tokenizer has no {BOS} token")
        self.bos_id = bos
        self.stop_ids = frozenset(i for i in (self._specials.get(ASSISTANT_END), bos) if i is not None)
        self.has_chat_tokens = all(name in self._specials for name in CHAT_TOKENS)

    def encode(self, text: str, cancel: threading.Event | None = None) -> list[int]:
        # encode_ordinary never turns "<|bos|>" typed by a user into the special token.
        with rust_errors(self.path, "encoding"):
            return encode_in_chunks(self._enc.encode_ordinary, utf8_encodable(text), cancel, self.path)

    def decode(self, ids: Sequence[int]) -> str:
        with rust_errors(self.path, "decoding"):
            return self._enc.decode(list(ids))

    def special_id(self, name: str) -> int | None:
        return self._specials.get(name)

    def special_name(self, id: int) -> str | None:
        return self._names.get(id)

    def content_digest(self) -> str:
        """What the ids mean, by content: the bytes of every id and the special tokens' names
        (two files with the same vocabulary agree, whatever their names; speculative decoding
        needs a draft whose ids mean the target's)."""
        h = hashlib.sha256()
        for i in range(self.vocab_size):
            name = self._names.get(i)
            raw = name.encode("utf-8") if name is not None else self._enc.decode_single_token_bytes(i)
            h.update(b"%d:%d:" % (i, name is not None) + raw + b"\x00")
        return h.hexdigest()


def load_tokenizer(path: Path) -> Tokenizer:
    """Load ``tokenizer.pkl`` (restricted unpickling) or a fork ``tokenizer.json``."""
    path = Path(path)
    if path.suffix == ".pkl":
        return TiktokenTokenizer(load_tiktoken_pickle(path), path)
    if path.suffix == ".json":
        return CppTokenizer(path)
    raise TokenizerError(f"{path}: not a tokenizer file (expected tokenizer.pkl or tokenizer.json)")


def _files_in(directory: Path, is_fork: bool) -> list[Path]:
    """The tokenizer files in ``directory``, the one to prefer on a vocab tie first."""
    names = (JSON_NAME, PKL_NAME) if is_fork else (PKL_NAME, JSON_NAME)
    return [directory / n for n in names if (directory / n).is_file()]


def select_tokenizer(
    candidate_dirs: Sequence[Path], vocab_size: int, is_fork: bool, explicit: Path | None = None
) -> Tokenizer:
    """Pick the checkpoint's tokenizer as docs/ARCHITECTURE.md, Eras: Loading says.

    An explicit file is used as is (its vocab must still match). Otherwise directories are
    searched in order (``explicit`` first when it is a directory); in the first one holding a file
    whose vocab equals ``vocab_size`` that file is used, and when both ``tokenizer.pkl`` and
    ``tokenizer.json`` would fit, the json wins only for fork checkpoints. A file that is looked at
    and turns out corrupt or unsafe raises at once rather than being skipped silently.
    """
    if explicit is not None:
        explicit = Path(explicit).expanduser()
        if explicit.is_file():
            tok = load_tokenizer(explicit)
            _check_vocab(tok, vocab_size)
            return tok
        if not explicit.is_dir():
            raise TokenizerError(f"{explicit}: tokenizer file not found")
    dirs = [Path(d).expanduser() for d in ([explicit] if explicit is not None else []) + list(candidate_dirs)]
    mismatched: list[Tokenizer] = []
    for directory in dirs:
        files = _files_in(directory, is_fork)
        for file in files:
            tok = load_tokenizer(file)
            if tok.vocab_size != vocab_size:
                mismatched.append(tok)
                continue
            if file == files[0]:
                for other in files[1:]:
                    tok.warnings.append(
                        f"{directory}: also has {other.name}; using {file.name} because the checkpoint "
                        f"{'is' if is_fork else 'is not'} a fork (pick the tokenizer explicitly to override)"
                    )
            return tok
    if mismatched:
        _check_vocab(mismatched[0], vocab_size, also=[t.path for t in mismatched[1:]])
    looked = ", ".join(str(d) for d in dirs) or "no directories"
    raise TokenizerError(f"no tokenizer found (looked in: {looked})")


def _check_vocab(tok: Tokenizer, vocab_size: int, also: Sequence[Path] = ()) -> None:
    if tok.vocab_size == vocab_size:
        return
    more = f" (also checked: {', '.join(map(str, also))})" if also else ""
    raise TokenizerError(
        f"{tok.path}: tokenizer vocab {tok.vocab_size} does not match the model's vocab_size {vocab_size}"
        + more
    )
