"""A small icon set, painted rather than loaded, and the round role avatars of the chat.

Icons are drawn with QPainter on a 24×24 grid with 2-unit round strokes (in the spirit of
Feather/Lucide icons), so they look the same on every OS, take any colour, and need no resource
files. Colours come from the caller, usually :func:`theme.colors`.
"""

from __future__ import annotations

from functools import lru_cache
from math import cos, radians, sin

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap

from desktop.qt.widgets.theme import DARK, LIGHT


def _arc_path(cx: float, cy: float, r: float, start_deg: float, sweep_deg: float) -> QPainterPath:
    path = QPainterPath()
    rect = QRectF(cx - r, cy - r, 2 * r, 2 * r)
    path.arcMoveTo(rect, start_deg)
    path.arcTo(rect, start_deg, sweep_deg)
    return path


def _poly(p: QPainter, *points: tuple[float, float]) -> None:
    path = QPainterPath(QPointF(*points[0]))
    for pt in points[1:]:
        path.lineTo(QPointF(*pt))
    p.drawPath(path)


def _dot(p: QPainter, x: float, y: float, r: float = 1.2) -> None:
    p.save()
    p.setBrush(p.pen().color())
    p.setPen(Qt.PenStyle.NoPen)
    p.drawEllipse(QPointF(x, y), r, r)
    p.restore()


def _draw(name: str, p: QPainter) -> None:
    # The branches share these names, and the grid takes half units as well as whole ones.
    x: float
    y: float
    outline: tuple[tuple[float, float], ...]
    if name == "copy":
        p.drawRoundedRect(QRectF(9, 9, 12, 12), 2, 2)
        _poly(p, (5, 15), (4, 15), (3, 14), (3, 4), (4, 3), (14, 3), (15, 4), (15, 5))
    elif name == "refresh":
        p.drawPath(_arc_path(12, 12, 8, 60, 290))
        _poly(p, (15, 2.5), (17.5, 5.5), (14, 7.5))
    elif name == "edit":
        _poly(p, (4, 20), (4, 16), (15, 5), (19, 9), (8, 20), (4, 20))
        _poly(p, (12.5, 7.5), (16.5, 11.5))
    elif name == "calculator":
        p.drawRoundedRect(QRectF(5, 2.5, 14, 19), 2, 2)
        p.drawRect(QRectF(8, 5.5, 8, 3.5))
        for x in (9, 12, 15):
            for y in (13, 17):
                _dot(p, x, y)
    elif name in ("lock", "unlock"):
        p.drawRoundedRect(QRectF(5, 11, 14, 10), 2, 2)
        path = QPainterPath(QPointF(8, 11))
        path.lineTo(8, 7)
        path.arcTo(QRectF(8, 3, 8, 8), 180, -180)
        if name == "lock":
            path.lineTo(16, 11)
        p.drawPath(path)
    elif name == "dice":
        p.drawRoundedRect(QRectF(3.5, 3.5, 17, 17), 3, 3)
        for x, y in ((8.5, 8.5), (15.5, 15.5), (12, 12), (15.5, 8.5), (8.5, 15.5)):
            _dot(p, x, y, 1.4)
    elif name == "close":
        _poly(p, (6, 6), (18, 18))
        _poly(p, (18, 6), (6, 18))
    elif name == "plus":
        _poly(p, (12, 5), (12, 19))
        _poly(p, (5, 12), (19, 12))
    elif name == "chevron-left":
        _poly(p, (15, 6), (9, 12), (15, 18))
    elif name == "chevron-right":
        _poly(p, (9, 6), (15, 12), (9, 18))
    elif name == "chevron-down":
        _poly(p, (6, 9), (12, 15), (18, 9))
    elif name == "chevron-up":
        _poly(p, (6, 15), (12, 9), (18, 15))
    elif name == "send":
        _poly(p, (12, 19), (12, 5))
        _poly(p, (6, 11), (12, 5), (18, 11))
    elif name == "continue":  # go on past where the reply stopped: »
        _poly(p, (6, 6), (12, 12), (6, 18))
        _poly(p, (12, 6), (18, 12), (12, 18))
    elif name == "fork":  # a branch leaving the trunk: git's branch sign
        for x, y in ((7, 5), (7, 19), (17, 6)):
            p.drawEllipse(QPointF(x, y), 2.2, 2.2)
        _poly(p, (7, 7.2), (7, 16.8))
        branch = QPainterPath(QPointF(17, 8.2))
        branch.cubicTo(QPointF(17, 13), QPointF(7, 11), QPointF(7, 15))
        p.drawPath(branch)
    elif name == "stop":
        p.setBrush(p.pen().color())
        p.drawRoundedRect(QRectF(7, 7, 10, 10), 1.5, 1.5)
    elif name == "arrow-down":
        _poly(p, (12, 5), (12, 19))
        _poly(p, (6, 13), (12, 19), (18, 13))
    elif name == "folder":
        outline = ((3, 7), (3, 18), (4, 19), (20, 19), (21, 18), (21, 9), (20, 8), (11, 8), (9, 5), (4, 5))
        _poly(p, *outline, (3, 6), (3, 7))
    elif name == "search":
        p.drawEllipse(QPointF(11, 11), 6.5, 6.5)
        _poly(p, (16, 16), (20.5, 20.5))
    elif name in ("info", "error"):
        p.drawEllipse(QPointF(12, 12), 9.5, 9.5)
        if name == "info":
            _poly(p, (12, 11), (12, 16.5))
            _dot(p, 12, 7.5, 1.3)
        else:
            _poly(p, (9, 9), (15, 15))
            _poly(p, (15, 9), (9, 15))
    elif name == "warning":
        _poly(p, (12, 3), (22, 20), (2, 20), (12, 3))
        _poly(p, (12, 9.5), (12, 13.5))
        _dot(p, 12, 16.8, 1.3)
    elif name == "chat":
        outline = ((4, 5), (20, 5), (21, 6), (21, 16), (20, 17), (10, 17), (6, 21), (6, 17), (4, 17))
        _poly(p, *outline, (3, 16), (3, 6), (4, 5))
    elif name == "thought":
        p.drawEllipse(QPointF(12, 10), 8, 6.5)
        p.drawEllipse(QPointF(6, 19.5), 1.5, 1.5)
        for x in (8.5, 12, 15.5):
            _dot(p, x, 10)
    elif name == "code":
        _poly(p, (8, 7), (3, 12), (8, 17))
        _poly(p, (16, 7), (21, 12), (16, 17))
    elif name == "tokens":
        for x in (2.5, 9.5, 16.5):
            p.drawRoundedRect(QRectF(x, 8, 5, 8), 1.5, 1.5)
    elif name == "user":
        p.drawEllipse(QPointF(12, 8), 4, 4)
        p.drawPath(_arc_path(12, 21, 7.5, 0, 180))
    elif name == "check":
        _poly(p, (5, 12.5), (10, 17.5), (19.5, 7))
    elif name == "sliders":
        for y, knob in ((6, 15), (12, 8), (18, 13)):
            _poly(p, (3, y), (21, y))
            p.save()
            p.setBrush(QColor(p.pen().color()))
            p.drawEllipse(QPointF(knob, y), 2.2, 2.2)
            p.restore()
    elif name == "sparkle":
        path = QPainterPath(QPointF(12, 3))
        for i in range(1, 9):
            angle = radians(90 - 45 * i)
            r = 9 if i % 2 == 0 else 3
            path.lineTo(12 + r * cos(angle), 12 - r * sin(angle))
        p.drawPath(path)
    else:
        raise KeyError(f"no icon named {name!r}")


