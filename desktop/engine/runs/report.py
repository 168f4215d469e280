"""A run's report card as Markdown (Qt-free): what a reader of the run, or of a model card made
from it, would look for, from what the run's files state.

Upstream nanochat wrote a ``report.md`` until it was deleted; since then people rebuild model cards
by hand from metas and logs. The card holds the curves (PNG files the caller drew, named here),
every saved step with its numbers and file hash, the eval scores per step, what each step said to
the sample prompts, the training config and how it changed, and a section that says which fields
a model card on a hub asks for and which of them the run's files cannot answer.

Every string that came from a file is escaped for a Markdown table cell: a meta may hold ``|``,
newlines or HTML, and the card must read the same in any viewer.
"""

from __future__ import annotations

import html
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import FileRefused
from desktop.engine.files.content_hash import sha256_of_files
from desktop.engine.kempnerforge import config as kf_config
from desktop.engine.kempnerforge.layout import dcp_dirs_of, resolve_checkpoint
from desktop.engine.nanochat import checkpoint as ckpt
from desktop.engine.runs.evals import Sample
from desktop.engine.runs.timeline import Point, Timeline
from desktop.engine.text_lines import one_line

StepKey = tuple[str, int]  # (stage, step)
MAX_CELL = 200  # characters of one sample or config value in a table cell

# What a Hugging Face model card's metadata and sections ask for, and whether a run states it.
CARD_FIELDS = (
    ("license", "the licence of the weights", False),
    ("datasets", "the training data", False),
    ("language", "the languages it was trained on", False),
    ("pipeline_tag", "text-generation", True),
    ("library_name", "how it loads (nanochat, KempnerForge, transformers)", True),
    ("model-index", "evaluation results: the eval table below", True),
    ("training hyperparameters", "the config below", True),
    ("intended use and limitations", "what it is for and must not be used for", False),
    ("bias, risks", "known failure modes", False),
    ("compute", "hardware and training time", False),
)


@dataclass(frozen=True)
class RunReport:
    """Everything the card shows; the caller gathers it (plots drawn, hashes computed)."""

    timeline: Timeline
    plots: Sequence[tuple[str, str]] = ()  # (metric, PNG file name next to the card)
    hashes: Mapping[StepKey, str] = field(default_factory=dict)  # sha256 of each step's weights
    scores: Mapping[str, Mapping[StepKey, float]] = field(default_factory=dict)  # task -> step -> score
    samples: Sequence[Sample] = ()
    config: Mapping[str, object] = field(default_factory=dict)  # the first step's settings
    written_at: datetime | None = None


def weights_files(point: Point) -> list[Path]:
    """The files that hold a saved step's weights: nanochat's ``model_<step>.pt``, a
    KempnerForge step's DCP shards and ``.metadata`` (by name, stage by stage)."""
    if point.stage == "kempnerforge":
        step_dir = point.path / f"step_{point.step}"
        return [f for d in dcp_dirs_of(step_dir) for f in sorted(d.iterdir()) if f.is_file()]
    return [ckpt.model_file(point.path, point.step)]


def step_hashes(timeline: Timeline, cancel: threading.Event | None = None) -> dict[StepKey, str]:
    """The weights hash of each saved step, as far as it got before ``cancel``; a step whose
    files cannot be read is left out (the card shows no hash for it)."""
    hashes: dict[StepKey, str] = {}
    for point in timeline.points:
        try:
            digest = sha256_of_files(weights_files(point), cancel)
        except (NanoscopeError, FileRefused, OSError):
            continue
        if digest is None:
            break
        hashes[(point.stage, point.step)] = digest
    return hashes


def run_config(timeline: Timeline) -> dict[str, object]:
    """The settings the run's first step was trained with, flattened (``model_config.n_layer``,
    ``train.lr``, …): a nanochat meta's model and user config, a KempnerForge run's TOML. Empty
    when the file cannot be read (the timeline has already said why)."""
    if not timeline.points:
        return {}
    first = timeline.points[0]
    try:
        if first.stage == "kempnerforge":
            data: dict[str, object] = kf_config.read_toml(
                kf_config.find_config(resolve_checkpoint(first.path, first.step))
            )
        else:
            meta = ckpt.read_meta(ckpt.meta_file(first.path, first.step))
            data = {k: meta[k] for k in ("model_config", "user_config") if isinstance(meta.get(k), dict)}
    except NanoscopeError:
        return {}
    return dict(_flatten(data))


def _flatten(data: Mapping[str, object], prefix: str = "", depth: int = 0) -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and depth < 4:
            found += _flatten(value, name + ".", depth + 1)
        elif value is None or isinstance(value, (bool, int, float, str)):
            found.append((name, value))
    return found


def cell(value: object) -> str:
    """``value`` as one Markdown table cell: one line, pipes and HTML escaped, bounded."""
    text = one_line(value, fold=True, limit=MAX_CELL)
    return html.escape(text, quote=False).replace("|", "\\|")


