"""What a nanochat experiment's files say about its run (upstream PR #800's layout; Qt-free).

Stage logs: nanochat's stage scripts print to stdout and its runner tees that into one log per
stage beside the checkpoints (``<tag>/base_train.log``, ``sft.log``, ``chat_eval.log``, …). Most
of a log is prose; the lines that carry data follow nanochat's record grammar (``nanochat/logfmt.py``
on that branch): ``<tag> key=value key=value …``, values with spaces shell-quoted, numbers as
written. A record with a ``step`` (``eval step= val_bpb=``, ``core step= core=``, ``chatcore
step= chatcore= …``, chat_eval's ``summary source= step= …``) gives each of its numbers a point
on a series of that name; ``eflops`` is an x of its own, not a series.

A prose line (no ``key=value`` after the tag, as base_train's ``step 00042/…`` progress lines) is
skipped quietly, as nanochat's own parser skips it. A record that cannot be parsed, a ``step`` that
is not a count below 2^53, or a value that is NaN, infinite, too large for a float or a word where
a metric belongs is one line naming the file and line (at most ``MAX_PROBLEMS_PER_FILE`` of them,
then a count); the rest is read. Numbers are read by :mod:`desktop.engine.files.numbers`.

A run's logs are read under its :class:`~.budget.RunBudget`: every ``key=value`` of a record costs
a value, a new (name, stage) costs a series, and when values run out the rest of the run's logs is
left out (one line). A record's words are split in linear time (:func:`.log_lines.shell_words`).

A log still being written is read on (:class:`StageLogs`): each read takes the lines appended
since the last, the line being written once it is ended, and gives what a read from the start
would give.

``meta.json`` (the experiment's identity: name, git commit and branch, dirty flag, dataset,
creation date) is read into a few labelled strings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.engine.files.bounded import FileRefused
from desktop.engine.files.log_lines import LogLines, LogReplaced, shell_words
from desktop.engine.files.numbers import NotANumber, NumberRefused, parse_count, parse_float
from desktop.engine.runs.budget import Problems, RunBudget

# Which stage each of the runner's logs belongs to (runs/run.sh names them after the script).
LOG_STAGES = {
    "base_train.log": "base",
    "base_eval.log": "base",
    "mid_train.log": "mid",
    "sft.log": "sft",
    "chat_sft.log": "sft",
    "chat_eval.log": "sft",  # its summary's ``source`` names the stage it evaluated
    "rl.log": "rl",
    "chat_rl.log": "rl",
}
STAGE_NAMES = ("base", "mid", "sft", "rl")
# Records whose every field but the identity is a metric: a word there is a problem, not a label.
METRIC_RECORDS = frozenset({"eval", "core", "chatcore"})
# Records that may carry a step, and the tags a malformed line is recognised by.
STEP_RECORDS = METRIC_RECORDS | {"step", "summary"}
NOT_SERIES = frozenset({"step", "eflops", "source", "model_tag", "tag"})
MAX_POINTS = 100_000  # points kept per series; a log with more is cut, and said
MAX_PROBLEMS_PER_FILE = 5
ABOUT_KEYS = (
    ("name", "experiment"),
    ("git_commit", "commit"),
    ("git_branch", "branch"),
    ("git_dirty", "tree"),
    ("dataset", "dataset"),
    ("created", "created"),
)


@dataclass(frozen=True)
class Series:
    """One number logged at several steps of one stage, from one file."""

    name: str
    stage: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    source: str


def stage_logs(tag_folder: Path) -> list[tuple[str, Path]]:
    """(stage, log) for each known stage log of a tag folder, in run order."""
    logs = [(stage, tag_folder / name) for name, stage in LOG_STAGES.items() if (tag_folder / name).exists()]
    return sorted(logs, key=lambda sl: STAGE_NAMES.index(sl[0]))


def read_series(log: Path, stage: str, budget: RunBudget) -> tuple[list[Series], list[str]]:
    """Every series the records of ``log`` state (x: the step within their stage), and the
    problem lines; what it reads is spent from the run's ``budget``."""
    one = LogSeries(log, stage)
    one.read(budget)
    return one.series(), one.notes()


