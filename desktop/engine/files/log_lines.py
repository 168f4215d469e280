"""A training log read line by line in bounded memory and time.

A run's log may be a million lines or hundreds of megabytes (one prose line per training step),
and a hostile one may be one line of zeros. :class:`LogLines` reads at most ``max_bytes`` from the
start (a run's records are small and spread through it: what is past the cap is left out and
said), one line at a time; a line longer than ``MAX_LINE_BYTES`` is skipped without being held,
and counted. Bytes that are not UTF-8 read as U+FFFD, so one bad line does not lose the file.

A line's shell-quoted words (:func:`shell_words`) are read as ``shlex.split`` reads them, by
regular expressions: ``shlex`` takes a Python step per character (two 64 MB logs took a minute).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from desktop.engine.files.bounded import MB, FileRefused, open_regular

MAX_LOG_BYTES = 64 * MB  # nanochat's base_train.log of a 20k-step run is about 4 MB
MAX_LINE_BYTES = 64 * 1024  # a record is a few hundred bytes
_CHUNK = 1 * MB  # how much of an over-long line is read (and dropped) at a time


class LogLines:
    """``for number, text in LogLines(path)``: the lines (1-based numbers, without the line end)
    of at most ``max_bytes`` of a regular file. After the loop, :attr:`cut` says whether the file
    went on past the cap, :attr:`size` is its size and :attr:`long_lines` how many lines were
    skipped as too long. Opening and reading failures are :class:`FileRefused` (one line)."""

    def __init__(self, path: Path, max_bytes: int = MAX_LOG_BYTES, max_line: int = MAX_LINE_BYTES) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.max_line = max_line
        self.cut = False
        self.size = 0
        self.long_lines = 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        with open_regular(self.path) as f:
            try:
                self.size = os.fstat(f.fileno()).st_size
                yield from self._lines(f)
            except OSError as exc:
                raise FileRefused(self.path, f"cannot read ({exc.strerror or exc})") from None

    def _lines(self, f) -> Iterator[tuple[int, str]]:
        read = number = 0
        while read < self.max_bytes:
            raw = f.readline(min(self.max_line + 1, self.max_bytes - read))
            if not raw:
                return
            read += len(raw)
            number += 1
            if read >= self.max_bytes and not raw.endswith(b"\n") and f.peek(1)[:1]:
                break  # a line cut by the cap: a record's number may have lost digits
            if len(raw) > self.max_line:
                self.long_lines += 1
                while raw and not raw.endswith(b"\n") and read < self.max_bytes:
                    raw = f.readline(min(_CHUNK, self.max_bytes - read))
                    read += len(raw)
                continue
            yield number, raw.decode("utf-8", errors="replace").rstrip("\r\n")
        self.cut = bool(f.read(1))

    def cut_line(self) -> str:
        """The one line that says the file was cut ("" when it was read whole)."""
        if not self.cut:
            return ""
        return (
            f"{self.path}: read the first {self.max_bytes // MB} MB of {self.size / MB:.0f} MB; "
            "later lines left out"
        )


# The pieces of POSIX shell words, each alternative starting with its own character: plain
# characters; '…' as it is; "…" where a backslash escapes only " and \\ (unrolled: [^"\\]* then
# \\. [^"\\]*, so nothing is tried two ways and a line that fails costs one pass); a backslash
# escaping one character; the whitespace between words (shlex's: space, tab, CR, LF); and last, a
# quote or backslash that opens nothing.
_PIECE = re.compile(
    r"""([^ \t\r\n'"\\]+)|'([^']*)'|"([^"\\]*(?:\\.[^"\\]*)*)"|\\(.)|([ \t\r\n]+)|(['"\\])""", re.S
)
_ESCAPED_IN_DOUBLE = re.compile(r"""\\(["\\])""")
_DOUBLE, _SPACE, _STRAY = 3, 5, 6
_UNQUOTED_WORD = re.compile(r"[^ \t\r\n]+")


def shell_words(text: str) -> list[str]:
    """``text`` split as ``shlex.split(text)`` splits it; ValueError for a quote that is not
    closed or a backslash at the end."""
    if "'" not in text and '"' not in text and "\\" not in text:
        return _UNQUOTED_WORD.findall(text)  # the common line, at C speed
    words: list[str] = []
    word: list[str] | None = None  # the pieces of the word in hand ('' is a word: "x=''")
    for piece in _PIECE.finditer(text):
        kind = piece.lastindex or 0  # every alternative is a group: never 0
        if kind == _SPACE:
            if word is not None:
                words.append("".join(word))
                word = None
            continue
        if kind == _STRAY:
            raise ValueError(f"no closing quotation (a {piece.group(kind)!r} at {piece.start()})")
        found = piece.group(kind)
        if kind == _DOUBLE and "\\" in found:
            found = _ESCAPED_IN_DOUBLE.sub(r"\1", found)
        if word is None:
            word = [found]
        else:
            word.append(found)
    if word is not None:
        words.append("".join(word))
    return words
