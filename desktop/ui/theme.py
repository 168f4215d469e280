"""Light and dark palettes, the application style sheet and the tool-call colours."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication


@dataclass(frozen=True)
class Colors:
    window: str
    base: str
    surface: str
    text: str
    muted: str
    accent: str
    border: str
    user_bubble: str
    assistant_bubble: str
    tool_bg: str
    tool_border: str
    tool_text: str
    output_bg: str
    error: str
    warning: str
    info: str


LIGHT = Colors(
    window="#f5f6f8",
    base="#ffffff",
    surface="#eef0f3",
    text="#1d2330",
    muted="#6b7280",
    accent="#3b6ef5",
    border="#d9dde4",
    user_bubble="#e8efff",
    assistant_bubble="#ffffff",
    tool_bg="#fff7e6",
    tool_border="#f0a020",
    tool_text="#5c3b00",
    output_bg="#e9f8ef",
    error="#c62828",
    warning="#b26a00",
    info="#1f5fbf",
)
DARK = Colors(
    window="#16181d",
    base="#1e2128",
    surface="#262a33",
    text="#e6e8ee",
    muted="#9aa1ad",
    accent="#6d95ff",
    border="#343945",
    user_bubble="#243252",
    assistant_bubble="#1e2128",
    tool_bg="#3a2e14",
    tool_border="#e0a030",
    tool_text="#ffd98a",
    output_bg="#173524",
    error="#ef5350",
    warning="#ffb74d",
    info="#64a0ff",
)

_current = LIGHT


def is_dark() -> bool:
    return _current is DARK


def colors() -> Colors:
    return _current


def system_prefers_dark() -> bool:
    hints = QGuiApplication.styleHints()
    scheme = getattr(hints, "colorScheme", None)
    if scheme is not None:
        value = scheme()
        if value == Qt.ColorScheme.Dark:
            return True
        if value == Qt.ColorScheme.Light:
            return False
    return QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128


def style_sheet(c: Colors) -> str:
    return f"""
    QMainWindow, QWidget#Body {{ background: {c.window}; }}
    QWidget {{ color: {c.text}; }}
    QScrollArea, QScrollArea > QWidget > QWidget#ChatContainer {{ background: {c.window}; border: none; }}
    QFrame#Bubble[role="user"] {{ background: {c.user_bubble}; border-radius: 12px; }}
    QFrame#Bubble[role="assistant"] {{ background: {c.assistant_bubble}; border: 1px solid {c.border};
        border-radius: 12px; }}
    QFrame#Bubble[role="system"] {{ background: {c.surface}; border-radius: 12px; }}
    QLabel#RoleLabel {{ color: {c.muted}; font-weight: 600; }}
    QLabel#Footer {{ color: {c.muted}; font-size: 11px; }}
    QFrame#ToolBlock {{ background: {c.tool_bg}; border: 1px solid {c.tool_border};
        border-left: 4px solid {c.tool_border}; border-radius: 8px; }}
    QLabel#ToolTitle {{ color: {c.tool_text}; font-weight: 700; }}
    QLabel#ToolCode {{ color: {c.tool_text}; }}
    QLabel#ToolResult {{ background: {c.output_bg}; border-radius: 6px; padding: 2px 8px; font-weight: 700; }}
    QFrame#Collapsible {{ border: 1px dashed {c.border}; border-radius: 8px; }}
    QFrame#Sidebar, QFrame#SamplingPanel {{ background: {c.surface}; }}
    QFrame#PickerBar {{ background: {c.base}; border-bottom: 1px solid {c.border}; }}
    QFrame#InputBar {{ background: {c.window}; }}
    QPlainTextEdit#Input {{ background: {c.base}; border: 1px solid {c.border}; border-radius: 10px;
        padding: 6px; }}
    QPushButton {{ background: {c.base}; border: 1px solid {c.border}; border-radius: 6px;
        padding: 5px 12px; }}
    QPushButton:hover {{ border-color: {c.accent}; }}
    QPushButton#Primary {{ background: {c.accent}; color: white; border: none; font-weight: 600; }}
    QPushButton#Danger {{ background: {c.error}; color: white; border: none; font-weight: 600; }}
    QPushButton:disabled {{ color: {c.muted}; }}
    QComboBox, QLineEdit {{ background: {c.base}; border: 1px solid {c.border};
        border-radius: 6px; padding: 3px 6px; }}
    QListWidget {{ background: transparent; border: none; }}
    QListWidget::item {{ padding: 6px; border-radius: 6px; }}
    QListWidget::item:selected {{ background: {c.accent}; color: white; }}
    QLabel#Muted {{ color: {c.muted}; }}
    QLabel#SectionTitle {{ font-weight: 700; }}
    QStatusBar {{ background: {c.surface}; border-top: 1px solid {c.border}; }}
    QStatusBar QLabel {{ color: {c.muted}; padding: 0 6px; }}
    QToolTip {{ background: {c.base}; color: {c.text}; border: 1px solid {c.border}; }}
    """


def apply_theme(app: QApplication, mode: str = "system") -> Colors:
    """Apply "light", "dark", or "system" (follow the OS colour scheme)."""
    global _current
    dark = system_prefers_dark() if mode == "system" else mode == "dark"
    _current = DARK if dark else LIGHT
    c = _current
    pal = QPalette()
    for role, value in (
        (QPalette.ColorRole.Window, c.window),
        (QPalette.ColorRole.Base, c.base),
        (QPalette.ColorRole.AlternateBase, c.surface),
        (QPalette.ColorRole.Text, c.text),
        (QPalette.ColorRole.WindowText, c.text),
        (QPalette.ColorRole.Button, c.base),
        (QPalette.ColorRole.ButtonText, c.text),
        (QPalette.ColorRole.Highlight, c.accent),
        (QPalette.ColorRole.HighlightedText, "#ffffff"),
        (QPalette.ColorRole.ToolTipBase, c.base),
        (QPalette.ColorRole.ToolTipText, c.text),
        (QPalette.ColorRole.PlaceholderText, c.muted),
    ):
        pal.setColor(role, QColor(value))
    app.setPalette(pal)
    app.setStyleSheet(style_sheet(c))
    return c
