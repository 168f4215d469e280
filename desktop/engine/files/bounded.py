"""The one way the app reads a file someone else may have written: bounded in kind, size and parse.

Every reader here

* opens with ``O_NONBLOCK`` and checks ``fstat`` before reading a byte, so a FIFO never blocks,
  and a device (``/dev/zero``), a socket or a folder is refused in one line;
* reads at most the limit stated for that kind of file, refusing a larger one from its size
  (and a file that grows while it is read, by reading one byte past the limit);
* parses with guards that cost O(n) before the parser runs: JSON nesting, digits and strings
  (:mod:`.safe_json`), and for TOML the parts of a dotted key, the number of tables and the
  nesting of brackets, which make ``tomllib`` take minutes and gigabytes when unbounded.

Refusals are :class:`FileRefused`, whose text is ``"<path>: <reason>"``: one line for the UI,
the CLI (exit 2) and the log.

Every path is checked before the disk is touched (:func:`named_path`), by every reader here and by
whoever takes a path from a file or the command line (a TOML's ``tensorboard_dir``, a core.yaml's
``dataset_uri``, ``--data``, ``--draft``, a run). Unchecked, the system's refusals are not what
callers expect: a NUL byte is a ValueError from every ``os`` call, a name past ``NAME_MAX`` bytes
makes ``Path.exists()`` raise OSError rather than answer False, and a number or a list where a
path belongs is a TypeError. Checked, each is a :class:`PathRefused`, one line naming the path.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from desktop.engine.errors import NanoscopeError
from desktop.engine.files.safe_json import MAX_DEPTH, JsonRefused, loads_bounded

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KB, MB = 1 << 10, 1 << 20

# What each kind of file may weigh. A real one is far smaller; the limits only keep a hostile or
# wrong file from costing memory and time (docs/ARCHITECTURE.md, Reading untrusted files).
LIMITS: dict[str, int] = {
    "meta": 16 * MB,  # nanochat meta_<step>.json: a few KB
    # HF config.json, generation_config.json, tokenizer_config.json (with its chat template),
    # a shard index; KempnerForge's metadata.json
    "config": 64 * MB,
    "tokenizer": 128 * MB,  # tokenizer.json (the largest public ones are ~35 MB)
    "dcp_metadata": 256 * MB,  # torch.distributed.checkpoint's .metadata pickle
    "template": 1 * MB,  # a chat_template.jinja
    "toml": 4 * MB,  # a KempnerForge training TOML: a few KB
    "state": 16 * MB,  # the app's own settings, caches and config memories
    "safetensors_header": 100 * MB,  # safetensors' own cap on its JSON header
    "eval_data": 32 * MB,  # a user's eval JSONL: only its head is read (MMLU's test set is 8 MB)
    "eval_text": 4 * MB,  # a text to measure bits per byte on: ~1M tokens, minutes per step at d12
    "eval_config": 1 * MB,  # nanochat's eval_bundle core.yaml and eval_meta_data.csv: a few KB
}
NAME_MAX = 255  # bytes in one part of a path: ext4, XFS, Btrfs, APFS and NTFS alike
PATH_MAX = 4096  # bytes in a whole path, with its terminating NUL (Linux; macOS allows 1024)
TOML_MAX_KEY_PARTS = 32  # a.b.c = 1: KempnerForge's deepest key has 3 parts
TOML_MAX_TABLES = 10_000  # [section] and [[array]] headers


class FileRefused(ValueError):
    """A file that was not read, or not parsed; ``str()`` is ``"<path>: <reason>"``."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


class FileMissing(FileRefused):
    """The file does not exist (callers often treat that as "use the default")."""


class PathRefused(FileRefused, NanoscopeError):
    """A path no file can have; a FileRefused for readers, and one line for the CLI as it is."""