class LogSeries:
    """One stage log's series, read on as the log grows: each :meth:`read` takes the lines
    appended since the last (:class:`~desktop.engine.files.log_lines.LogLines`)."""

    def __init__(self, log: Path, stage: str) -> None:
        self.log, self.stage = log, stage
        self.lines = LogLines(log)
        self.problems = Problems(log, MAX_PROBLEMS_PER_FILE)
        self.found: dict[tuple[str, str], dict[int, float]] = {}
        self.refused: str | None = None  # why the last read could not read the log
        # The run's values ran out at a line of this log: a read from the start stops there too.
        self.stopped = False

    def read(self, budget: RunBudget) -> bool:
        """Read the lines appended since the last read, spending ``budget``; whether any were.
        LogReplaced when what was read of the log before is no longer its start (replaced, cut
        short, or no longer readable): it and what it spent must be read again from nothing."""
        if self.stopped:
            if self.lines.replaced():
                raise LogReplaced(f"{self.log}: replaced since it was read")
            return False
        self.refused, read_before, lines_before = None, self.lines.offset, self.lines.number
        try:
            for number, text in self.lines:
                if not budget.values_left:
                    self.stopped = True  # said once for the run, by the budget
                    break
                record = _record(text, number, self.problems, budget)
                if record is not None:
                    _add(record, self.stage, number, self.found, self.problems, budget)
        except FileRefused as exc:
            if read_before:
                raise LogReplaced(str(exc)) from None
            self.refused = str(exc)
        return self.lines.number != lines_before or self.stopped

    def series(self) -> list[Series]:
        """The series read so far (none while the log cannot be read)."""
        if self.refused:
            return []
        series = []
        for (name, where), points in self.found.items():
            steps = sorted(s for s in points if s >= 0)
            series.append(Series(name, where, tuple(steps), tuple(points[s] for s in steps), str(self.log)))
        return series

    def notes(self) -> list[str]:
        """The log's problem lines so far."""
        if self.refused:
            return [self.refused]
        notes = self.problems.lines()
        if self.lines.cut:
            notes.append(self.lines.cut_line())
        if self.lines.long_lines:
            over = self.lines.max_line // 1024
            notes.append(f"{self.log}: {self.lines.long_lines} line(s) over {over} KB skipped")
        return notes


class StageLogs:
    """A tag folder's stage logs read on as a run trains them, under one budget for all of them:
    :meth:`read` reads what each log gained and gives what a read of them all from the start
    would (:func:`read_series` of each, in order, with one budget).

    Logs are read in run order and spend one budget, so a read from the start is the same as
    reading on only while the run's budget has room (what is spent then does not depend on the
    order) or while the logs grow in order (the last one read, or one after it, gains lines: as a
    run writes them). Otherwise (the budget ran out, and an earlier log gained lines), and when a
    log went away, was replaced or cut short, all are read again from the start, once."""

    def __init__(self, tag_folder: Path) -> None:
        self.tag_folder = tag_folder
        self.budget = RunBudget(tag_folder)  # what the logs spent; the metas spend on from a copy
        self._logs: list[LogSeries] = []
        self._dropped_bytes = 0  # read by logs since read again from the start

    @property
    def bytes_read(self) -> int:
        """Bytes of the logs read by every read so far."""
        return self._dropped_bytes + sum(one.lines.bytes_read for one in self._logs)

    def read(self) -> tuple[list[Series], list[str]]:
        """Every log's series and problem lines as they stand now, in run order."""
        if not self._read_on():
            self._dropped_bytes = self.bytes_read
            self.budget, self._logs = RunBudget(self.tag_folder), []
            self._read_on()  # from nothing: a read from the start, which cannot be out of order
        series = [s for one in self._logs for s in one.series()]
        return series, [line for one in self._logs for line in one.notes()]

    def _read_on(self) -> bool:
        """Read what the logs gained since the last read; False when the result would not be what
        a read from the start gives (and the logs must be read so)."""
        kept = {(one.stage, one.log): one for one in self._logs}
        found = stage_logs(self.tag_folder)
        if not kept.keys() <= set(found):
            return False  # a log went away: what it spent cannot be given back
        self._logs = logs = [kept.get((stage, log)) or LogSeries(log, stage) for stage, log in found]
        # whether each log's lines were read before: one after a log that gains lines means
        # they are read in another order than a read from the start reads them
        begun = [bool(one.lines.number) for one in logs]
        out_of_order = False
        try:
            for index, one in enumerate(logs):
                if one.read(self.budget) and any(begun[index + 1 :]):
                    out_of_order = True
        except LogReplaced:
            return False
        return not (out_of_order and self.budget.exhausted)


