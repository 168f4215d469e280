"""The Run tab's small pieces: a log axis that writes plain numbers, the runs among the scanned
checkpoints, a curve placed against the tokens seen, and a saved step's hover text."""

from __future__ import annotations

import html
import math
from pathlib import Path

import pyqtgraph as pg

from desktop.engine.discovery import CheckpointEntry
from desktop.engine.runs.timeline import Point, Timeline


class PlainLogAxis(pg.AxisItem):
    """Log-scale ticks as plain numbers (0.003, 0.02, 0.5): pyqtgraph writes them as 5·10⁻¹, whose
    superscript minus many fonts lack, so 0.5 read as 500."""

    def logTickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        # The value itself, whatever SI scale is set; between decades only 2 and 5 are written,
        # as 0.09, 0.08, 0.07 … overlap where a decade is a few pixels tall.
        return [f"{10**v:.3g}" if _leading_digit(10**v) in (1, 2, 5) else "" for v in values]


def _leading_digit(value: float) -> int:
    return int(round(value / 10 ** math.floor(math.log10(value)), 6)) if value > 0 else 0


def run_targets(entries: list[CheckpointEntry]) -> list[tuple[str, Path]]:
    """One (label, folder) per run among the listed checkpoints: a nanochat tag once (its
    stages are chained on one timeline), each KempnerForge run."""
    runs: dict[tuple[Path, str], tuple[str, Path]] = {}
    for e in entries:
        if e.source in ("base", "mid", "sft", "rl", "folder"):
            key = (Path(e.path).parent.parent, e.tag) if e.source != "folder" else (Path(e.path), "")
            runs.setdefault(key, (e.tag if e.source != "folder" else f"{e.tag} (folder)", Path(e.path)))
        elif e.source == "demo":
            runs.setdefault((Path(e.path), ""), (f"{e.tag} (bundled)", Path(e.path)))
        elif e.source == "kempnerforge":
            runs.setdefault((Path(e.path), ""), (f"{e.tag} (KempnerForge)", Path(e.path)))
    return list(runs.values())


def against_tokens(timeline: Timeline, line: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``line`` (x on the step axis) against the tokens seen: a logged value between saves is
    placed by its stage's tokens per step (a run's batch is fixed); a stage whose steps state no
    tokens is left out."""
    starts = sorted(start for start, _ in timeline.stages) or [0]

    def stage_start(x: float) -> int:
        return max((s for s in starts if s <= x), default=0)

    # A stage's last step sits where the next stage starts: a step's stage is its own, not its x's.
    start_of = {stage: start for start, stage in timeline.stages}
    rate: dict[int, float] = {}  # tokens per step, by the x where the stage starts
    for p in timeline.points:
        if p.tokens is not None and p.step > 0:
            rate.setdefault(start_of.get(p.stage, stage_start(p.x)), p.tokens / p.step)
    placed: list[tuple[float, float]] = []
    for x, y in line:
        start = stage_start(x)
        if start in rate:
            placed.append(((x - start) * rate[start], y))
    return placed


def point_tip(point: Point) -> str:
    """A marker's hover text: the step, its numbers, its config changes, its size."""
    lines = [f"<b>{html.escape(point.stage)} · step {point.step:,}</b>"]
    if point.tokens is not None:
        lines.append(f"{point.tokens:,} tokens")
    lines += [f"{html.escape(k)} = {v:.6g}" for k, v in point.metrics.items()]
    for key, (before, after) in list(point.changes.items())[:8]:
        lines.append(f"<i>{html.escape(key)}: {html.escape(str(before))} → {html.escape(str(after))}</i>")
    if point.file_bytes:
        lines.append(f"{point.file_bytes / 1e6:.1f} MB")
    lines.append("click: open in Chat · Shift+click: mark for Compare")
    return "<br/>".join(lines)
