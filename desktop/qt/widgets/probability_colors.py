"""The probability overlay's colours: a perceptual scale (interpolated in OKLab, lightness falling
monotonically with probability) from the theme's surface colour at p = 1 through amber to red at
p = 0, so unlikely tokens stand out and likely ones stay quiet, in both themes; and its legend."""

from __future__ import annotations

import math
from itertools import pairwise

from PySide6.QtCore import QPointF, QRectF, QSize
from PySide6.QtGui import QColor, QLinearGradient, QPainter
from PySide6.QtWidgets import QWidget

from desktop.qt.widgets import theme

SCALE_STEPS = 100  # the overlay's colours come in 101 steps, finer than the eye separates


def _to_linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _from_linear(c: float) -> float:
    c = max(0.0, min(1.0, c))
    return 12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055


def _oklab(color: QColor) -> tuple[float, float, float]:
    r, g, b = (_to_linear(x) for x in (color.redF(), color.greenF(), color.blueF()))
    lms = (
        0.4122214708 * r + 0.5363325363 * g + 0.0514459929 * b,
        0.2119034982 * r + 0.6806995451 * g + 0.1073969566 * b,
        0.0883024619 * r + 0.2817188376 * g + 0.6299787005 * b,
    )
    l_, m_, s_ = (math.copysign(abs(x) ** (1 / 3), x) for x in lms)
    return (
        0.2104542553 * l_ + 0.7936177850 * m_ - 0.0040720468 * s_,
        1.9779984951 * l_ - 2.4285922050 * m_ + 0.4505937099 * s_,
        0.0259040371 * l_ + 0.7827717662 * m_ - 0.8086757660 * s_,
    )


def _from_oklab(lab: tuple[float, float, float]) -> QColor:
    L, a, b = lab
    l_ = L + 0.3963377774 * a + 0.2158037573 * b
    m_ = L - 0.1055613458 * a - 0.0638541728 * b
    s_ = L - 0.0894841775 * a - 1.2914855480 * b
    l3, m3, s3 = l_**3, m_**3, s_**3
    rgb = (
        4.0767416621 * l3 - 3.3077115913 * m3 + 0.2309699292 * s3,
        -1.2684380046 * l3 + 2.6097574011 * m3 - 0.3413193965 * s3,
        -0.0041960863 * l3 - 0.7034186147 * m3 + 1.7076147010 * s3,
    )
    return QColor.fromRgbF(*(_from_linear(x) for x in rgb))


def mix(a: str | QColor, b: str | QColor, t: float) -> QColor:
    """``a`` → ``b`` at ``t`` in [0, 1], interpolated in OKLab (even perceived steps)."""
    la, lb = _oklab(QColor(a)), _oklab(QColor(b))
    return _from_oklab(tuple(x + (y - x) * t for x, y in zip(la, lb, strict=True)))  # type: ignore[arg-type]


def scale_stops(c: theme.Colors) -> list[tuple[float, QColor]]:
    """(probability, colour) stops of the overlay scale for a theme."""
    return [
        (0.0, mix(c.surface, c.error, 0.55)),
        (0.5, mix(c.surface, c.warning, 0.4)),
        (1.0, QColor(c.surface)),
    ]


def probability_color(p: float, c: theme.Colors | None = None) -> QColor:
    """The overlay colour of a token with probability ``p`` (rounded to 1 / SCALE_STEPS)."""
    stops = scale_stops(c or theme.colors())
    p = round(max(0.0, min(1.0, p)) * SCALE_STEPS) / SCALE_STEPS
    for (p0, c0), (p1, c1) in pairwise(stops):
        if p <= p1:
            return mix(c0, c1, (p - p0) / (p1 - p0))
    return stops[-1][1]


class ProbabilityLegend(QWidget):
    """The overlay's key: the colour ramp from p = 0 to p = 1 with a few ticks."""

    TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setToolTip("Token probability under the pane's own checkpoint (before temperature and top-k)")
        self.setAccessibleName("Probability colour legend")

    def sizeHint(self) -> QSize:
        fm = self.fontMetrics()
        return QSize(fm.horizontalAdvance("p  0   .25   .5   .75   1") + 40, fm.height() + 16)

    def minimumSizeHint(self) -> QSize:
        return self.sizeHint()  # a squeezed ramp would be unreadable: the toolbar wraps instead

    def paintEvent(self, _event) -> None:
        c = theme.colors()
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        fm = self.fontMetrics()
        label_w = fm.horizontalAdvance("p ") + 2
        bar = QRectF(label_w, 2, self.width() - label_w - 8, 9)
        grad = QLinearGradient(bar.topLeft(), bar.topRight())
        for i in range(11):
            grad.setColorAt(i / 10, probability_color(i / 10, c))
        p.setPen(QColor(c.border))
        p.setBrush(grad)
        p.drawRoundedRect(bar, 3, 3)
        p.setPen(QColor(c.muted))
        p.drawText(QPointF(0, bar.bottom()), "p")
        for t in self.TICKS:
            text = f"{t:g}".removeprefix("0") if 0 < t < 1 else f"{t:g}"
            x = bar.left() + t * bar.width() - fm.horizontalAdvance(text) / 2
            x = max(bar.left(), min(x, bar.right() - fm.horizontalAdvance(text)))
            p.drawText(QPointF(x, bar.bottom() + fm.ascent() + 2), text)
        p.end()
