"""Draw the Nanoscope app icon and write it as PNGs, a macOS ``.icns`` and an SVG.

    .venv/bin/python packaging/make_icons.py            # writes resources/icons/

The icon is a rounded indigo-to-teal tile holding a few lines of "token" pills (tokenised
text), with an amber-handled magnifier whose lens shows the tokens enlarged and one of them
lit up: looking closely at what a small model reads and writes.

Everything is drawn with QPainter on the offscreen platform, so no display and no image
tools are needed, and the files are regenerated exactly from this script. Small sizes get
their own simpler drawing (fewer, fatter shapes) because a scaled-down 1024 px picture
turns to mush at 16 px. The ``.icns`` container is written by hand: it is only a header
and a list of PNG blobs, and ``iconutil`` exists only on macOS.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import (
    QBrush,
    QColor,
    QGuiApplication,
    QImage,
    QLinearGradient,
    QPainter,
    QPainterPath,
    QPainterPathStroker,
    QPen,
    QRadialGradient,
    QTransform,
)
from PySide6.QtSvg import QSvgGenerator

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "resources" / "icons"
NAME = "nanoscope"
PNG_SIZES = (16, 32, 48, 64, 128, 256, 512, 1024)

# PNG-carrying ICNS element types by pixel size (Apple's "icns" format; ic10 is 512@2x).
ICNS_TYPES = {16: b"icp4", 32: b"icp5", 64: b"icp6", 128: b"ic07", 256: b"ic08", 512: b"ic09", 1024: b"ic10"}

TILE_TOP = QColor("#4338ca")  # indigo
TILE_BOTTOM = QColor("#0f766e")  # teal
TOKEN = QColor(255, 255, 255, 82)
TOKEN_ZOOMED = QColor(255, 255, 255, 150)  # behind the glass: sharper than the rest
TOKEN_LIT = QColor("#6ee7b7")  # mint: the token in focus, apart from the amber handle
LENS_RING = QColor("#f8fafc")
HANDLE_LIGHT = QColor("#fcd34d")
HANDLE_DARK = QColor("#d97706")

# Lines of tokenised text, in tile units: each pill is (x, width); ``LIT`` marks the one
# the lens is focused on. Ragged line ends make it read as text rather than a grid.
TOKEN_ROWS = (
    (0.28, ((0.14, 0.20), (0.38, 0.28), (0.70, 0.16))),
    (0.42, ((0.14, 0.18), (0.36, 0.18), (0.58, 0.28))),
    (0.56, ((0.14, 0.12), (0.30, 0.26), (0.60, 0.26))),
    (0.70, ((0.14, 0.24), (0.42, 0.20))),
)
LIT = (1, 1)  # row 1, pill 1
TOKEN_HEIGHT = 0.075

# Small icons: three lines of two fat pills, read at a glance.
SMALL_ROWS = (
    (0.26, ((0.12, 0.30), (0.48, 0.40))),
    (0.46, ((0.12, 0.46), (0.64, 0.24))),
    (0.66, ((0.12, 0.22), (0.40, 0.48))),
)
SMALL_LIT = (1, 0)
SMALL_TOKEN_HEIGHT = 0.12


def _margin(size: int) -> float:
    """Empty border around the tile, as a fraction of the canvas.

    Large sizes follow the macOS grid (the tile is ~80 % of the canvas, leaving room for the
    shadow); tiny sizes use nearly the whole canvas because every pixel counts there.
    """
    if size <= 32:
        return 0.0 if size <= 16 else 1 / 32
    return 0.05 if size <= 64 else 0.09


class _Tile:
    """Maps tile units (0..1 inside the rounded square) to canvas pixels."""

    def __init__(self, size: int) -> None:
        m = _margin(size) * size
        self.x0, self.y0, self.side = m, m, size - 2 * m

    def pt(self, x: float, y: float) -> QPointF:
        return QPointF(self.x0 + x * self.side, self.y0 + y * self.side)

    def len(self, v: float) -> float:
        return v * self.side

    def rect(self, x: float, y: float, w: float, h: float) -> QRectF:
        return QRectF(self.x0 + x * self.side, self.y0 + y * self.side, w * self.side, h * self.side)


def _draw_tile(p: QPainter, t: _Tile, size: int) -> None:
    if size >= 128:
        # A soft drop shadow below the tile, as macOS icons have: stacked faint outlines, each a
        # little larger, fake a blur without needing QGraphicsEffect.
        for i in range(6):
            grow = 0.004 * i
            shadow = QPainterPath()
            rect = t.rect(-grow, 0.012 - grow + 0.003 * i, 1 + 2 * grow, 1 + 2 * grow)
            shadow.addRoundedRect(rect, t.len(0.225 + grow), t.len(0.225 + grow))
            p.fillPath(shadow, QColor(0, 0, 0, 14))
    tile = QPainterPath()
    radius = t.len(0.225 if size > 16 else 0.19)
    tile.addRoundedRect(t.rect(0, 0, 1, 1), radius, radius)
    grad = QLinearGradient(t.pt(0.2, 0.0), t.pt(0.8, 1.0))
    grad.setColorAt(0.0, TILE_TOP)
    grad.setColorAt(1.0, TILE_BOTTOM)
    p.fillPath(tile, QBrush(grad))
    if size >= 48:
        # A faint sheen on the upper half gives the tile some depth without a busy bevel.
        sheen = QLinearGradient(t.pt(0, 0), t.pt(0, 0.55))
        sheen.setColorAt(0.0, QColor(255, 255, 255, 46))
        sheen.setColorAt(1.0, QColor(255, 255, 255, 0))
        p.fillPath(tile, QBrush(sheen))


def _token_paths(
    t: _Tile, rows, height: float, lit: tuple[int, int] | None = None
) -> tuple[QPainterPath, QPainterPath]:
    """(ordinary pills, the lit pill) as paths, so the lens can transform and cut them exactly."""
    plain, focus = QPainterPath(), QPainterPath()
    for r, (y, pills) in enumerate(rows):
        for i, (x, w) in enumerate(pills):
            target = focus if (r, i) == lit else plain
            target.addRoundedRect(t.rect(x, y, w, height), t.len(height / 2), t.len(height / 2))
    return plain, focus


def _lens_geometry(small: bool) -> tuple[float, float, float, float]:
    """(centre x, centre y, radius, ring width) in tile units."""
    return (0.44, 0.45, 0.27, 0.085) if small else (0.45, 0.46, 0.235, 0.05)


def _draw_lens(p: QPainter, t: _Tile, size: int) -> None:
    small = size <= 32
    cx, cy, r, ring = _lens_geometry(small)
    centre = t.pt(cx, cy)

    # The handle first, so the ring covers its end: a fat amber bar towards the bottom right.
    diag = 0.7071  # cos 45°
    inner, outer = r + ring * 0.2, r + (0.25 if small else 0.24)
    start = t.pt(cx + diag * inner, cy + diag * inner)
    end = t.pt(cx + diag * outer, cy + diag * outer)
    # Filled as an outline path rather than stroked with a gradient pen, which SVG cannot express.
    bar = QPainterPath(start)
    bar.lineTo(end)
    stroker = QPainterPathStroker()
    stroker.setWidth(t.len(0.15 if small else 0.1))
    stroker.setCapStyle(Qt.PenCapStyle.RoundCap)
    handle = QLinearGradient(start, end)
    handle.setColorAt(0.0, HANDLE_LIGHT)
    handle.setColorAt(1.0, HANDLE_DARK)
    p.fillPath(stroker.createStroke(bar), QBrush(handle))

    # Glass: a lighter disc with the tokens drawn magnified inside it.
    glass = QPainterPath()
    glass.addEllipse(centre, t.len(r), t.len(r))
    fill = QRadialGradient(centre, t.len(r))
    fill.setColorAt(0.0, QColor(255, 255, 255, 40))
    fill.setColorAt(1.0, QColor(255, 255, 255, 14))
    p.fillPath(glass, QBrush(fill))
    # Cut to the glass by path intersection, not a clip region: SVG renderers differ on clipPath.
    if small:
        plain, focus = _token_paths(t, SMALL_ROWS, SMALL_TOKEN_HEIGHT, SMALL_LIT)
    else:
        cxp, cyp = centre.x(), centre.y()
        zoom = QTransform().translate(cxp, cyp).scale(1.8, 1.8).translate(-cxp, -cyp)  # 1.8x about the centre
        plain, focus = (zoom.map(path) for path in _token_paths(t, TOKEN_ROWS, TOKEN_HEIGHT, LIT))
    p.fillPath(plain.intersected(glass), TOKEN_ZOOMED)
    p.fillPath(focus.intersected(glass), TOKEN_LIT)

    # Ring, then a glint in the upper left that makes it read as glass.
    p.setBrush(Qt.BrushStyle.NoBrush)
    p.setPen(QPen(LENS_RING, t.len(ring)))
    p.drawEllipse(centre, t.len(r), t.len(r))
    if size >= 48:
        glint = QPen(QColor(255, 255, 255, 150), t.len(0.03), Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap)
        p.setPen(glint)
        g = t.len(r - ring * 1.6)
        p.drawArc(QRectF(centre.x() - g, centre.y() - g, 2 * g, 2 * g), 105 * 16, 50 * 16)


def paint_icon(p: QPainter, size: int) -> None:
    """Paint the icon for a ``size`` x ``size`` canvas onto an active painter."""
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    t = _Tile(size)
    _draw_tile(p, t, size)
    # At 16 px the surrounding text is only noise; the lens and its token carry the idea.
    if 16 < size <= 32:
        p.fillPath(_token_paths(t, SMALL_ROWS, SMALL_TOKEN_HEIGHT)[0], TOKEN)
    elif size > 32:
        p.fillPath(_token_paths(t, TOKEN_ROWS, TOKEN_HEIGHT)[0], TOKEN)
    _draw_lens(p, t, size)


def render_png(size: int) -> bytes:
    """The icon at ``size`` pixels as PNG bytes."""
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    paint_icon(painter, size)
    painter.end()
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buf, "PNG"):
        raise RuntimeError(f"could not encode the {size} px icon as PNG")
    return bytes(data.data())


def icns_bytes(pngs: dict[int, bytes]) -> bytes:
    """An ``.icns`` file: b"icns" + total length, then (type, length, PNG data) per size.

    Lengths are big-endian and include their own 8-byte headers.
    """
    body = b"".join(
        ICNS_TYPES[size] + struct.pack(">I", 8 + len(pngs[size])) + pngs[size] for size in sorted(ICNS_TYPES)
    )
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def write_svg(path: Path, size: int = 1024) -> None:
    """The large drawing as SVG, for Linux's ``hicolor/scalable`` and for docs."""
    gen = QSvgGenerator()
    gen.setFileName(str(path))
    gen.setSize(QSize(size, size))
    gen.setViewBox(QRectF(0, 0, size, size))
    gen.setTitle("Nanoscope")
    gen.setDescription("Nanoscope app icon (generated by packaging/make_icons.py)")
    painter = QPainter(gen)
    paint_icon(painter, size)
    painter.end()


def main(out_dir: Path = OUT_DIR) -> list[Path]:
    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = {size: render_png(size) for size in PNG_SIZES}
    written = []
    for size, data in pngs.items():
        path = out_dir / f"{NAME}-{size}.png"
        path.write_bytes(data)
        written.append(path)
    icns = out_dir / f"{NAME}.icns"
    icns.write_bytes(icns_bytes(pngs))
    svg = out_dir / f"{NAME}.svg"
    write_svg(svg)
    written += [icns, svg]
    for path in written:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"wrote {shown} ({path.stat().st_size} B)")
    return written


if __name__ == "__main__":
    main()
