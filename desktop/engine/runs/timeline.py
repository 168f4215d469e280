"""A training run as one timeline: every saved step with the numbers its files state (Qt-free).

Only metas and small metadata files are read, never weights, so a run of hundreds of steps is
drawn at once:

* nanochat: ``<base>/<phase>_checkpoints/<tag>/meta_<step>.json``. The stages of one tag (base →
  mid → sft → rl) are chained as segments of one timeline: each stage's steps start where the
  previous stage's last step ended, so the x-axis stays put as stages are added. Numbers are the
  meta's top-level metrics (``val_bpb``, ``val_loss``, the SFT accuracies, …) and base_train's
  ``loop_state`` (``min_val_bpb``, ``smooth_train_loss``, ``total_training_time``); tokens are
  ``step × total_batch_size`` where the meta states the batch.
* nanochat's experiment layout (upstream PR #800): ``<experiment>/<tag>/<stage>/meta_<step>.json``,
  stages chained the same way, plus the records of the stage logs beside them (``base_train.log``'s
  ``eval step= val_bpb=``, ``core``, ``sft.log``'s ``chatcore`` …) as curves and the experiment's
  ``meta.json`` (name, commit, clean or dirty tree, dataset) as :attr:`Timeline.about`
  (:mod:`.experiment_logs`).
* KempnerForge: ``run/step_<N>/metadata.json`` (``step``, ``tokens_seen``), and the scalars its
  TensorBoard logger wrote (one curve per tag: train/loss, grad_norm, lr, …).

Numbers logged more often than checkpoints are saved (a training log's evaluations, TensorBoard
scalars) are :class:`Curve` s on the same x-axis; a saved step's marker sits on them.

val_bpb counts the bytes of each token through ``token_bytes.pt``; upstream fixed how that file is
computed on 2026-07-03 (nanochat 2ce972a: 193 of 32,768 tokens were counted too long), so runs
after it read about 0.05% higher. A run with bpb numbers saved on both sides of that date gets a
note (by the metas' modification times, the only date a meta has).

A value that is not a finite number (NaN, a string, a list) is left out with one line naming the
file and the key (a few per meta, then a count); a model file whose meta is missing or unreadable
(not a file, a named pipe, not JSON) leaves its step out with one line naming it, and the rest of
the run is listed. A run is read under one :class:`~.budget.RunBudget` shared by its stages and
files: saved steps, series, values (a meta's metrics and settings, a log's fields, TensorBoard
values) and meta bytes are counted for the whole run, and what is past them is left out with one
line each.

A run still training is read again and again by one :class:`RunReader`: each read gives what
:func:`timeline_of` would give then (``timeline_of`` is a reader's first read), reading only what
the stage logs and event files gained since the last read and the metas not parsed as they are
now, so an hours-long log is not read again whole for a point it gained.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeGuard

from desktop.engine.discovery import PHASES
from desktop.engine.errors import CheckpointError, NanoscopeError
from desktop.engine.files.bounded import FileRefused, read_json
from desktop.engine.files.numbers import NotANumber, NumberRefused, finite_float
from desktop.engine.kempnerforge.layout import is_kf_target, run_dir, run_steps
from desktop.engine.nanochat import checkpoint as ckpt
from desktop.engine.nanochat.experiment_layout import is_stage_folder, is_tag_folder, stage_folders
from desktop.engine.runs.budget import Problems, RunBudget
from desktop.engine.runs.experiment_logs import Series, StageLogs, about_note, read_about
from desktop.engine.runs.tensorboard_scalars import KfScalars

# A nanochat checkpoint folder's steps to list, ascending.
StepsOf = Callable[[Path], list[int]]

# Stages in the order a run goes through them; the fork's extra phase folders map onto them.
STAGES = ("base", "mid", "sft", "rl")
# base_train's loop_state numbers worth a curve (the rest are bookkeeping).
LOOP_STATE = ("min_val_bpb", "smooth_train_loss", "total_training_time")
# Top-level meta fields that are not metrics.
NOT_METRICS = frozenset(
    {
        "step",
        "total_batch_size",
        "model_config",
        "user_config",
        "loop_state",
        "device_batch_size",
        "max_seq_len",
    }
)
MAX_PROBLEMS_PER_META = 5  # lines about one meta's values, then a count
MAX_PROBLEM_LINES = 100  # of a run (each names its file): then a count; the budgets' lines after
BPB_FIX = datetime(2026, 7, 3, tzinfo=timezone.utc).timestamp()  # nanochat 2ce972a
BPB_NOTE = (
    "val_bpb: nanochat changed how token bytes are counted on 2026-07-03 (2ce972a); steps saved "
    "before then read about 0.05% lower than those after"
)


@dataclass(frozen=True)
class Point:
    """One saved step. ``x``: its place on the timeline (chained across stages)."""

    stage: str  # base | mid | sft | rl | kempnerforge
    step: int
    x: int
    path: Path  # what to load: the checkpoint folder (nanochat) or the run (KempnerForge)
    metrics: dict[str, float]
    tokens: int | None
    file_bytes: int
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # config vs the point before
    saved_at: float = 0.0  # the meta's modification time (seconds since the epoch; 0: unknown)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "step": self.step,
            "x": self.x,
            "path": str(self.path),
            "metrics": self.metrics,
            "tokens": self.tokens,
            "file_bytes": self.file_bytes,
            "changes": {k: list(v) for k, v in self.changes.items()},
            "saved_at": self.saved_at,
        }


@dataclass(frozen=True)
class Curve:
    """A number logged between saves (a log's evaluations, TensorBoard scalars): ``(x, value)``
    pairs on the timeline's x-axis, x ascending, from one file."""

    name: str
    stage: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    source: str  # the file it was read from

    def at(self, x: float) -> float | None:
        """The value logged last at or before ``x`` (None before the first)."""
        index = bisect.bisect_right(self.xs, x)
        return self.ys[index - 1] if index else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "xs": list(self.xs),
            "ys": list(self.ys),
            "source": self.source,
        }


