"""Reading a user's JSONL of examples, one record per line (Qt-free): every usable line parsed,
every unusable one skipped with a line naming the file and line (the first few by name, then a
count), so one broken line never costs the rest."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
MAX_PROBLEMS_SHOWN = 20


def parse_records(
    lines: Sequence[str], parse: Callable[[str, int], T], path: Path, keep: int | None = None
) -> tuple[list[T], list[str], bool]:
    """(records, problem lines, stopped early): ``parse(line, number)`` for each non-blank line,
    a ValueError skipping that line; at most ``keep`` records."""
    records: list[T] = []
    problems: list[str] = []
    skipped = 0
    for number, line in enumerate(lines, 1):
        if keep is not None and len(records) == keep:
            return records, _with_count(problems, skipped, path), True
        if not line.strip():
            continue
        try:
            records.append(parse(line, number))
        except ValueError as exc:
            skipped += 1
            if len(problems) < MAX_PROBLEMS_SHOWN:
                problems.append(f"{path}:{number}: {exc}; skipped")
    return records, _with_count(problems, skipped, path), False


def _with_count(problems: list[str], skipped: int, path: Path) -> list[str]:
    if skipped > len(problems):
        problems.append(f"{path}: {skipped - len(problems)} more lines skipped")
    return problems
