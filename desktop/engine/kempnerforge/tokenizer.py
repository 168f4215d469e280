"""The tokenizer a KempnerForge run names in ``[data] tokenizer_path``, read with ``tokenizers``.

KempnerForge loads it with ``transformers.AutoTokenizer.from_pretrained(tokenizer_path)``: a
local directory or a Hugging Face hub id. A hub id is resolved here from the local Hugging Face
cache only (``HF_HUB_CACHE``, ``HF_HOME``; the ``models--org--name/snapshots/<rev>/`` layout),
never from the network. The encoding is what ``AutoTokenizer.encode`` gives for a
``tokenizer.json``: its own post-processor adds BOS where the tokenizer does (transformers 5
keeps it, whatever ``add_bos_token`` says for such a file). Generation stops at its ``eos_token``.
A chat template in the tokenizer's files (rare for the base models KempnerForge trains) is
rendered in the sandbox of :mod:`.chat_template`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as RustTokenizer

from desktop.engine.chat_template import SPECIAL_TOKEN_KEYS, ChatTemplate, template_source, token_text
from desktop.engine.errors import TokenizerError
from desktop.engine.files import bounded
from desktop.engine.files.tokenizer_checks import (
    EncodingCancelled,
    checked_tokenizer_json,
    id_space,
    rust_errors,
    rust_tokenizer_digest,
    utf8_encodable,
)

logger = logging.getLogger(__name__)

JSON_NAME = "tokenizer.json"
CONFIG_NAME = "tokenizer_config.json"
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)?")
# transformers' GPT-2 and GPT-NeoX tokenizer classes name their special tokens themselves (the
# gpt2 hub files do not); AutoTokenizer picks the class from tokenizer_class or config.json.
_GPT2_TOKENS = {k: "<|endoftext|>" for k in ("bos_token", "eos_token", "unk_token")}
_GPT2_CLASSES = ("GPT2Tokenizer", "GPTNeoXTokenizer")
_GPT2_MODEL_TYPES = frozenset({"gpt2", "gpt_neox"})


def _read_json(path: Path) -> dict[str, Any]:
    """A small JSON file of the tokenizer's folder ({} when absent); bounded depth and size."""
    if not path.exists():
        return {}
    try:
        data = bounded.read_json(path, "config")
    except bounded.FileRefused as exc:
        raise TokenizerError(str(exc)) from None
    return data if isinstance(data, dict) else {}


def _class_defaults(config: dict[str, Any], directory: Path) -> dict[str, Any]:
    cls = config.get("tokenizer_class")
    if isinstance(cls, str):
        return dict(_GPT2_TOKENS) if cls.startswith(_GPT2_CLASSES) else {}
    model_type = _read_json(directory / "config.json").get("model_type")
    return dict(_GPT2_TOKENS) if model_type in _GPT2_MODEL_TYPES else {}


class KFTokenizer:
    """A ``tokenizer.json`` (plus its config) behind the engine's Tokenizer interface."""

    kind = "hf"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / JSON_NAME
        self.warnings: list[str] = []
        text, warnings = checked_tokenizer_json(self.path)  # bounded JSON, nothing unsafe to run
        self.warnings.extend(warnings)
        with rust_errors(self.path, "loading"):
            self._tok = RustTokenizer.from_str(text)
        config = _read_json(directory / CONFIG_NAME)
        # What transformers' tokenizer would name each special token: the files, then its class.
        named = {**_class_defaults(config, directory), **_read_json(directory / "special_tokens_map.json")}
        named.update({k: v for k, v in config.items() if k in SPECIAL_TOKEN_KEYS})
        special = {k: t for k in SPECIAL_TOKEN_KEYS if (t := token_text(named.get(k))) is not None}
        self._specials = {
            int(i): t.content for i, t in self._tok.get_added_tokens_decoder().items() if t.special
        }
        self._by_name = {name: i for i, name in self._specials.items()}
        self.vocab_size = id_space(self._tok)
        self.eos_id = self._find_eos(special.get("eos_token"))
        bos_text = special.get("bos_token")
        bos = self._tok.token_to_id(bos_text) if bos_text else None
        self.bos_id = bos if bos is not None else (self.eos_id if self.eos_id is not None else -1)
        self.stop_ids = frozenset({self.eos_id} if self.eos_id is not None else ())
        self.has_chat_tokens = False
        source = template_source(config, directory)
        self.template = ChatTemplate(source[0], source[1], special) if source else None

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # One call, never chunks: a Metaspace or prefix-space tokenizer would encode a chunk's
        # start differently, and these ids must be transformers' own.
        with rust_errors(self.path, "encoding"):
            return list(self._tok.encode(utf8_encodable(text), add_special_tokens=add_special_tokens).ids)

    def encode_rendered(self, text: str) -> list[int]:
        """A rendered chat template: its special-token names are the tokens, nothing is added
        (``apply_chat_template`` encodes with ``add_special_tokens=False``)."""
        return self._encode(text, add_special_tokens=False)

    def _find_eos(self, text: str | None) -> int | None:
        """KempnerForge stops at ``tokenizer.eos_token_id``: None when the tokenizer names none."""
        if text is None:
            self.warnings.append(
                f"{self.directory}: no eos_token; replies stop only at max tokens or the context"
            )
            return None
        eos = self._tok.token_to_id(text)
        if eos is None:
            raise TokenizerError(f"{self.directory}: eos_token {text!r} is not in {JSON_NAME}")
        return eos

    def encode_prompt(self, text: str) -> list[int]:
        """What ``AutoTokenizer.encode(text)`` gives (and KempnerForge's generate script feeds)."""
        return self._encode(text, add_special_tokens=True)

    def encode(self, text: str, cancel: threading.Event | None = None) -> list[int]:
        """Ids of ordinary text: no BOS/EOS added, special-token names stay text. Encoded in one
        call (see ``_encode``), so ``cancel`` is looked at only before it starts."""
        if cancel is not None and cancel.is_set():
            raise EncodingCancelled(f"{self.path}: stopped before encoding")
        self._tok.encode_special_tokens = True
        try:
            return self._encode(text, add_special_tokens=False)
        finally:
            self._tok.encode_special_tokens = False

    def decode(self, ids: Sequence[int]) -> str:
        with rust_errors(self.path, "decoding"):
            return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def special_id(self, name: str) -> int | None:
        return self._by_name.get(name)

    def special_name(self, id: int) -> str | None:
        return self._specials.get(id)

    def content_digest(self) -> str:
        """What the ids mean, by content (see :func:`rust_tokenizer_digest`)."""
        return rust_tokenizer_digest(self._tok)