@dataclass(frozen=True)
class Timeline:
    name: str
    points: tuple[Point, ...]
    problems: tuple[str, ...] = ()
    # (x where a stage starts, its name), for the segments a plot draws
    stages: tuple[tuple[int, str], ...] = ()
    curves: tuple[Curve, ...] = ()
    notes: tuple[str, ...] = ()  # what a reader of the curves should know (the bpb change)
    # (label, text) about where the run came from: an experiment's name, commit, tree, dataset
    about: tuple[tuple[str, str], ...] = ()

    def metric_names(self) -> list[str]:
        """Every metric some point or curve has, in the order they first appear."""
        seen: dict[str, None] = {}
        for point in self.points:
            seen.update(dict.fromkeys(point.metrics))
        seen.update(dict.fromkeys(c.name for c in self.curves))
        return list(seen)

    def series(self, metric: str) -> list[Point]:
        """The points that have ``metric``, in timeline order."""
        return [p for p in self.points if metric in p.metrics]

    def line(self, metric: str) -> list[tuple[float, float]]:
        """Every known ``(x, value)`` of ``metric``: its curves' samples and the saved steps'
        own values, x ascending (a step's own value wins where both sit on one x)."""
        found: dict[float, float] = {}
        for curve in self.curves:
            if curve.name == metric:
                found.update(zip(curve.xs, curve.ys, strict=True))
        found.update((float(p.x), p.metrics[metric]) for p in self.series(metric))
        return sorted(found.items())

    def value_at(self, point: Point, metric: str) -> float | None:
        """Where ``point`` 's marker sits on ``metric``: its own value, else the value its
        stage's curve logged last at or before it."""
        if metric in point.metrics:
            return point.metrics[metric]
        for curve in self.curves:
            if (
                curve.name == metric
                and curve.stage == point.stage
                and (value := curve.at(point.x)) is not None
            ):
                return value
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stages": [list(s) for s in self.stages],
            "points": [p.to_dict() for p in self.points],
            "curves": [c.to_dict() for c in self.curves],
            "problems": list(self.problems),
            "notes": list(self.notes),
            "about": dict(self.about),
        }


def timeline_of(target: Path) -> Timeline:
    """The timeline of the run ``target`` names: a nanochat ``<phase>_checkpoints/<tag>`` folder
    (its tag's other stages join it), an experiment's ``<name>/<tag>`` folder or one of its stage
    folders, or a KempnerForge run or step folder. NanoscopeError for a folder that is none."""
    return RunReader(target).read()


