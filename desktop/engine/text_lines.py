"""The one cleaner for every line Nanoscope shows: command-line output, warnings, errors, the
console log, the app's notices.

Names and messages come from files, folders and servers that someone else wrote, so they may hold
anything: a newline that splits a warning in two, ``ESC[2J`` that clears the terminal, a bidi
override (U+202E) that makes one name read as another, bytes of a file name that were not UTF-8.
:func:`one_line` turns any text into exactly one line of printable characters: every other
character is shown as a Python-style escape (``\\x1b``, ``\\u202e``), so the name can still be
told apart and found, and a lone surrogate (``os.fsdecode``'s stand-in for an undecodable byte) as
the byte it stands for (``\\xe9``). A space of another kind (U+00A0, the U+202F macOS puts before
"PM" in a screenshot's name) is shown as a plain space: it breaks no line and hides nothing, and
an escape there would make an ordinary name unreadable.
"""

from __future__ import annotations

import unicodedata

ELLIPSIS = "…"
MASK = "***"
# With a limit, at most this many characters per character shown are looked at: a 300 MB line is
# not copied, folded and escaped in full to show its first 200 characters.
_LOOK_AHEAD = 4


def one_line(text: object, *, fold: bool = False, limit: int | None = None, secret: str | None = None) -> str:
    """``text`` as one line of printable characters.

    ``fold``: runs of whitespace (line breaks included) become one space and the ends are
    stripped; for prose such as a server's or a library's message, where a line break is layout.
    Without it a line break is content (a file name may hold one) and is shown escaped.
    ``limit``: at most this many characters, the last one ``…`` when cut.
    ``secret``: every occurrence replaced by ``***`` first (an API key a server echoes back).
    """
    text = str(text)
    if secret:
        text = text.replace(secret, MASK)
    cut = limit is not None and len(text) > _LOOK_AHEAD * limit
    if limit is not None and cut:
        text = text[: _LOOK_AHEAD * limit]
    if fold:
        text = " ".join(text.split())
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else _shown(ch) for ch in text)
    if limit is not None and (cut or len(text) > limit):
        text = text[: max(0, limit - 1)] + ELLIPSIS
    return text


def error_text(exc: BaseException, limit: int | None = 200, *, named: bool = False) -> str:
    """An exception's message as one folded line (a library's error inside one of ours), or its
    type's name when it has none; ``named``: ``Type: message``, for errors nobody explained."""
    name = type(exc).__name__
    text = one_line(exc, fold=True, limit=limit)
    if not text:
        return name
    return one_line(f"{name}: {text}", limit=limit) if named else text


def _shown(ch: str) -> str:
    """A character that is not printable: a plain space for a space separator, else escaped."""
    return " " if unicodedata.category(ch) == "Zs" else _escape(ch)


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for the undecodable byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
