"""Light and dark palettes, the application style sheet, the tool-call colours and a small icon set.

Every widget takes its colours from here, so a theme switch is one call: ``apply_theme`` sets the
Qt palette and one style sheet, and widgets that bake colours into HTML (messages) re-render on
the palette-change event that follows. Icons are painted, not loaded from font glyphs, so they
look the same on every OS and need no resource files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from math import cos, radians, sin
from string import Template

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPainterPath, QPalette, QPen, QPixmap
from PySide6.QtWidgets import QApplication, QLabel, QToolButton, QWidget

THEME_MODES = ("system", "light", "dark")


@dataclass(frozen=True)
class Colors:
    window: str  # main background
    surface: str  # cards, inputs, bars
    sidebar: str  # side panels
    border: str
    text: str
    muted: str
    accent: str
    accent_hover: str
    on_accent: str
    hover: str
    selection: str
    user_bubble: str
    code_bg: str
    code_header: str
    inline_code_bg: str
    link: str
    tool_bg: str
    tool_border: str
    tool_label: str
    tool_result_bg: str
    tool_result: str
    thought_bg: str
    thought_border: str
    error: str
    error_bg: str
    warning: str
    warning_bg: str
    info: str
    info_bg: str
    success: str
    token_a: str  # raw-token view: alternating chip colours
    token_b: str


LIGHT = Colors(
    window="#f7f7f9",
    surface="#ffffff",
    sidebar="#eff0f3",
    border="#dcdfe5",
    text="#1c2029",
    muted="#687080",
    accent="#4f5bd5",
    accent_hover="#3f4ac4",
    on_accent="#ffffff",
    hover="#e6e8ee",
    selection="#dfe3fb",
    user_bubble="#e9edfc",
    code_bg="#f6f8fa",
    code_header="#eaedf1",
    inline_code_bg="#eceff3",
    link="#3451c6",
    tool_bg="#fff8eb",
    tool_border="#e9a23b",
    tool_label="#9a5b00",
    tool_result_bg="#e3f6ea",
    tool_result="#146c3b",
    thought_bg="#f4f1fd",
    thought_border="#b9a6ee",
    error="#c9302c",
    error_bg="#fdeeee",
    warning="#b26a00",
    warning_bg="#fff5e0",
    info="#2563c9",
    info_bg="#eaf2fe",
    success="#1d8a4c",
    token_a="#dfe6fb",
    token_b="#f7e2ee",
)
DARK = Colors(
    window="#17181c",
    surface="#202228",
    sidebar="#1b1c21",
    border="#30333c",
    text="#e5e7ec",
    muted="#9aa0ac",
    accent="#6d78f0",
    accent_hover="#808af4",
    on_accent="#ffffff",
    hover="#2a2d35",
    selection="#2d3253",
    user_bubble="#252a3d",
    code_bg="#0f1217",
    code_header="#1a1e25",
    inline_code_bg="#2b2f38",
    link="#93a4ff",
    tool_bg="#2b2416",
    tool_border="#d4952f",
    tool_label="#f2c26b",
    tool_result_bg="#183123",
    tool_result="#7fdca2",
    thought_bg="#241f35",
    thought_border="#7c66c6",
    error="#f06a63",
    error_bg="#3a1d1e",
    warning="#f0b450",
    warning_bg="#3a2e17",
    info="#74a7ff",
    info_bg="#1a2a44",
    success="#5cc98a",
    token_a="#28304d",
    token_b="#40283c",
)

_current = LIGHT


@dataclass(frozen=True)
class ToolColors:
    background: str
    border: str
    label: str
    result_background: str
    result: str


def colors() -> Colors:
    """The palette last applied with ``apply_theme`` (light until then)."""
    return _current


def is_dark() -> bool:
    return _current is DARK


def tool_colors(dark: bool) -> ToolColors:
    """The calculator/tool block colours of the light or dark theme."""
    c = DARK if dark else LIGHT
    return ToolColors(c.tool_bg, c.tool_border, c.tool_label, c.tool_result_bg, c.tool_result)


def system_prefers_dark(app: QGuiApplication) -> bool:
    """The OS colour scheme (Qt ≥ 6.5), else the lightness of the palette Qt started with."""
    hints = app.styleHints()
    scheme = hints.colorScheme() if hasattr(hints, "colorScheme") else Qt.ColorScheme.Unknown
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    _remember_system_palette(app)
    return bool(app.property("nanoscope_system_dark"))


def _remember_system_palette(app: QGuiApplication) -> None:
    """Our palette replaces the system one, so note whether the system's was dark before."""
    if app.property("nanoscope_system_dark") is None:
        lightness = app.palette().color(QPalette.ColorRole.Window).lightness()
        app.setProperty("nanoscope_system_dark", lightness < 128)


