"""Light and dark palettes, light/dark detection, the application style sheet and the tool-call colours.

Every widget takes its colours from here, so a theme switch is one call: ``apply_theme`` sets the
Qt palette and one style sheet, and widgets that bake colours into HTML (messages) or paint icons
(see ``icons``) re-render on the palette-change event that follows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from string import Template

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QWidget

from desktop.qt.widgets.palette import DARK, LIGHT, Colors

THEME_MODES = ("system", "light", "dark")


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


def _system_prefers_dark(app: QGuiApplication) -> bool:
    """The OS colour scheme, or, where Qt cannot tell it (Unknown: e.g. Linux desktops without a
    settings portal), the lightness of the palette Qt started with, which ``apply_theme`` noted."""
    scheme = app.styleHints().colorScheme()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
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
    dark = _system_prefers_dark(app) if mode == "system" else mode == "dark"
    _current = DARK if dark else LIGHT
    # Fusion everywhere: native styles (macOS especially) ignore most palette colours.
    app.setStyle("Fusion")
    app.setPalette(build_palette(_current))
    app.setStyleSheet(style_sheet(_current))
    if app.property("nanoscope_theme_mode") is None:
        app.styleHints().colorSchemeChanged.connect(lambda _scheme: _follow_system(app))
    app.setProperty("nanoscope_theme_mode", mode)
    return _current


def _follow_system(app: QApplication) -> None:
    if app.property("nanoscope_theme_mode") == "system" and _system_prefers_dark(app) != is_dark():
        apply_theme(app, "system")


def repolish(widget: QWidget) -> None:
    """Re-evaluate the style sheet after a dynamic property used in a selector changed."""
    style = widget.style()
    style.unpolish(widget)
    style.polish(widget)
    widget.update()