class RunReader:
    """The run ``target`` names (as :func:`timeline_of` takes it) read again and again while it
    trains: each :meth:`read` gives the whole timeline as it stands, what :func:`timeline_of`
    gives at that moment, but reads only what the run's logs and event files gained since the
    last read (:class:`~.experiment_logs.StageLogs`, :class:`~.tensorboard_scalars.KfScalars`)
    and the metas it has not parsed as they are now (:class:`MetaCache`). The run's budgets
    bound every read as they bound one: what the logs spent stays spent.

    Not thread-safe: one reader is read by one thread at a time."""

    def __init__(self, target: Path, steps_of: StepsOf = ckpt.model_steps) -> None:
        """``steps_of``: a nanochat folder's steps to list (a watched run: those whose save
        settled, engine/runs/saving.py); by default every step with a model file."""
        self.target = Path(target).expanduser()
        self.steps_of = steps_of
        self.metas = MetaCache()
        self._logs: StageLogs | None = None
        self._scalars: KfScalars | None = None

    @property
    def bytes_read(self) -> int:
        """Bytes of stage logs and event files read by every read so far (metas: :attr:`metas`)."""
        logs = self._logs.bytes_read if self._logs else 0
        return logs + (self._scalars.bytes_read if self._scalars else 0)

    def read(self) -> Timeline:
        """The run's timeline now. NanoscopeError when the target is not (or no longer) a run."""
        target = self.target
        try:
            if is_stage_folder(target) and is_tag_folder(target.parent):
                return self._experiment(target.parent)
            if is_tag_folder(target):
                return self._experiment(target)
            if is_kf_target(target):
                return self._kempnerforge(run_dir(target))
            if ckpt.model_steps(target):
                return _nanochat(target, self.metas, self.steps_of)
        finally:
            self.metas.forget_unused()
        raise NanoscopeError(
            f"{target}: not a training run (a nanochat <phase>_checkpoints/<tag> folder, an "
            "experiment's <name>/<tag> folder, or a KempnerForge run)"
        )

    def _experiment(self, tag_folder: Path) -> Timeline:
        if self._logs is None or self._logs.tag_folder != tag_folder:
            self._logs = StageLogs(tag_folder)
        return _experiment(tag_folder, self._logs, self.metas, self.steps_of)

    def _kempnerforge(self, run: Path) -> Timeline:
        if self._scalars is None or self._scalars.run != run:
            self._scalars = KfScalars(run)
        return _kempnerforge(run, self._scalars, self.metas)


class MetaCache:
    """Metas (and the other small files a timeline parses whole) kept parsed by path, with the
    ``st_mtime_ns`` and ``st_size`` they had: one rewritten is parsed again, the rest never.
    What a parse raised is kept too (a meta that does not parse does not parse again). Kept only
    while a read still asks for it, so a run's metas bound what is kept."""

    def __init__(self) -> None:
        self._kept: dict[Path, tuple[tuple[int, int], Any, Exception | None]] = {}
        self._asked: set[Path] = set()
        self.parsed = 0  # parses run, by every read

    def parse(self, path: Path, parse: Callable[[Path], Any]) -> Any:
        """What ``parse(path)`` gives (or raises), parsed again only when the file changed."""
        try:
            stat = os.stat(path)
        except OSError:
            return parse(path)  # it says why it cannot be read
        key = (stat.st_mtime_ns, stat.st_size)
        self._asked.add(path)
        kept = self._kept.get(path)
        if kept is None or kept[0] != key:
            kept = self._kept[path] = (key, *self._run(parse, path))
        if kept[2] is not None:
            raise kept[2].with_traceback(None)  # a fresh traceback each time, not a growing one
        return kept[1]

    def _run(self, parse: Callable[[Path], Any], path: Path) -> tuple[Any, Exception | None]:
        self.parsed += 1
        try:
            return parse(path), None
        except (FileRefused, NanoscopeError) as exc:  # what a meta's reader says of it
            return None, exc

    def forget_unused(self) -> None:
        """Forget what the last read did not ask for (steps gone, a run left)."""
        self._kept = {path: kept for path, kept in self._kept.items() if path in self._asked}
        self._asked = set()


def _stage_folders(folder: Path, steps_of: StepsOf) -> list[tuple[str, Path]]:
    """(stage, folder) for each stage of ``folder`` 's tag in the same base dir, in run order;
    a folder outside a nanochat layout is a run of its own."""
    phase = PHASES.get(folder.parent.name)
    if phase is None:
        return [("folder", folder)]
    base, tag = folder.parent.parent, folder.name
    found: dict[str, Path] = {}
    for name, stage in PHASES.items():
        candidate = base / name / tag
        if stage not in found and steps_of(candidate):
            found[stage] = candidate
    found.setdefault(phase, folder)
    return [(stage, found[stage]) for stage in STAGES if stage in found]