@lru_cache(maxsize=256)
def icon(name: str, color: str, size: int = 16) -> QIcon:
    """A painted icon in ``color``; drawn at 2× so it stays crisp on HiDPI screens."""
    scale = 2
    pix = QPixmap(size * scale, size * scale)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.scale(size * scale / 24, size * scale / 24)
    pen = QPen(QColor(color), 2.0)
    pen.setCapStyle(Qt.PenCapStyle.RoundCap)
    pen.setJoinStyle(Qt.PenJoinStyle.RoundJoin)
    p.setPen(pen)
    _draw(name, p)
    p.end()
    pix.setDevicePixelRatio(scale)
    return QIcon(pix)


def avatar(role: str, dark: bool, size: int = 24) -> QPixmap:
    """A round badge for a chat role: a person for the user, a sparkle for the model."""
    c = DARK if dark else LIGHT
    fill = {"user": c.muted, "assistant": c.accent}.get(role, c.border)
    glyph = {"user": "user", "assistant": "sparkle"}.get(role, "chat")
    scale = 2
    pix = QPixmap(size * scale, size * scale)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(QColor(fill))
    p.drawEllipse(QRectF(0, 0, size * scale, size * scale))
    inner = round(size * 0.62)
    offset = (size - inner) * scale // 2
    p.drawPixmap(offset, offset, icon(glyph, "#ffffff", inner).pixmap(inner * scale, inner * scale))
    p.end()
    pix.setDevicePixelRatio(scale)
    return pix
