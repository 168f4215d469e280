"""The tokenizer a KempnerForge run names in ``[data] tokenizer_path``, read with ``tokenizers``.

KempnerForge loads it with ``transformers.AutoTokenizer.from_pretrained(tokenizer_path)``: a
local directory or a Hugging Face hub id. A hub id is resolved here from the local Hugging Face
cache only (``HF_HUB_CACHE``, ``HF_HOME``; the ``models--org--name/snapshots/<rev>/`` layout),
never from the network. The encoding is what ``AutoTokenizer.encode`` gives for a
``tokenizer.json``: its own post-processor adds BOS where the tokenizer does (transformers 5
keeps it, whatever ``add_bos_token`` says for such a file). Generation stops at its ``eos_token``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as RustTokenizer

from .errors import TokenizerError

logger = logging.getLogger(__name__)

JSON_NAME = "tokenizer.json"
CONFIG_NAME = "tokenizer_config.json"
MAX_JSON_BYTES = 64 * 1024 * 1024
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)?")
# transformers' GPT-2 tokenizer class names it by default; its hub files do not.
_DEFAULT_EOS = "<|endoftext|>"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise TokenizerError(f"{path}: too large")
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{path}: not readable JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class KFTokenizer:
    """A ``tokenizer.json`` (plus its config) behind the engine's Tokenizer interface."""

    kind = "hf"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / JSON_NAME
        self.warnings: list[str] = []
        try:
            self._tok = RustTokenizer.from_file(str(self.path))
        except Exception as exc:  # the Rust side raises plain Exceptions for bad files
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise TokenizerError(f"{self.path}: not a valid tokenizer.json ({text[:160]})") from None
        config = _read_json(directory / CONFIG_NAME)
        special_map = _read_json(directory / "special_tokens_map.json")
        self._specials = {
            int(i): t.content for i, t in self._tok.get_added_tokens_decoder().items() if t.special
        }
        self._by_name = {name: i for i, name in self._specials.items()}
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._find_eos(config, special_map)
        bos_text = _token_text(config.get("bos_token")) or _token_text(special_map.get("bos_token"))
        bos = self._tok.token_to_id(bos_text) if bos_text else None
        self.bos_id = bos if bos is not None else (self.eos_id if self.eos_id is not None else -1)
        self.stop_ids = frozenset({self.eos_id} if self.eos_id is not None else ())
        self.has_chat_tokens = False

    def _find_eos(self, config: dict[str, Any], special_map: dict[str, Any]) -> int | None:
        text = _token_text(config.get("eos_token")) or _token_text(special_map.get("eos_token"))
        if text is None and _DEFAULT_EOS in self._by_name:
            text = _DEFAULT_EOS
        if text is not None:
            eos = self._tok.token_to_id(text)
            if eos is None:
                raise TokenizerError(f"{self.directory}: eos_token {text!r} is not in {JSON_NAME}")
            return eos
        for name in ("generation_config.json", "config.json"):
            value = _read_json(self.directory / name).get("eos_token_id")
            value = value[0] if isinstance(value, list) and value else value
            if type(value) is int:
                return value
        self.warnings.append(
            f"{self.directory}: no eos_token; replies stop only at max tokens or the context"
        )
        return None

    def encode_prompt(self, text: str) -> list[int]:
        """What ``AutoTokenizer.encode(text)`` gives (and KempnerForge's generate script feeds)."""
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def encode(self, text: str) -> list[int]:
        """Ids of ordinary text: no BOS/EOS added, special-token names stay text."""
        self._tok.encode_special_tokens = True
        try:
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        finally:
            self._tok.encode_special_tokens = False

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def special_id(self, name: str) -> int | None:
        return self._by_name.get(name)

    def special_name(self, id: int) -> str | None:
        return self._specials.get(id)


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
            main = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
        except OSError:
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