def _nanochat(folder: Path, metas: MetaCache, steps_of: StepsOf) -> Timeline:
    points: list[Point] = []
    problems: list[str] = []
    stages: list[tuple[int, str]] = []
    offset = 0
    previous: dict[str, Any] | None = None
    budget = RunBudget(folder)
    for stage, directory in _stage_folders(folder, steps_of):
        steps = budget.take_steps(steps_of(directory))
        if not steps:
            continue
        stages.append((offset, stage))
        previous = _stage_points(stage, directory, steps, offset, previous, points, problems, budget, metas)
        offset += steps[-1]
    name = folder.name if len(stages) < 2 else f"{folder.name} ({' → '.join(s for _, s in stages)})"
    said = _said(folder, problems, budget)
    return Timeline(name, tuple(points), said, tuple(stages), notes=bpb_notes(points))


def _stage_points(
    stage: str,
    directory: Path,
    steps: list[int],
    offset: int,
    previous: dict[str, Any] | None,
    points: list[Point],
    problems: list[str],
    budget: RunBudget,
    metas: MetaCache,
) -> dict[str, Any] | None:
    """The saved steps of one stage appended to ``points`` (x from ``offset``); returns the last
    step's config, which the next stage's first step is compared with. A step whose meta is
    missing or unreadable is left out with one line; past the run's meta budget a step is listed
    without its numbers."""
    for step in steps:
        try:
            meta_path = ckpt.meta_file(directory, step)
            meta = _read_meta(meta_path, budget, metas)
        except NanoscopeError as exc:
            problems.append(str(exc))
            continue
        metrics = _metrics(meta, meta_path, stage, problems, budget)
        batch = meta.get("total_batch_size")
        tokens = step * batch if _is_count(batch) else None
        config = _config(meta, budget)
        changes = _changes(previous, config) if config is not None else {}
        previous = config if config is not None else previous
        points.append(
            Point(
                stage,
                step,
                offset + step,
                directory,
                metrics,
                tokens,
                _size(directory, step),
                changes,
                _mtime(meta_path),
            )
        )
    return previous


def _read_meta(path: Path, budget: RunBudget, metas: MetaCache) -> dict[str, Any]:
    """The meta at ``path`` ({} past the run's meta budget); CheckpointError when unreadable."""
    try:
        size = _bytes_of(path)
    except FileRefused as exc:
        raise CheckpointError(str(exc)) from None
    return metas.parse(path, ckpt.read_meta) if budget.take_meta(size) else {}


def _bytes_of(path: Path) -> int:
    """What a file weighs before it is read (what the run's meta budget counts)."""
    try:
        return path.stat().st_size
    except OSError as exc:
        raise FileRefused(path, f"cannot read ({exc.strerror or exc})") from None


def _experiment(tag_folder: Path, logs: StageLogs, metas: MetaCache, steps_of: StepsOf) -> Timeline:
    """An experiment's tag: its stages' saved steps chained as in the phase layout, its stage
    logs' records as curves on the same x-axis, its meta.json as ``about``."""
    points: list[Point] = []
    stages: list[tuple[int, str]] = []
    curves: list[Curve] = []
    logged: dict[str, list[Series]] = {}
    series, problems = logs.read()
    budget = logs.budget.copy()  # the metas spend what the logs left, at every read
    for one in series:
        logged.setdefault(one.stage, []).append(one)
    saved = dict(stage_folders(tag_folder))
    offset = 0
    previous: dict[str, Any] | None = None
    for stage in STAGES:
        if stage not in saved and stage not in logged:
            continue
        stages.append((offset, stage))
        steps = budget.take_steps(steps_of(saved[stage])) if stage in saved else []
        previous = (
            _stage_points(stage, saved[stage], steps, offset, previous, points, problems, budget, metas)
            if steps
            else previous
        )
        for one in logged.get(stage, []):
            xs = tuple(float(offset + step) for step in one.steps)
            curves.append(Curve(one.name, stage, xs, one.values, one.source))
        # A stage that crashed before its first save still spans what it logged.
        offset += (
            steps[-1]
            if steps
            else max((one.steps[-1] for one in logged.get(stage, []) if one.steps), default=0)
        )
    about, lines = read_about(tag_folder.parent, lambda path: metas.parse(path, _read_config))
    problems += lines
    name = f"{tag_folder.parent.name}/{tag_folder.name}"
    if len(stages) > 1:
        name += f" ({' → '.join(s for _, s in stages)})"
    notes = bpb_notes(points) + ((about_note(about),) if about else ())
    said = _said(tag_folder, problems, budget)
    return Timeline(name, tuple(points), said, tuple(stages), tuple(curves), notes, about)