def hub_cache_dirs() -> list[Path]:
    """Where the Hugging Face hub cache may be, in the order huggingface_hub looks."""
    env = os.environ
    dirs = [env.get("HF_HUB_CACHE"), env.get("HUGGINGFACE_HUB_CACHE")]
    if env.get("HF_HOME"):
        dirs.append(str(Path(env["HF_HOME"]) / "hub"))
    xdg = env.get("XDG_CACHE_HOME")
    dirs.append(str(Path(xdg) / "huggingface" / "hub") if xdg else None)
    dirs.append(str(Path.home() / ".cache" / "huggingface" / "hub"))
    out: list[Path] = []
    for d in dirs:
        if d and Path(d).expanduser() not in out:
            out.append(Path(d).expanduser())
    return out


def cached_snapshot(hub_id: str, caches: Sequence[Path] | None = None) -> Path | None:
    """The cached snapshot of ``hub_id`` holding a tokenizer.json (``refs/main`` first), or None."""
    for cache in caches if caches is not None else hub_cache_dirs():
        repo = cache / ("models--" + hub_id.replace("/", "--"))
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        try:
            main = bounded.read_text(repo / "refs" / "main", "state", limit=256).strip()
        except bounded.FileRefused:
            main = ""
        if main and (snapshots / main / JSON_NAME).is_file():
            return snapshots / main
        found = [p for p in snapshots.iterdir() if (p / JSON_NAME).is_file()]
        if found:
            return max(found, key=lambda p: p.stat().st_mtime)
    return None


def _directory_of(explicit: Path) -> Path:
    explicit = Path(explicit).expanduser()
    if explicit.is_file():
        if explicit.name != JSON_NAME:
            raise TokenizerError(f"{explicit}: expected a {JSON_NAME} (or the folder that holds it)")
        return explicit.parent
    if not explicit.is_dir():
        raise TokenizerError(f"{explicit}: tokenizer not found")
    return explicit


def _check_directory(directory: Path, origin: str) -> Path:
    if (directory / JSON_NAME).is_file():
        return directory
    others = [n for n in ("tokenizer.model", "vocab.json", "merges.txt") if (directory / n).is_file()]
    extra = f" (it has {', '.join(others)}: a slow tokenizer; save it as {JSON_NAME})" if others else ""
    raise TokenizerError(f"{directory}: no {JSON_NAME}{extra}; {origin}")


def resolve_tokenizer_dir(
    tokenizer_path: str, search: Sequence[Path], explicit: Path | None = None, toml: Path | None = None
) -> Path:
    """The directory of the run's tokenizer: ``explicit``, else ``tokenizer_path`` as a directory
    (relative ones tried against each of ``search``), else as a hub id in the local cache."""
    hint = "pass --tokenizer DIR (a folder with tokenizer.json)"
    if explicit is not None:
        return _check_directory(_directory_of(explicit), hint)
    where = f"data.tokenizer_path in {toml}" if toml else "data.tokenizer_path"
    if not tokenizer_path:
        raise TokenizerError(f"{toml or 'the training TOML'}: no data.tokenizer_path; {hint}")
    given = Path(tokenizer_path).expanduser()
    bases = [Path()] if given.is_absolute() else [Path.cwd(), *search]
    for base in bases:
        candidate = base / given
        if candidate.is_dir():
            return _check_directory(candidate, hint)
    if _HUB_ID.fullmatch(tokenizer_path) and ".." not in tokenizer_path:
        snapshot = cached_snapshot(tokenizer_path)
        if snapshot is not None:
            return snapshot
        looked = ", ".join(str(c) for c in hub_cache_dirs())
        raise TokenizerError(
            f"tokenizer {tokenizer_path!r} ({where}) is not in the local Hugging Face cache "
            f"(looked in {looked}); "
            f"download it once (huggingface-cli download {tokenizer_path}) or {hint}"
        )
    raise TokenizerError(f"tokenizer directory {tokenizer_path!r} ({where}) not found; {hint}")


def load_run_tokenizer(directory: Path, vocab_size: int) -> KFTokenizer:
    tok = KFTokenizer(directory)
    if tok.vocab_size > vocab_size:
        raise TokenizerError(
            f"{tok.path}: tokenizer has {tok.vocab_size} tokens, "
            f"more than the model's vocab_size {vocab_size}"
        )
    return tok
