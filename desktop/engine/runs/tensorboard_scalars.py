"""A KempnerForge run's TensorBoard scalars (train/loss, grad_norm, lr, tokens_per_sec, mfu, …) as
curves against the step they were logged at.

Where the event files are: KempnerForge's ``TensorBoardBackend`` hands ``metrics.tensorboard_dir``
(default ``tb_logs``) to torch's ``SummaryWriter`` as it is, so a relative folder is relative to
where training was launched, as ``checkpoint.dir`` (the run) is. With the run's training TOML
found, the launch folder is the run with ``checkpoint.dir``'s parts taken off its end, else the
run's parent. Unless the TOML names the folder, ``<run>/tb_logs`` is looked at too.

A resumed run starts a new event file in the same folder: files are read oldest first (by the
time in their names) and a step logged again replaces the earlier one, as TensorBoard shows it.
KempnerForge's default folder is shared by every run launched from the same place; their files
cannot be told apart and are read as this run's.

Bounded: :data:`MAX_FILES` files (the newest); across them :data:`MAX_RUN_BYTES`,
:data:`MAX_RUN_EVENTS` and :data:`MAX_RUN_FIELDS`, and the values and series left in the run's
:class:`~.budget.RunBudget` (a value is every Summary.Value decoded: one event may hold a million,
so counting events bounded nothing); and what :mod:`desktop.engine.files.tensorboard_events`
bounds per file and tag. A run still training is read on (:class:`KfScalars`): each read takes
the frames its files gained, within what those budgets left.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.engine.errors import CheckpointError
from desktop.engine.files.bounded import PathRefused, named_path
from desktop.engine.files.tensorboard_events import (
    MAX_FILE_BYTES,
    MAX_POINTS,
    MAX_TAGS,
    MB,
    EventFile,
    FileReplaced,
    Scalars,
)
from desktop.engine.kempnerforge.config import find_config, read_toml
from desktop.engine.kempnerforge.layout import resolve_checkpoint
from desktop.engine.runs.budget import RunBudget

DEFAULT_DIR = "tb_logs"  # KempnerForge's metrics.tensorboard_dir
MAX_FILES = 64
MAX_LISTED = 10_000  # folder entries looked at, for a folder of millions
# torch writes an event of ~60 bytes and 6 fields per value: the run budget's values fit in these,
# and a hostile file costs no more than an honest one that fills them (a field is 1-2 µs, a byte
# of checksum ~0.1 µs).
MAX_RUN_BYTES = 32 * MB
MAX_RUN_EVENTS = 2_000_000
MAX_RUN_FIELDS = 3_000_000  # six a value: the run budget's 500,000
_STARTED = re.compile(r"tfevents\.(\d{1,20})")  # events.out.tfevents.<start time>.<host>.<pid>.<n>


class _ReadAgain(Exception):
    """Reading on would not give what a read from the start gives: read from the start."""


@dataclass(frozen=True)
class LoggedCurve:
    """One tag's ``(step, value)`` pairs, steps ascending; ``source`` is the file it came from
    (the folder, when several files logged it)."""

    name: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    source: str


def kf_curves(
    run: Path, budget: RunBudget | None = None, max_points: int = MAX_POINTS, max_tags: int = MAX_TAGS
) -> tuple[list[LoggedCurve], list[str]]:
    """The TensorBoard scalars of the KempnerForge run ``run`` (its ``checkpoint.dir``), one
    curve per tag, and a line for each thing that was skipped or cut; what is read is spent from
    the run's ``budget`` (the timeline's, shared with the rest of the run; else one of its own)."""
    own = budget is None
    budget = RunBudget(run) if budget is None else budget
    curves, problems = KfScalars(run, max_points, max_tags).read(budget)
    return curves, problems + (budget.lines() if own else [])


class KfScalars:
    """A KempnerForge run's scalars read on as it trains: each :meth:`read` reads the frames its
    event files gained (:class:`~desktop.engine.files.tensorboard_events.EventFile`) and a new
    event file (a resumed run), and gives what :func:`kf_curves` would give now.

    A step logged again replaces what came after it, so the files must be read in their order:
    reading on is that while the files grow in order (the newest file read, or a newer one, gains
    frames). When an older file gains frames after a newer one was read, a file goes away, is
    replaced or cut short, or the newest :data:`MAX_FILES` are other files, all are read again
    from the start, once."""

    def __init__(self, run: Path, max_points: int = MAX_POINTS, max_tags: int = MAX_TAGS) -> None:
        self.run, self.max_points, self.max_tags = run, max_points, max_tags
        self._dropped_bytes = 0  # read by files since read again from the start
        self._fresh()

    def _fresh(self) -> None:
        self.scalars = Scalars(max_tags=self.max_tags, max_points=self.max_points)
        self._files: list[EventFile] = []
        self._sources: dict[str, list[Path]] = {}  # which files logged each tag, in file order

    @property
    def bytes_read(self) -> int:
        """Bytes of event files read by every read so far."""
        return self._dropped_bytes + sum(one.bytes_read for one in self._files)

    def read(self, budget: RunBudget) -> tuple[list[LoggedCurve], list[str]]:
        """The run's curves as they stand now, and the problem lines; the values read are spent
        from the run's ``budget`` (its values then are what every read may read)."""
        problems: list[str] = []
        paths: list[Path] = []
        try:
            folders = event_folders(self.run)
        except PathRefused as exc:
            folders = []
            problems.append(f"{exc}; no TensorBoard scalars read")
        for folder in folders:
            found, line = event_files(folder)
            paths += found
            problems += [line] if line else []
        try:
            lines, values = self._read_on(paths, budget.values_left)
        except _ReadAgain:
            self._dropped_bytes = self.bytes_read
            self._fresh()
            lines, values = self._read_on(paths, budget.values_left)  # from nothing: in order
        budget.take_values(values)  # within what was left: a file's own line says where it stopped
        return self._curves(paths, budget, problems + lines)

    def _read_on(self, paths: list[Path], values_left: int) -> tuple[list[str], int]:
        """Read what ``paths`` (oldest first) gained since the last read, within the run's budgets:
        the problem lines and the values read in all; _ReadAgain when that would not be what a
        read from the start gives."""
        if [one.path for one in self._files] != paths[: len(self._files)]:
            raise _ReadAgain  # a file went away, or an older one came
        kept = self._files
        self._files = files = kept + [EventFile(path, self.scalars) for path in paths[len(kept) :]]
        begun = [one.done.events > 0 or one.stop is not None for one in files]
        problems: list[str] = []
        # what the run's budgets leave for each file: what the files before it did not take
        bytes_left, events_left, fields_left = MAX_RUN_BYTES, MAX_RUN_EVENTS, MAX_RUN_FIELDS
        values = values_left
        for index, one in enumerate(files):
            if min(bytes_left, events_left, fields_left, values) <= 0:
                problems.append(f"{one.path}: not read (a run's event files are read up to the limit)")
                continue
            before = {tag: s.logged for tag, s in self.scalars.series.items()}
            events = one.done.events
            try:
                one.read(min(bytes_left, MAX_FILE_BYTES), events_left, values, fields_left)
            except FileReplaced:
                raise _ReadAgain from None
            if one.done.events != events and any(begun[index + 1 :]):
                raise _ReadAgain  # an older file gained events after a newer one was read
            bytes_left -= one.done.bytes_read
            events_left -= one.done.events
            fields_left -= one.done.fields
            values -= one.done.values
            problems += one.problems()
            self._note_sources(one.path, before)
        return problems, values_left - values

    def _note_sources(self, path: Path, before: dict[str, int]) -> None:
        """``path`` noted as a source of each tag it logged values of (``before``: their counts
        before it was read)."""
        for tag, series in self.scalars.series.items():
            sources = self._sources.setdefault(tag, [])
            if series.logged != before.get(tag, 0) and path not in sources:
                sources.append(path)

    def _curves(
        self, paths: list[Path], budget: RunBudget, problems: list[str]
    ) -> tuple[list[LoggedCurve], list[str]]:
        """One curve per tag kept (each a series of the run's ``budget``), and the lines."""
        scalars = self.scalars
        if scalars.values_left_out:
            problems.append(
                f"{paths[0].parent}: more than {self.max_tags} tags; "
                f"{scalars.values_left_out:,} values of the others are left out"
            )
        curves = []
        for tag, series in scalars.series.items():
            if not budget.take_series((tag, "kempnerforge")):
                continue
            steps, _, values = series.points()
            sources = self._sources.get(tag, [])
            source = str(sources[0]) if len(sources) == 1 else str(paths[0].parent)
            if series.sampled:
                problems.append(
                    f"{source}: {tag}: {series.logged:,} values, drawn as {len(steps):,} evenly spaced"
                )
            curves.append(LoggedCurve(tag, tuple(map(float, steps)), tuple(values), source))
        return curves, problems