def number(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def report_markdown(report: RunReport) -> str:
    """The card, as Markdown text."""
    t = report.timeline
    written = (report.written_at or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# {cell(t.name)}", "", f"Report written by Nanoscope on {written}.", ""]
    lines += _summary(t)
    lines += _curves(report)
    lines += _steps(report)
    lines += _scores(report)
    lines += _samples(report.samples)
    lines += _config(report)
    lines += _model_card(report)
    return "\n".join(lines).rstrip() + "\n"


def _summary(t: Timeline) -> list[str]:
    stages = " → ".join(stage for _, stage in t.stages) or "none"
    lines = [f"- Saved steps: {len(t.points)} ({stages})"]
    tokens = [p.tokens for p in t.points if p.tokens is not None]
    if tokens:
        lines.append(f"- Tokens seen at the last step with a count: {tokens[-1]:,}")
    size = sum(p.file_bytes for p in t.points)
    lines.append(f"- Weights on disk: {size / 1e6:,.1f} MB")
    lines += [f"- Note: {cell(note)}" for note in t.notes]
    lines += [f"- Left out: {cell(problem)}" for problem in t.problems[:20]]
    if len(t.problems) > 20:
        lines.append(f"- … and {len(t.problems) - 20} more values left out")
    return [*lines, ""]


def _curves(report: RunReport) -> list[str]:
    if not report.plots:
        return []
    lines = ["## Curves", ""]
    for metric, png in report.plots:
        lines += [f"![{cell(metric)}]({png})", ""]
    return lines


def _step_label(point: Point) -> str:
    return f"{point.stage} {point.step:,}"


def _steps(report: RunReport) -> list[str]:
    t = report.timeline
    metrics = [m for m in t.metric_names() if t.series(m)]
    header = ["step", "tokens", *map(cell, metrics), "MB", "sha256"]
    rows = [
        [
            _step_label(p),
            f"{p.tokens:,}" if p.tokens is not None else "",
            *(number(p.metrics[m]) if m in p.metrics else "" for m in metrics),
            f"{p.file_bytes / 1e6:.1f}",
            f"`{report.hashes[(p.stage, p.step)]}`" if (p.stage, p.step) in report.hashes else "",
        ]
        for p in t.points
    ]
    return ["## Saved steps", "", *table(header, rows), ""]


def _scores(report: RunReport) -> list[str]:
    if not report.scores:
        return []
    tasks = list(report.scores)
    keys = [(p.stage, p.step) for p in report.timeline.points]
    keys += [k for task in tasks for k in report.scores[task] if k not in keys]
    rows = [
        [
            f"{stage} {step:,}",
            *(
                number(report.scores[t][(stage, step)]) if (stage, step) in report.scores[t] else ""
                for t in tasks
            ),
        ]
        for stage, step in keys
        if any((stage, step) in report.scores[t] for t in tasks)
    ]
    return ["## Evaluations", "", *table(["step", *map(cell, tasks)], rows), ""]


def _samples(samples: Sequence[Sample]) -> list[str]:
    if not samples:
        return []
    steps: dict[StepKey, None] = {}
    prompts: dict[str, None] = {}
    said: dict[tuple[str, StepKey], str] = {}
    for s in samples:
        steps[(s.stage, s.step)] = None
        prompts[s.prompt] = None
        said[(s.prompt, (s.stage, s.step))] = s.text
    header = ["prompt", *(f"{stage} {step:,}" for stage, step in steps)]
    rows = [[cell(p), *(cell(said.get((p, k), "")) for k in steps)] for p in prompts]
    return [
        "## What each step says",
        "",
        "Greedy continuations of each prompt.",
        "",
        *table(header, rows),
        "",
    ]


def _config(report: RunReport) -> list[str]:
    lines: list[str] = []
    if report.config:
        rows = [[cell(k), cell(v)] for k, v in report.config.items()]
        lines += ["## Config", "", *table(["setting", "value"], rows), ""]
    changed = [(p, k, v) for p in report.timeline.points for k, v in p.changes.items()]
    if changed:
        rows = [[_step_label(p), cell(k), cell(before), cell(after)] for p, k, (before, after) in changed]
        lines += [
            "## Config changes between steps",
            "",
            *table(["step", "setting", "before", "after"], rows),
            "",
        ]
    return lines


def _model_card(report: RunReport) -> list[str]:
    """Which model card fields the run answers, and which a person must fill in."""
    lines = [
        "## For a model card",
        "",
        "A model card on a hub asks for these; the run's files answer some of them.",
        "",
    ]
    answered = {
        "model-index": bool(report.scores),
        "training hyperparameters": bool(report.config),
    }
    for name, what, from_run in CARD_FIELDS:
        known = answered.get(name, from_run)
        lines.append(f"- [{'x' if known else ' '}] **{name}**: {what}{'' if known else ' (fill in)'}")
    return [*lines, ""]