def named_path(value: object) -> Path:
    """``value`` as a path (``~`` expanded where the user is known), once it is text the system
    can take as one; else :class:`PathRefused`. Touches no file."""
    if not isinstance(value, (str, os.PathLike)):
        raise PathRefused(repr(value)[:40], f"not a path ({type(value).__name__})")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise PathRefused(repr(text)[:40], "not a path (bytes)")
    if "\0" in text:
        raise PathRefused(shown_path(text), "a path with a NUL byte")
    expanded = os.path.expanduser(text)  # Path.expanduser raises for an unknown ~user
    try:
        encoded = os.fsencode(expanded)
    except UnicodeEncodeError:  # a lone surrogate that no file name's bytes decode to
        raise PathRefused(shown_path(text), "not a path (characters no file name has)") from None
    separators = encoded.replace(os.altsep.encode(), os.sep.encode()) if os.altsep else encoded
    longest = max(map(len, separators.split(os.sep.encode())))
    if longest > NAME_MAX:
        raise PathRefused(
            shown_path(text), f"a name of {longest:,} bytes in the path (the system allows {NAME_MAX})"
        )
    if len(encoded) >= PATH_MAX:
        raise PathRefused(
            shown_path(text), f"a path of {len(encoded):,} bytes (the system allows {PATH_MAX - 1:,})"
        )
    return Path(expanded)


def shown_path(text: str, limit: int = 120) -> str:
    """A path for a message: a long one cut in the middle, with its length."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}…{text[-limit // 4 :]} ({len(text):,} characters)"


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_bytes(path: Path | str, kind: str, limit: int | None = None) -> bytes:
    """The bytes of a regular file of ``kind`` (a key of :data:`LIMITS`), at most its limit."""
    limit = LIMITS[kind] if limit is None else limit
    with open_regular(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise FileRefused(
                    path, f"{_size(size)} is too large for a {kind} file (limit {_size(limit)})"
                )
            data = f.read(limit + 1)
        except OSError as exc:
            raise FileRefused(path, f"cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise FileRefused(path, f"grew past {_size(limit)} while it was read")
    return data


def open_regular(path: Path | str) -> io.BufferedReader:
    """A regular file opened for reading in binary, for readers that seek (weights); the caller
    bounds what it reads from what the file declares."""
    named_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileMissing(path, "file not found") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise FileRefused(path, "not a regular file (a named pipe)") from None
        raise FileRefused(path, f"cannot read ({exc.strerror or exc})") from None
    try:
        _check_regular(path, os.fstat(fd).st_mode)
    except FileRefused:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def file_sha256(path: Path | str) -> str | None:
    """The SHA-256 of a regular file's bytes (read in blocks), or None where it cannot be read:
    two tokenizers with the same digest give token ids the same meaning wherever they lie."""
    try:
        digest = hashlib.sha256()
        with open_regular(path) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    except (FileRefused, OSError):
        return None


def _check_regular(path: Path | str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _KINDS if test(mode)), "a special file")
        raise FileRefused(path, f"not a regular file ({what})")


def _read_head(path: Path | str, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes from the start of a regular file, and whether there was more."""
    with open_regular(path) as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise FileRefused(path, f"cannot read ({exc.strerror or exc})") from None
    return data[:limit], len(data) > limit


def read_head_text(path: Path | str, kind: str) -> tuple[str, bool]:
    """The start of a regular text file of ``kind``, at most its limit in bytes, cut at the
    last whole character; True when there was more. Bytes that are not UTF-8 read as U+FFFD."""
    limit = LIMITS[kind]
    data, more = _read_head(path, limit)
    text = data.decode("utf-8", errors="replace")
    if more and text.endswith("\ufffd"):
        text = text.rstrip("\ufffd")  # a character cut by the limit, not a bad byte
    return text, more


