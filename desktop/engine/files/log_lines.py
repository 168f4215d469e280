"""A training log read line by line in bounded memory and time, and read on as it grows.

A run's log may be a million lines or hundreds of megabytes (one prose line per training step),
and a hostile one may be one line of zeros. :class:`LogLines` reads at most ``max_bytes`` from the
start (a run's records are small and spread through it: what is past the cap is left out and
said), one line at a time; a line longer than ``MAX_LINE_BYTES`` is skipped without being held,
and counted. Bytes that are not UTF-8 read as U+FFFD, so one bad line does not lose the file.

A run still training appends to its log: each pass over a :class:`LogLines` gives the lines
written since the last, from the byte where it stopped. The last line is given only once its
line end is written (the trainer may be mid-write: its number may still lose digits); a file that
is no longer the one read (replaced, or shorter than what was read) is :class:`LogReplaced`.

A line's shell-quoted words (:func:`shell_words`) are read as ``shlex.split`` reads them, by
regular expressions: ``shlex`` takes a Python step per character (two 64 MB logs took a minute).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

from desktop.engine.files.bounded import MB, FileRefused, open_regular

MAX_LOG_BYTES = 64 * MB  # nanochat's base_train.log of a 20k-step run is about 4 MB
MAX_LINE_BYTES = 64 * 1024  # a record is a few hundred bytes
_CHUNK = 1 * MB  # how much of an over-long line is read (and dropped) at a time


class LogReplaced(Exception):
    """The file at a log's path is not the one read so far (another file, or shorter than what
    was read): what was made of its lines is out of date. Raised before any line is given."""


class LogLines:
    """``for number, text in LogLines(path)``: the lines (1-based numbers, without the line end)
    of at most ``max_bytes`` of a regular file; each further pass gives the lines appended since.
    After a pass, :attr:`cut` says whether the file went on past the cap, :attr:`size` is its
    size, :attr:`long_lines` how many lines were skipped as too long and :attr:`bytes_read` how
    many bytes all passes read. Opening and reading failures are :class:`FileRefused` (one line)."""

    def __init__(self, path: Path, max_bytes: int = MAX_LOG_BYTES, max_line: int = MAX_LINE_BYTES) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.max_line = max_line
        self.cut = False
        self.size = 0
        self.long_lines = 0
        self.bytes_read = 0
        self.offset = 0  # where the next pass starts: after the last line given or skipped
        self.number = 0  # of the last line given or skipped
        self._skipping = False  # inside an over-long line whose end is not read yet
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read

    def __iter__(self) -> Iterator[tuple[int, str]]:
        with open_regular(self.path) as f:
            try:
                self._check_same(os.fstat(f.fileno()))
                f.seek(self.offset)
                yield from self._lines(f)
            except OSError as exc:
                raise FileRefused(self.path, f"cannot read ({exc.strerror or exc})") from None

    def replaced(self) -> bool:
        """Whether the file now at the path is not the one read so far (for a reader that has
        stopped reading it; a pass checks the file it opens)."""
        try:
            return self._other(os.stat(self.path))
        except OSError:
            return True

    def _check_same(self, stat: os.stat_result) -> None:
        if self._other(stat):
            raise LogReplaced(f"{self.path}: replaced or cut short since it was read")
        self._identity, self.size = (stat.st_dev, stat.st_ino), stat.st_size

    def _other(self, stat: os.stat_result) -> bool:
        if self._identity is None:
            return False
        return (stat.st_dev, stat.st_ino) != self._identity or stat.st_size < self.offset

    def _lines(self, f: io.BufferedReader) -> Iterator[tuple[int, str]]:
        while self.offset < self.max_bytes:
            room = self.max_bytes - self.offset
            if self._skipping:
                raw = self._read(f.readline(min(_CHUNK, room)))
                if not raw:
                    return  # the over-long line is still being written
                self._skipping = not raw.endswith(b"\n")
                continue
            raw = f.readline(min(self.max_line + 1, room))
            if len(raw) > self.max_line:  # too long, whether or not its end is written yet
                self._read(raw)
                self.number += 1
                self.long_lines += 1
                self._skipping = not raw.endswith(b"\n")
                continue
            if not raw.endswith(b"\n"):
                self.bytes_read += len(raw)
                if len(raw) == room and f.peek(1)[:1]:
                    self.offset = self.max_bytes  # a line cut by the cap: a number may have lost digits
                    break
                return  # the last line, not ended yet: read again, whole, by a later pass
            self._read(raw)
            self.number += 1
            yield self.number, raw.decode("utf-8", errors="replace").rstrip("\r\n")
        probe = f.read(1)  # past the cap: looked at, never taken
        self.bytes_read += len(probe)
        self.cut = bool(probe)

    def _read(self, raw: bytes) -> bytes:
        """``raw`` taken: the next pass starts after it."""
        self.offset += len(raw)
        self.bytes_read += len(raw)
        return raw

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
