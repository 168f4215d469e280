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
bounds per file and tag.
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
    Scalars,
    read_event_file,
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
    problems: list[str] = []
    files: list[Path] = []
    try:
        folders = event_folders(run)
    except PathRefused as exc:
        folders = []
        problems.append(f"{exc}; no TensorBoard scalars read")
    for folder in folders:
        found, line = event_files(folder)
        files += found
        problems += [line] if line else []
    scalars = Scalars(max_tags=max_tags, max_points=max_points)
    sources = _read(files, scalars, problems, budget)
    if scalars.values_left_out:
        problems.append(
            f"{files[0].parent}: more than {max_tags} tags; "
            f"{scalars.values_left_out:,} values of the others are left out"
        )
    curves = []
    for tag, series in scalars.series.items():
        if not budget.take_series((tag, "kempnerforge")):
            continue
        steps, _, values = series.points()
        paths = sources.get(tag, [])
        source = str(paths[0]) if len(paths) == 1 else str(files[0].parent)
        if series.sampled:
            problems.append(
                f"{source}: {tag}: {series.logged:,} values, drawn as {len(steps):,} evenly spaced"
            )
        curves.append(LoggedCurve(tag, tuple(map(float, steps)), tuple(values), source))
    return curves, problems + (budget.lines() if own else [])


def _read(files: list[Path], scalars: Scalars, problems: list[str], run: RunBudget) -> dict[str, list[Path]]:
    """Read ``files`` in order into ``scalars`` within the run's budgets; which files logged
    each tag."""
    sources: dict[str, list[Path]] = {}
    budget, events, walked = MAX_RUN_BYTES, MAX_RUN_EVENTS, MAX_RUN_FIELDS
    for path in files:
        if min(budget, events, walked, run.values_left) <= 0:
            problems.append(f"{path}: not read (a run's event files are read up to the limit)")
            continue
        before = {tag: s.logged for tag, s in scalars.series.items()}
        read = read_event_file(path, scalars, min(budget, MAX_FILE_BYTES), events, run.values_left, walked)
        budget -= read.bytes_read
        events -= read.events
        walked -= read.fields
        run.take_values(read.values)  # within what was left: the file's own line says where it stopped
        problems += read.problems
        for tag, series in scalars.series.items():
            if series.logged != before.get(tag, 0):
                sources.setdefault(tag, []).append(path)
    return sources


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
