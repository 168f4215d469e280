"""Every line the command line prints goes through here, and so through the one cleaner
(:func:`desktop.engine.text_lines.one_line`): a name from a file cannot split a line in two or
send the terminal an escape sequence. JSON output is already one line of ASCII
(``json.dumps`` escapes every control character) and goes through here all the same.
"""

from __future__ import annotations

import sys
from typing import TextIO

from desktop.engine.text_lines import one_line


def say(text: object = "", *, file: TextIO | None = None, flush: bool = False) -> None:
    """One clean line to stdout (or ``file``)."""
    print(one_line(text), file=file if file is not None else sys.stdout, flush=flush)


def warn(text: object) -> None:
    """``nanoscope: warning: TEXT`` on stderr."""
    say(f"nanoscope: warning: {text}", file=sys.stderr)


def error(text: object) -> None:
    """``nanoscope: error: TEXT`` on stderr."""
    say(f"nanoscope: error: {text}", file=sys.stderr)