def read_head_lines(path: Path | str, kind: str, max_lines: int) -> tuple[list[str], bool]:
    """The first lines of a regular text file of ``kind``, at most its limit in bytes and
    ``max_lines`` lines (a line cut by the limit is left out); True when there was more. Bytes
    that are not UTF-8 read as U+FFFD, so one bad line does not lose the file."""
    data, more = _read_head(path, LIMITS[kind])
    if more:
        data = data[: data.rfind(b"\n") + 1]
    lines = data.decode("utf-8", errors="replace").splitlines()
    if len(lines) > max_lines:
        return lines[:max_lines], True
    return lines, more


def read_text(path: Path | str, kind: str, limit: int | None = None) -> str:
    """A UTF-8 text file of ``kind``."""
    data = read_bytes(path, kind, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(path, f"not UTF-8 text (byte {exc.start})") from None


def read_json(path: Path | str, kind: str, max_depth: int = MAX_DEPTH, limit: int | None = None) -> Any:
    """A JSON file of ``kind``: bounded read, then :func:`.safe_json.loads_bounded`."""
    return parse_json(read_text(path, kind, limit), path, max_depth)


def parse_json(text: str, path: Path | str, max_depth: int = MAX_DEPTH) -> Any:
    """JSON text read from ``path`` (or bytes of it, such as a safetensors header)."""
    try:
        return loads_bounded(text, max_depth)
    except JsonRefused as exc:
        raise FileRefused(path, f"not valid JSON ({exc})") from None


def read_yaml(path: Path | str, kind: str) -> Any:
    """A YAML file of ``kind``, by PyYAML's safe loader (plain data, no Python objects). Aliases
    share one object rather than copying it, so a small file stays small in memory; a caller
    checks the types it reads."""
    import yaml

    text = read_text(path, kind)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f"line {where.line + 1}: " if where is not None else ""
        raise FileRefused(path, f"{line}not valid YAML") from None
    except (RecursionError, ValueError) as exc:
        raise FileRefused(path, f"not valid YAML ({type(exc).__name__})") from None


_TOML_HEADER = re.compile(r"^[ \t]*\[", re.MULTILINE)
# TOML_MAX_KEY_PARTS parts joined by dots, anywhere (a table header, a key, an inline table's key);
# each attempt starts at the beginning of a word, so the scan stays linear.
_TOML_PART = r"""(?:(?<![\w-])[\w-]+|"[^"\n]*"|'[^'\n]*')"""
_TOML_DOTTED = re.compile(rf"(?:{_TOML_PART}[ \t]*\.[ \t]*){{{TOML_MAX_KEY_PARTS - 1}}}{_TOML_PART}")
_TOML_BRACKETS = re.compile(r"[\[\]{}]")


def read_toml(path: Path | str, limit: int | None = None) -> dict[str, Any]:
    """A TOML file, with the shapes that make ``tomllib`` slow refused before it parses."""
    text = read_text(path, "toml", limit)
    tables = len(_TOML_HEADER.findall(text))
    if tables > TOML_MAX_TABLES:
        raise FileRefused(path, f"not a training config: {tables} tables (limit {TOML_MAX_TABLES})")
    dotted = _TOML_DOTTED.search(text)
    if dotted:
        line = text.count("\n", 0, dotted.start()) + 1
        raise FileRefused(path, f"line {line}: a dotted key of {TOML_MAX_KEY_PARTS} parts or more")
    depth = 0
    for bracket in _TOML_BRACKETS.findall(text):  # strings counted too: only ever an overestimate
        depth = depth + 1 if bracket in "[{" else max(depth - 1, 0)
        if depth > MAX_DEPTH:
            raise FileRefused(path, f"nested deeper than {MAX_DEPTH} levels")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FileRefused(path, f"not valid TOML ({exc})") from None
    except (RecursionError, ValueError) as exc:  # ValueError: an integer of too many digits
        raise FileRefused(path, f"not valid TOML ({type(exc).__name__})") from None


def _size(n: int) -> str:
    return f"{n / MB:.1f} MB" if n >= MB else f"{n / KB:.0f} KB" if n >= KB else f"{n} bytes"
