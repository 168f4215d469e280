"""What a checkpoint's weights are, by content: the sha256 of its files, read in chunks.

A report card names each step by it, so a step that was copied or renamed is still known, and
eval results are kept under it with the step, so a step rewritten in place is not mistaken for
the old one.
Reading is bounded in memory (one chunk at a time) and stops between chunks when asked.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

from desktop.engine.files.bounded import FileRefused, open_regular

CHUNK = 8 << 20


def sha256_of_files(paths: Sequence[Path], cancel: threading.Event | None = None) -> str | None:
    """The sha256 of the files' bytes, one after another in the order given (a sharded
    checkpoint is one content); None when ``cancel`` was set before the end. FileRefused for a
    file that is missing, not a regular file, or cannot be read."""
    digest = hashlib.sha256()
    for path in paths:
        with open_regular(path) as f:
            while True:
                if cancel is not None and cancel.is_set():
                    return None
                try:
                    chunk = f.read(CHUNK)
                except OSError as exc:
                    raise FileRefused(path, f"cannot read ({exc.strerror or exc})") from None
                if not chunk:
                    break
                digest.update(chunk)
    return digest.hexdigest()