def read_about(
    experiment_dir: Path, parse: Callable[[Path], Any]
) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """The experiment's identity from its ``meta.json`` (read by ``parse``: a reader that reads
    again and again keeps it) as (label, text) pairs: experiment, commit, branch, tree (clean /
    uncommitted changes), dataset, created. Absent: nothing."""
    path = experiment_dir / "meta.json"
    if not path.is_file():
        return (), []
    try:
        meta = parse(path)
    except FileRefused as exc:
        return (), [str(exc)]
    if not isinstance(meta, dict):
        return (), [f"{path}: not a JSON object; left out"]
    about: list[tuple[str, str]] = []
    problems: list[str] = []
    for key, label in ABOUT_KEYS:
        value = meta.get(key)
        if key == "git_dirty" and isinstance(value, bool):
            patch = " (diff in code_diff.patch)" if (experiment_dir / "code_diff.patch").is_file() else ""
            about.append((label, f"uncommitted changes{patch}" if value else "clean"))
        elif key != "git_dirty" and isinstance(value, str) and value:
            about.append((label, _short(value)))
        elif value is not None:
            problems.append(
                f"{path}: {key} is not {'true or false' if key == 'git_dirty' else 'text'}; left out"
            )
    return tuple(about), problems


def about_note(about: tuple[tuple[str, str], ...]) -> str:
    """One line for the status: "experiment golden · commit e4286f8 · clean · dataset …"."""
    shown = dict(about)
    parts = [f"experiment {shown['experiment']}"] if "experiment" in shown else []
    if "commit" in shown:
        parts.append(
            f"commit {shown['commit'][:7]}" + (f" on {shown['branch']}" if "branch" in shown else "")
        )
    if "tree" in shown:
        parts.append(shown["tree"] if shown["tree"] != "clean" else "clean tree")
    if "dataset" in shown:
        parts.append(f"dataset {shown['dataset']}")
    return " · ".join(parts)


def _record(text: str, number: int, problems: Problems, budget: RunBudget) -> dict[str, Any] | None:
    """A record line with a step as a dict (the tag under ``tag``); None for prose, other records,
    malformed lines (those said) and a record past the run's budget of values."""
    tag, _, rest = text.strip().partition(" ")
    if tag not in STEP_RECORDS or "=" not in rest:
        return None  # prose (base_train's "step 00042/…" lines), or a record without steps
    try:
        tokens = shell_words(rest)
    except ValueError:
        problems.add(f"{tag} record with unbalanced quotes; skipped", number)
        return None
    if not budget.take_values(len(tokens)):
        return None
    record: dict[str, Any] = {"tag": tag}
    for token in tokens:
        key, eq, value = token.partition("=")
        if not eq or not key:
            problems.add(f"{tag} record with {_short(token, 40)!r}, not key=value; skipped", number)
            return None
        record[key] = value  # text: each number is read where it is used, bounded
    if "step" not in record:
        return None  # e.g. base_train's summary: the run's totals, not a point
    try:
        record["step"] = parse_count(record["step"])
    except NumberRefused as exc:
        problems.add(f"{tag} record whose step {_short(str(exc), 80)}; skipped", number)
        return None
    return record


def _add(
    record: dict[str, Any], stage: str, number: int, found: dict, problems: Problems, budget: RunBudget
) -> None:
    source = record.get("source")
    where = source if isinstance(source, str) and source in STAGE_NAMES else stage
    for key, text in record.items():
        if key in NOT_SERIES:
            continue
        try:
            value = parse_float(text)
        except NotANumber:  # a word: a label in a summary, a problem where a metric belongs
            if record["tag"] in METRIC_RECORDS:
                problems.add(f"{key} is {_short(text, 40)!r}, not a number; left out", number)
            continue
        except NumberRefused as exc:  # nan, inf, or digits past what a float holds
            problems.add(f"{_short(key, 40)} {_short(str(exc), 80)}; left out", number)
            continue
        if not budget.take_series((key, where)):
            continue
        points = found.setdefault((key, where), {})
        if len(points) < MAX_POINTS or record["step"] in points:
            points[record["step"]] = value
        elif len(points) == MAX_POINTS:
            problems.add(f"{key}: more than {MAX_POINTS:,} points; later ones left out", number)
            points[-1] = math.nan  # one line per series: the marker makes it MAX_POINTS + 1


def _short(text: str, limit: int = 80) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