def event_folders(run: Path) -> list[Path]:
    """Where the run's ``SummaryWriter`` wrote, by its training TOML's settings (see above);
    PathRefused when the TOML names a folder no path can be."""
    toml, data = _training_toml(run)
    metrics, checkpoint = data.get("metrics"), data.get("checkpoint")
    stated = metrics.get("tensorboard_dir") if isinstance(metrics, dict) else None
    ckpt_dir = checkpoint.get("dir") if isinstance(checkpoint, dict) else None
    launch = run.parent
    if isinstance(ckpt_dir, str) and ckpt_dir and not Path(ckpt_dir).is_absolute():
        parts = Path(ckpt_dir).parts
        if ".." not in parts and run.parts[-len(parts) :] == parts:
            launch = Path(*run.parts[: -len(parts)]) if len(parts) < len(run.parts) else Path()
    if isinstance(stated, str) and stated:
        try:
            return [named_path(launch / stated)]  # an absolute tensorboard_dir stays as it is
        except PathRefused as exc:
            raise PathRefused(f"{toml}: metrics.tensorboard_dir", exc.reason) from None
    return list(dict.fromkeys([launch / DEFAULT_DIR, run / DEFAULT_DIR]))


def _training_toml(run: Path) -> tuple[Path | None, dict[str, Any]]:
    """The run's training TOML and what it holds, or (None, {}) when it has none that reads."""
    try:
        path = find_config(resolve_checkpoint(run))
        return path, read_toml(path)
    except CheckpointError:
        return None, {}


def event_files(folder: Path) -> tuple[list[Path], str | None]:
    """The event files in ``folder``, oldest first, at most :data:`MAX_FILES` (the newest), and a
    line when some were left out."""
    try:
        with os.scandir(folder) as entries:
            names = [e.name for e in itertools.islice(entries, MAX_LISTED) if "tfevents" in e.name]
    except OSError:
        return [], None  # no such folder: the run logged nothing to TensorBoard
    names.sort(key=_started)
    line = None
    if len(names) > MAX_FILES:
        line = f"{folder}: {len(names):,} event files; the newest {MAX_FILES} are read"
        names = names[-MAX_FILES:]
    return [folder / n for n in names], line


def _started(name: str) -> tuple[int, str]:
    m = _STARTED.search(name)
    return (int(m.group(1)) if m else 0, name)