def build_palette(c: Colors) -> QPalette:
    pal = QPalette()
    roles = {
        QPalette.ColorRole.Window: c.window,
        QPalette.ColorRole.WindowText: c.text,
        QPalette.ColorRole.Base: c.surface,
        QPalette.ColorRole.AlternateBase: c.hover,
        QPalette.ColorRole.Text: c.text,
        QPalette.ColorRole.Button: c.surface,
        QPalette.ColorRole.ButtonText: c.text,
        QPalette.ColorRole.BrightText: c.on_accent,
        QPalette.ColorRole.Highlight: c.accent,
        QPalette.ColorRole.HighlightedText: c.on_accent,
        QPalette.ColorRole.ToolTipBase: c.surface,
        QPalette.ColorRole.ToolTipText: c.text,
        QPalette.ColorRole.PlaceholderText: c.muted,
        QPalette.ColorRole.Link: c.link,
        QPalette.ColorRole.Light: c.surface,
        QPalette.ColorRole.Midlight: c.hover,
        QPalette.ColorRole.Mid: c.border,
        QPalette.ColorRole.Dark: c.border,
        QPalette.ColorRole.Shadow: c.border,
    }
    for role, value in roles.items():
        pal.setColor(role, QColor(value))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        pal.setColor(QPalette.ColorGroup.Disabled, role, QColor(c.muted))
    return pal


# Object names in the selectors are set by the widgets (setObjectName); dynamic properties
# (role, severity, level) need ``repolish`` after they change.
# Combo and spin boxes are left to Fusion: styling their frame in QSS means re-drawing
# every sub-control (arrows, buttons) as images.
_STYLE = Template("""
QMainWindow, QDialog { background: $window; }
QToolTip { background: $surface; color: $text; border: 1px solid $border; padding: 4px 6px; }
QSplitter::handle { background: $border; }
QSplitter::handle:horizontal { width: 1px; }
QScrollBar:vertical { background: transparent; width: 10px; margin: 2px; }
QScrollBar::handle:vertical { background: $border; border-radius: 3px; min-height: 32px; }
QScrollBar::handle:vertical:hover { background: $muted; }
QScrollBar::add-line, QScrollBar::sub-line { height: 0; width: 0; }
QScrollBar::add-page, QScrollBar::sub-page { background: none; }

QPushButton { background: $surface; border: 1px solid $border; border-radius: 7px; padding: 5px 12px; }
QPushButton:hover { background: $hover; }
QPushButton:disabled { color: $muted; }
QPushButton#Primary { background: $accent; color: $on_accent; border: none; font-weight: 600; }
QPushButton#Primary:hover { background: $accent_hover; }
QPushButton#Primary:disabled { background: $border; color: $muted; }
QPushButton#Danger { background: $error; color: $on_accent; border: none; font-weight: 600; }
QToolButton#Flat { border: none; border-radius: 6px; padding: 3px; color: $muted; background: transparent; }
QToolButton#Flat:hover { background: $hover; color: $text; }
QToolButton#Flat:checked { background: $selection; color: $text; }
QToolButton#Flat:disabled { color: $border; }
QPlainTextEdit#Field { background: $surface; border: 1px solid $border; border-radius: 5px; padding: 3px; }
QPlainTextEdit#Field:focus { border-color: $accent; }
QLabel#Muted, QLabel#Hint { color: $muted; }
QLabel#SectionTitle { color: $muted; font-weight: 700; }
QLabel#PanelTitle { font-weight: 700; }
QLabel#Kbd { background: $surface; border: 1px solid $border; border-bottom-width: 2px;
    border-radius: 5px; padding: 1px 7px; font-family: monospace; }

QWidget#ChatColumn, QScrollArea#ChatScroll { background: $window; border: none; }
QWidget#ChatPlaceholder { background: $window; }
QLabel#PlaceholderTitle { font-size: 18px; font-weight: 600; }
QLabel#ModeNotice { background: $info_bg; color: $info; border-bottom: 1px solid $border; padding: 6px 14px; }
QToolButton#JumpToBottom { background: $surface; border: 1px solid $border; border-radius: 17px; }
QToolButton#JumpToBottom:hover { background: $hover; }
QFrame#Message { background: transparent; }
QFrame#Bubble { background: transparent; border: none; }
QFrame#Bubble[role="user"] { background: $user_bubble; border-radius: 14px; }
QFrame#Bubble[role="system"] { background: $hover; border-radius: 14px; }
QLabel#RoleLabel { font-weight: 700; }
QLabel#Footer { color: $muted; font-size: 11px; }
QLabel#Pending { color: $muted; font-style: italic; }
QTextBrowser#RichText { background: transparent; border: none; }
QFrame#ToolBlock { background: $tool_bg; border: 1px solid $tool_border; border-radius: 9px; }
QLabel#ToolTitle { color: $tool_label; font-weight: 700; }
QLabel#ToolCode { color: $text; font-family: monospace; }
QLabel#ToolResult { background: $tool_result_bg; color: $tool_result; border-radius: 6px;
    padding: 2px 8px; font-family: monospace; font-weight: 700; }
QFrame#ThoughtBlock { background: $thought_bg; border: 1px solid $thought_border; border-radius: 9px; }
QLabel#ThoughtTitle { color: $muted; font-weight: 700; }
QLabel#ThoughtText { color: $muted; }
QLabel#ThoughtPreview { color: $muted; font-style: italic; }

QFrame#InputBar { background: $window; }
QFrame#InputFrame { background: $surface; border: 1px solid $border; border-radius: 14px; }
QFrame#InputFrame[focused="true"] { border: 1px solid $accent; }
QPlainTextEdit#Input { background: transparent; border: none; }

QFrame#Sidebar { background: $sidebar; }
QListWidget#HistoryList { background: transparent; border: none; outline: none; }
QFrame#UndoBar { background: $surface; border: 1px solid $border; border-radius: 9px; }
QFrame#SamplingPanel { background: $sidebar; }
QScrollArea#PanelScroll, QWidget#PanelBody { background: $sidebar; border: none; }
QFrame#PickerBar { background: $surface; border-bottom: 1px solid $border; }
QLabel#Summary { color: $muted; }
QLabel#Summary[error="true"] { color: $error; }

QProgressBar { background: $hover; border: none; border-radius: 3px; max-height: 6px; }
QProgressBar::chunk { background: $accent; border-radius: 3px; }
QProgressBar#ContextBar[level="warn"]::chunk { background: $warning; }
QProgressBar#ContextBar[level="full"]::chunk { background: $error; }
QStatusBar { background: $sidebar; border-top: 1px solid $border; }
QStatusBar::item { border: none; }
QStatusBar QLabel { color: $muted; padding: 0 8px; }

QFrame#Banner { border-radius: 10px; margin: 8px 16px 0 16px; }
QFrame#Banner[severity="error"] { background: $error_bg; border: 1px solid $error; }
QFrame#Banner[severity="warning"] { background: $warning_bg; border: 1px solid $warning; }
QFrame#Banner[severity="info"] { background: $info_bg; border: 1px solid $info; }
QLabel#BannerTitle { font-weight: 700; }
QPlainTextEdit#BannerDetails { background: $surface; border: 1px solid $border; border-radius: 6px;
    font-family: monospace; }
""")