def _said(run: Path, problems: list[str], budget: RunBudget) -> tuple[str, ...]:
    """The run's problem lines: the first MAX_PROBLEM_LINES (a run of 100,000 steps without metas
    would give as many), a count of the rest, then a line for each budget that ran out."""
    more = len(problems) - MAX_PROBLEM_LINES
    tail = [f"{run}: {more:,} more problem lines skipped"] if more > 0 else []
    return (*problems[:MAX_PROBLEM_LINES], *tail, *budget.lines())


def bpb_notes(points: list[Point]) -> tuple[str, ...]:
    """The bpb note, for a run whose bpb numbers were saved on both sides of the fix."""
    dates = [p.saved_at for p in points if p.saved_at and any("bpb" in k for k in p.metrics)]
    return (BPB_NOTE,) if dates and min(dates) < BPB_FIX <= max(dates) else ()


def _kempnerforge(run: Path, scalars: KfScalars, metas: MetaCache) -> Timeline:
    points: list[Point] = []
    problems: list[str] = []
    budget = RunBudget(run)
    for step in budget.take_steps(run_steps(run)):
        path = run / f"step_{step}" / "metadata.json"
        tokens = None
        try:
            # its bytes are the run's meta bytes: a step's metadata.json may weigh 64 MB
            data = metas.parse(path, _read_config) if budget.take_meta(_bytes_of(path)) else {}
        except FileRefused as exc:
            if os.path.lexists(path):  # none at all: a step still being written, no tokens
                problems.append(str(exc))
            data = {}
        if isinstance(data, dict):
            seen = data.get("tokens_seen")
            if _is_count(seen):
                tokens = int(seen)
            elif seen is not None:
                problems.append(f"{path}: tokens_seen is not a count; left out")
        size = sum(p.stat().st_size for p in (run / f"step_{step}").glob("*.distcp") if p.is_file())
        points.append(Point("kempnerforge", step, step, run, {}, tokens, size))
    logged, lines = scalars.read(budget)
    problems += lines
    curves = tuple(Curve(c.name, "kempnerforge", c.xs, c.ys, c.source) for c in logged)
    stages = ((0, "kempnerforge"),) if points else ()
    return Timeline(run.name, tuple(points), _said(run, problems, budget), stages, curves=curves)


def _read_config(path: Path) -> Any:
    """A small JSON file whole (a KempnerForge step's metadata, an experiment's meta.json)."""
    return read_json(path, "config")


def _metrics(
    meta: dict[str, Any], path: Path, stage: str, problems: list[str], budget: RunBudget
) -> dict[str, float]:
    """The meta's numbers worth a curve, each a value and its name a series of the run's budget;
    anything else in their place is one line (a few per meta, then a count)."""
    found: dict[str, Any] = {k: v for k, v in meta.items() if k not in NOT_METRICS}
    loop = meta.get("loop_state")
    if isinstance(loop, dict):
        found.update({k: loop[k] for k in LOOP_STATE if k in loop})
    said = Problems(path, MAX_PROBLEMS_PER_META)
    metrics: dict[str, float] = {}
    for key, value in found.items():
        try:
            number = finite_float(value)
        except NotANumber:  # a list or a dict is not meant as a metric; a word or null in its place is
            if isinstance(value, str) or value is None:
                said.add(f"{key} is not a number; left out")
            continue
        except NumberRefused as exc:
            said.add(f"{key} {exc}; left out")
            continue
        if not budget.take_series((key, stage)):
            continue
        if not budget.take_values(1):
            break
        metrics[key] = number
    problems += said.lines()
    return metrics


def _config(meta: dict[str, Any], budget: RunBudget) -> dict[str, Any] | None:
    """The settings a step was trained with, flattened (model_config and user_config); each one
    read is a value of the run's budget (a hostile meta may hold a million). None: not read (no
    meta, or no values left), so nothing is said to have changed."""
    sections = {name: meta.get(name) for name in ("model_config", "user_config")}
    read = {name: values for name, values in sections.items() if isinstance(values, dict)}
    if not meta or not budget.take_values(sum(len(values) for values in read.values())):
        return None
    return {f"{name}.{k}": v for name, values in read.items() for k, v in values.items() if _is_scalar(v)}


def _changes(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    if before is None:
        return {}
    keys = sorted(set(before) | set(after))
    return {k: (before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)}


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _size(directory: Path, step: int) -> int:
    try:
        return ckpt.model_file(directory, step).stat().st_size
    except (NanoscopeError, OSError):
        return 0
