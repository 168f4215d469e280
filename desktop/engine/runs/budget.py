"""What reading one training run may cost, counted once for the whole run (Qt-free).

A run is read from many files: a meta per saved step, a log per stage, TensorBoard event files.
Bounds per file or per stage add up (four stages of 100,000 steps; 45 metas of 16 MB, each taking
seconds to parse; a log of thousands of series), so a run is read under one :class:`RunBudget`,
shared by every stage and file, that counts what costs:

* values: every number or setting read (a log record's ``key=value``, a meta's metric or config
  entry, a TensorBoard value), kept or not;
* series: the distinct curves and metrics, by (name, stage);
* steps: the saved steps listed;
* meta bytes: the metas parsed.

When one runs out, what follows is left out, and the run gets one line per budget naming the run
and the limit. Per-file bounds stay where they are (:mod:`desktop.engine.files.bounded`, the log
reader, the event reader); these are what is left of them for the rest of the run.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable
from pathlib import Path

MB = 1 << 20
# A run's numbers are a few dozen series of at most thousands of points. A value costs 2-5 µs to
# parse from a log and 5-20 µs from TensorBoard (on a shared 2-core VM): half a million is seconds,
# and ~50 MB of curves in memory.
MAX_VALUES = 500_000
MAX_SERIES = 1_000  # nanochat's metas and logs name ~40 (CORE's tasks); KempnerForge ~20 tags
MAX_STEPS = 100_000  # saved steps: each is a checkpoint, so a real run has hundreds at most
# A meta is a few KB (200 steps read in 45 ms: thousands of steps fit); a 16 MB one, the most a
# single meta may weigh, takes 2-4 s to parse.
MAX_META_BYTES = 16 * MB


class RunBudget:
    """The costs left for reading the run ``run``; ``take_*`` spend them (False: out, and said)."""

    def __init__(self, run: Path) -> None:
        self.run = run
        # read here rather than bound as defaults, so that a test may lower them
        self.max_values, self.max_series = MAX_VALUES, MAX_SERIES
        self.max_steps, self.max_meta_bytes = MAX_STEPS, MAX_META_BYTES
        self.values = self.steps = self.meta_bytes = 0
        self.series: set[Hashable] = set()
        self._lines: dict[str, str] = {}  # one per budget that ran out

    @property
    def values_left(self) -> int:
        return self.max_values - self.values

    @property
    def exhausted(self) -> bool:
        """Whether something was refused or no values are left: from then on what is read
        depends on the order it is read in (what a reader of a growing run must know)."""
        return bool(self._lines) or self.values_left <= 0

    def copy(self) -> RunBudget:
        """A budget that has spent what this one has, spent on apart from it (a run's logs
        are read once; its metas are spent again from what the logs left, at every read)."""
        twin = copy.copy(self)
        twin.series, twin._lines = set(self.series), dict(self._lines)
        return twin

    def take_values(self, count: int) -> bool:
        """``count`` values read; False (and none taken) when they do not fit."""
        if count > self.values_left:
            self._out("values", "more than {:,} values read; the rest is left out", self.max_values)
            self.values = self.max_values  # spent: later reads stop at once
            return False
        self.values += count
        return True

    def take_series(self, key: Hashable) -> bool:
        """Whether values of the series ``key`` may be kept (a new one while there is room)."""
        if key in self.series:
            return True
        if len(self.series) >= self.max_series:
            self._out("series", "more than {:,} series; the others are left out", self.max_series)
            return False
        self.series.add(key)
        return True

    def take_steps(self, steps: list[int]) -> list[int]:
        """The first of ``steps`` that fit; the rest left out (and said)."""
        kept = steps[: max(self.max_steps - self.steps, 0)]
        if len(kept) < len(steps):
            self._out("steps", "more than {:,} saved steps; the later ones are left out", self.max_steps)
        self.steps += len(kept)
        return kept

    def take_meta(self, size: int) -> bool:
        """Whether a meta of ``size`` bytes may be parsed."""
        if self.meta_bytes + size > self.max_meta_bytes:
            self._out(
                "meta",
                "metas of more than {} MB in all; the later steps are listed without their numbers",
                self.max_meta_bytes // MB,
            )
            return False
        self.meta_bytes += size
        return True

    def lines(self) -> list[str]:
        """One line for each budget that ran out, in the order they did."""
        return list(self._lines.values())

    def _out(self, kind: str, what: str, limit: int) -> None:
        """Say once that the budget ``kind`` ran out (formatted only then: a hostile log asks
        for a new series a million times)."""
        if kind not in self._lines:
            self._lines[kind] = f"{self.run}: {what.format(limit)} (the limit for one run)"


class Problems:
    """Problem lines of one file: the first few in full, then how many more (a hostile file can
    have a problem on every line, or every key)."""

    def __init__(self, path: Path, shown: int = 5) -> None:
        self.path, self.max_shown = path, shown
        self.shown: list[str] = []
        self.more = 0

    def add(self, reason: str, number: int | None = None) -> None:
        if len(self.shown) < self.max_shown:
            where = f"{self.path}:{number}" if number is not None else str(self.path)
            self.shown.append(f"{where}: {reason}")
        else:
            self.more += 1

    def lines(self) -> list[str]:
        tail = [f"{self.path}: {self.more} more problem lines skipped"] if self.more else []
        return self.shown + tail