def style_sheet(c: Colors) -> str:
    return _STYLE.substitute(asdict(c))


def apply_theme(app: QApplication, mode: str = "system") -> Colors:
    """Apply "light", "dark" or "system" (follow the OS scheme, live when the OS switches)."""
    global _current
    if mode not in THEME_MODES:
        raise ValueError(f"theme mode must be one of {THEME_MODES}, got {mode!r}")
    _remember_system_palette(app)
    dark = system_prefers_dark(app) if mode == "system" else mode == "dark"
    _current = DARK if dark else LIGHT
    # Fusion everywhere: native styles (macOS especially) ignore most palette colours.
    app.setStyle("Fusion")
    app.setPalette(build_palette(_current))
    app.setStyleSheet(style_sheet(_current))
    hints = app.styleHints()
    if app.property("nanoscope_theme_mode") is None and hasattr(hints, "colorSchemeChanged"):
        hints.colorSchemeChanged.connect(lambda _scheme: _follow_system(app))
    app.setProperty("nanoscope_theme_mode", mode)
    return _current


def _follow_system(app: QApplication) -> None:
    if app.property("nanoscope_theme_mode") == "system" and system_prefers_dark(app) != is_dark():
        apply_theme(app, "system")


def repolish(widget: QWidget) -> None:
    """Re-evaluate the style sheet after a dynamic property used in a selector changed."""
    style = widget.style()
    style.unpolish(widget)
    style.polish(widget)
    widget.update()


# ----- small shared widgets ----------------------------------------------------------------


def flat_button(icon_name: str, tip: str, checkable: bool = False) -> QToolButton:
    """A small borderless icon button (message actions, panel toggles)."""
    button = QToolButton()
    button.setObjectName("Flat")
    button.setProperty("icon_name", icon_name)  # lets a theme switch re-tint it
    button.setIcon(icon(icon_name, colors().muted))
    button.setIconSize(QSize(16, 16))
    button.setToolTip(tip)
    button.setAccessibleName(tip)
    button.setCheckable(checkable)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    return button


def retint_flat_buttons(root: QWidget) -> None:
    """After a theme switch: repaint the icons of ``root``'s flat buttons in the new colours."""
    for button in root.findChildren(QToolButton, "Flat"):
        if button.property("icon_name"):
            button.setIcon(icon(button.property("icon_name"), colors().muted))


class ElidedLabel(QLabel):
    """A one-line label that ends in "…" when narrow instead of clipping or widening the layout.
    ``text()`` returns the full text; the tooltip shows it too."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self._full = ""
        self.setText(text)

    def setText(self, text: str) -> None:
        self._full = text
        self.setToolTip(text if len(text) > 40 else "")
        self._elide()
        self.updateGeometry()

    def text(self) -> str:
        return self._full

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + 4, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(40, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        super().setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, self.width()))


# ----- icons -------------------------------------------------------------------------------
# Drawn on a 24×24 grid with 2-unit round strokes, in the spirit of Feather/Lucide icons.


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
