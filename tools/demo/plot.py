"""The loss curve picture of docs/DEMO_MODEL.md, drawn offscreen with Qt (a dependency of the app)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

Series = dict[str, Sequence[tuple[int, float]]]  # label -> (step, loss) points
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 800, 450, 60, 20, 40, 50


def draw_loss_curve(path: Path, series: Series, marks: Sequence[int] = ()) -> None:
    """Line chart of ``series`` on a log scale, with dashed lines at the steps in ``marks``; PNG."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter, QPainterPath, QPen

    app = QGuiApplication.instance() or QGuiApplication([])  # noqa: F841 - text drawing needs one
    points = [v for pts in series.values() for _, v in pts if v > 0]
    lo, hi = math.log10(min(points)) - 0.05, math.log10(max(points)) + 0.05
    max_step = max(s for pts in series.values() for s, _ in pts)
    plot = QRectF(LEFT, TOP, WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM)

    def pt(step: float, value: float) -> QPointF:
        frac = (math.log10(max(value, 10**lo)) - lo) / (hi - lo)
        return QPointF(plot.left() + plot.width() * step / max_step, plot.bottom() - plot.height() * frac)

    img = QImage(WIDTH, HEIGHT, QImage.Format.Format_ARGB32)
    img.fill(QColor("white"))
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    grid, ink = QPen(QColor("#dddddd"), 1), QPen(QColor("#333333"), 1)
    ticks = [m * 10**e for e in range(math.floor(lo), math.ceil(hi) + 1) for m in (1, 2, 5)]
    for v in (t for t in ticks if lo <= math.log10(t) <= hi):
        p.setPen(grid)
        p.drawLine(pt(0, v), pt(max_step, v))
        p.setPen(ink)
        p.drawText(QRectF(0, pt(0, v).y() - 8, LEFT - 8, 16), Qt.AlignmentFlag.AlignRight, f"{v:g}")
    for i in range(6):
        x = pt(max_step * i / 5, 10**lo).x()
        label = f"{max_step * i / 5:.0f}"
        p.drawText(QRectF(x - 30, plot.bottom() + 6, 60, 16), Qt.AlignmentFlag.AlignHCenter, label)
    p.setPen(QPen(QColor("#999999"), 1, Qt.PenStyle.DashLine))
    for step in marks:  # the saved checkpoints
        p.drawLine(pt(step, 10**hi), pt(step, 10**lo))
    for i, (label, pts) in enumerate(series.items()):
        curve = QPainterPath(pt(*pts[0]))
        for step, v in pts[1:]:
            curve.lineTo(pt(step, v))
        p.setPen(QPen(QColor(COLORS[i % len(COLORS)]), 2))
        p.drawPath(curve)
        # Bottom left stays empty: every curve starts high and falls to the right.
        p.drawText(QPointF(plot.left() + 16, plot.bottom() - 12 - 18 * (len(series) - 1 - i)), label)
    p.setPen(ink)
    p.drawRect(plot)
    title = "Nanoscope demo model: cross-entropy per trained token (nats, log scale); dashed: saved steps"
    p.drawText(QRectF(0, 8, WIDTH, 20), Qt.AlignmentFlag.AlignHCenter, title)
    p.drawText(QRectF(0, HEIGHT - 22, WIDTH, 20), Qt.AlignmentFlag.AlignHCenter, "optimizer step")
    p.end()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not img.save(str(path)):
        raise OSError(f"{path}: could not write the loss curve")
