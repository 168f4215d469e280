"""A read-only reply shown token by token: probability colours, top-5 tooltips, divergence, diffs.

Each token is one run of text in a ``QTextDocument`` whose character format carries the token's
index, so hovering finds the token, and restyling never re-parses text. Streaming appends at the
end (O(1) per token); switching the overlay, marking the divergence or showing a diff rebuilds the
document once.

Colours: the probability of each token is mapped through a perceptual scale (interpolated in
OKLab, lightness falling monotonically with probability) from the theme's surface colour at
p = 1 through amber to red at p = 0, so unlikely tokens stand out and likely ones stay quiet, in
both themes. Diff spans, between replies A and B: tokens only in B ("insert") are green with a
solid underline, tokens only in A ("delete") red with a dashed one. Tool-call tokens use the
chat's tool-block colours; special tokens show as small muted ‹names›.
"""

from __future__ import annotations

import html
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import pairwise

from PySide6.QtCore import QEvent, QPoint, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QHelpEvent,
    QLinearGradient,
    QPainter,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import QSizePolicy, QTextEdit, QToolTip, QWidget

from desktop.engine.messages import (
    PYTHON,
    PYTHON_OUTPUT,
    THOUGHT,
    TOOL_QUERY,
    TOOL_RESULT,
    TokenEvent,
    TokenTrace,
)
from desktop.qt.widgets import theme

MARKER_GLYPH = "▍"
FORK_GLYPH = "↳"  # where a forked reply took the user's token (in every common UI font)
SCALE_STEPS = 100  # the overlay's colours come in 101 steps, finer than the eye separates
CALL_KINDS = (PYTHON, TOOL_QUERY)
RESULT_KINDS = (PYTHON_OUTPUT, TOOL_RESULT)


@dataclass
class TokenRecord:
    """What the view knows about one token."""

    text: str
    special: str | None = None
    kind: str = "text"
    forced: bool = False
    logprobs: tuple[float, list] | None = None  # (chosen logprob, [[id, label, logprob], ...])
    given: bool = False  # the user's choice at a fork (or a prefill), not the model's
    draft: str = ""  # speculative decoding: "accepted" | "corrected" | ""

    @property
    def probability(self) -> float | None:
        return math.exp(self.logprobs[0]) if self.logprobs is not None else None


def record_of(ev: TokenEvent) -> TokenRecord:
    """How the view shows one streamed (or recorded) token."""
    logprobs = (ev.logprob, list(ev.top or ())) if ev.logprob is not None else None
    return TokenRecord(ev.text, ev.special, ev.kind, ev.forced, logprobs, ev.given, ev.draft)


def records_of(trace: TokenTrace) -> list[TokenRecord]:
    """A whole reply's tokens as the view shows them."""
    return [record_of(ev) for ev in trace.events(len(trace))]


# ----- the perceptual scale --------------------------------------------------------------------


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


# ----- the view ----------------------------------------------------------------------------------


def visible_text(text: str) -> str:
    """Whitespace drawn as symbols, for tooltips where a bare space would read as nothing."""
    return text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") or "∅"


def _special_label(name: str) -> str:
    """A special token's label, "<|python_start|>" → "‹python_start›", never broken across lines."""
    return "‹" + name.strip("<>|").replace("_", "_\u2060") + "›"


def token_label(record: TokenRecord) -> str:
    """How a token reads on its own: a special token by name, else its text made visible."""
    return _special_label(record.special) if record.special else visible_text(record.text)


class TokenView(QTextEdit):
    """A reply, token by token. Read-only; everything here runs on the GUI thread.

    Character formats are built once per look (kind, probability step, diff mark...) and reused,
    and token positions are kept in ``_spans`` rather than in format properties, so appending a
    token costs one ``insertText``.
    """

    _styled_for: theme.Colors | None = None  # the palette the style sheet was built for

    # token_clicked(index, global position): a click (not a drag) on a token.
    token_clicked = Signal(int, QPoint)

    def __init__(self, parent: QWidget | None = None, fit: bool = False) -> None:
        """``fit``: as tall as the reply, with no scroll bar of its own (a chat message)."""
        super().__init__(parent)
        self.fit = fit
        self.setObjectName("TokenView")
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.setAccessibleName("Reply tokens")
        self.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        self.document().setDocumentMargin(10)
        font = self.font()
        if font.pointSizeF() > 0:  # a little larger than the UI: single-character tokens must be legible
            font.setPointSizeF(font.pointSizeF() * 1.15)
            self.setFont(font)
        self.tokens: list[TokenRecord] = []
        self.overlay = False
        self.divergence: int | None = None
        self.diff_marks: dict[int, str] = {}  # token index -> "insert" | "delete"
        self.drafts_shown = False  # colour speculative decoding's accepted and corrected tokens
        self.chips = False  # tokens without a probability colour on alternating shades (raw view)
        self._spans: list[tuple[int, int]] = []  # document [start, end) of each token
        self._marker_at: int | None = None  # document position of the divergence marker
        self._formats: dict[tuple, QTextCharFormat] = {}
        self._placeholder = ""
        self._mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self._pressed_at: QPoint | None = None
        if fit:
            self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
            self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
            self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
            self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.viewport().setCursor(Qt.CursorShape.PointingHandCursor)
        self._restyle()

    # ----- content ---------------------------------------------------------------------------

    def clear_tokens(self, placeholder: str = "") -> None:
        self.tokens = []
        self.divergence = None
        self.diff_marks = {}
        self._placeholder = placeholder
        self.rebuild()

    def set_tokens(self, tokens: list[TokenRecord]) -> None:
        self.tokens = list(tokens)
        self.rebuild()

    def append_token(self, record: TokenRecord) -> None:
        """Streaming: one more token at the end."""
        if not self.tokens and self._placeholder:
            self._placeholder = ""
            self.rebuild()
        follow = self._at_bottom()
        self.tokens.append(record)
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._insert(cursor, len(self.tokens) - 1)
        if follow:
            self._scroll_to_end()

    def append_text(self, text: str) -> None:
        """More text of the last token (the decoder's held-back tail)."""
        if self.tokens and text:
            self.tokens[-1].text += text
            self.rebuild()

    # ----- decorations -----------------------------------------------------------------------

    def set_overlay(self, on: bool) -> None:
        if on != self.overlay:
            self.overlay = on
            self.rebuild()

    def set_divergence(self, index: int | None) -> None:
        if index != self.divergence:
            self.divergence = index
            self.rebuild()

    def set_drafts_shown(self, on: bool) -> None:
        if on != self.drafts_shown:
            self.drafts_shown = on
            self.rebuild()

    def set_diff(self, marks: dict[int, str]) -> None:
        """Token index → "insert" or "delete" (empty: no diff)."""
        if marks != self.diff_marks:
            self.diff_marks = dict(marks)
            self.rebuild()

    # ----- what is shown (also for tests) ----------------------------------------------------

    def token_at(self, position: int) -> int | None:
        """The token whose text covers document ``position``, or None (margins, the marker)."""
        i = bisect_right(self._spans, (position, float("inf"))) - 1
        if 0 <= i < len(self._spans) and self._spans[i][0] <= position < self._spans[i][1]:
            return i
        return None

    def marker_token(self) -> int | None:
        """The index of the token drawn right after the divergence marker, or None without one."""
        if self._marker_at is None:
            return None
        return bisect_left(self._spans, (self._marker_at + 1, -1))

    def background(self, index: int) -> QColor | None:
        """The background colour token ``index`` is drawn on (None: the view's own)."""
        brush = self._format(index).background()
        return brush.color() if brush.style() != Qt.BrushStyle.NoBrush else None

    # ----- rendering -------------------------------------------------------------------------

    def rebuild(self) -> None:
        follow = self._at_bottom()
        self.document().clear()
        self._spans = []
        self._marker_at = None
        cursor = QTextCursor(self.document())
        if not self.tokens and self._placeholder:
            cursor.insertText(self._placeholder, self._cached(("placeholder",), self._placeholder_format))
        for i in range(len(self.tokens)):
            self._insert(cursor, i)
        if self.divergence is not None and self.divergence >= len(self.tokens) and self.tokens:
            self._insert_marker(cursor)  # this reply ended where the others went on
        if follow:
            self._scroll_to_end()

    def _insert(self, cursor: QTextCursor, index: int) -> None:
        record = self.tokens[index]
        if index == self.divergence:
            self._insert_marker(cursor)
        if record.given and (index == 0 or not self.tokens[index - 1].given):
            cursor.insertText(FORK_GLYPH, self._cached(("fork",), self._fork_format))
        start = cursor.position()
        fmt = self._format(index)
        if record.text:
            cursor.insertText(record.text, fmt)
        if record.special:
            special = self._cached(("special", self._key(index)), lambda: self._special_format(fmt))
            cursor.insertText(_special_label(record.special), special)
        if not record.text and not record.special:
            # An incomplete UTF-8 character: its text comes with the next token. A zero-width
            # space keeps it hoverable without changing what the reply reads.
            cursor.insertText("\u200b", fmt)
        self._spans.append((start, cursor.position()))

    def _insert_marker(self, cursor: QTextCursor) -> None:
        self._marker_at = cursor.position()
        cursor.insertText(MARKER_GLYPH, self._cached(("marker",), self._marker_format))

    def _key(self, index: int) -> tuple:
        """What decides a token's look; tokens with equal keys share one QTextCharFormat."""
        record = self.tokens[index]
        p = record.probability if self.overlay and not record.forced else None
        step = None if p is None else round(max(0.0, min(1.0, p)) * SCALE_STEPS)
        draft = record.draft if self.drafts_shown else ""
        mark = self.diff_marks.get(index)
        chip = index % 2 if self.chips else None
        return (record.kind, step, mark, index == self.divergence, self.overlay, record.given, draft, chip)

    def _format(self, index: int) -> QTextCharFormat:
        key = self._key(index)
        return self._cached(("token", key), lambda: self._token_format(*key))

    def _cached(self, key: tuple, build) -> QTextCharFormat:
        fmt = self._formats.get(key)
        if fmt is None:
            fmt = self._formats[key] = build()
        return fmt

    def _token_format(
        self,
        kind: str,
        step: int | None,
        mark: str | None,
        bold: bool,
        overlay: bool,
        given: bool,
        draft: str,
        chip: int | None,
    ) -> QTextCharFormat:
        c = theme.colors()
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(c.text))
        if chip is not None and step is None:
            fmt.setBackground(QColor(c.token_b if chip else c.token_a))
        if kind in CALL_KINDS or kind in RESULT_KINDS:
            fmt.setFontFamilies([self._mono.family()])
            result = kind in RESULT_KINDS
            fmt.setForeground(QColor(c.tool_result if result else c.tool_label))
            fmt.setBackground(QColor(c.tool_result_bg if result else c.tool_bg))
        elif kind == THOUGHT:
            fmt.setForeground(QColor(c.muted))
            fmt.setFontItalic(True)
        if step is not None:
            # Forced tokens were never the model's choice: they have no step and keep the tool
            # colours (the tooltip still gives their probability).
            shade = probability_color(step / SCALE_STEPS, c)
            # In the raw view every other token is a shade darker, so boundaries show even
            # where the model was sure.
            fmt.setBackground(mix(shade, c.token_b, 0.7) if chip else shade)
        if mark is not None:
            color = QColor(c.success if mark == "insert" else c.error)
            if not overlay:
                fmt.setBackground(mix(c.surface, color, 0.28))
            # Colour and underline, no strike-out: a struck-through one-letter token is unreadable.
            fmt.setUnderlineStyle(
                QTextCharFormat.UnderlineStyle.SingleUnderline
                if mark == "insert"
                else QTextCharFormat.UnderlineStyle.DashUnderline
            )
            fmt.setUnderlineColor(color)
        if draft and step is None and mark is None:
            # Accepted draft tokens on a green tint, the target's corrections on an amber one.
            fmt.setBackground(mix(c.surface, c.success if draft == "accepted" else c.warning, 0.3))
        if given:
            fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.SingleUnderline)
            fmt.setUnderlineColor(QColor(c.accent))
        if bold:
            fmt.setFontWeight(QFont.Weight.Bold)
        return fmt

    def _fork_format(self) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(theme.colors().accent))
        fmt.setFontWeight(QFont.Weight.Bold)
        return fmt

    def _special_format(self, base: QTextCharFormat) -> QTextCharFormat:
        fmt = QTextCharFormat(base)
        fmt.setForeground(QColor(theme.colors().muted))
        if self.font().pointSizeF() > 0:
            fmt.setFontPointSize(max(6.0, self.font().pointSizeF() * 0.8))
        return fmt

    def _marker_format(self) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(theme.colors().accent))
        fmt.setFontWeight(QFont.Weight.Black)
        return fmt

    def _placeholder_format(self) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(theme.colors().muted))
        fmt.setFontItalic(True)
        return fmt

    def _at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        if bar.value() != bar.maximum():
            bar.setValue(bar.maximum())

    # ----- fitting and clicks ------------------------------------------------------------------

    def _fit(self) -> None:
        height = math.ceil(self.document().size().height()) + 2 * self.frameWidth()
        if height != self.height():
            self.setFixedHeight(height)

    def wheelEvent(self, event) -> None:
        if self.fit:
            event.ignore()  # the conversation scrolls, not the message
        else:
            super().wheelEvent(event)

    def mousePressEvent(self, event) -> None:
        self._pressed_at = event.position().toPoint()
        super().mousePressEvent(event)

    def mouseReleaseEvent(self, event) -> None:
        super().mouseReleaseEvent(event)
        pressed, self._pressed_at = self._pressed_at, None
        at = event.position().toPoint()
        if event.button() != Qt.MouseButton.LeftButton or pressed is None:
            return
        if (at - pressed).manhattanLength() > 4 or self.textCursor().hasSelection():
            return  # a drag selects text; only a click opens the token's popup
        index = self.token_at_point(at)
        if index is not None:
            self.token_clicked.emit(index, self.viewport().mapToGlobal(at))

    def token_at_point(self, point: QPoint) -> int | None:
        """The token under viewport ``point``, or None (Qt's exact hit test misses spaces, and
        a token may begin with one: the nearest cursor position decides, on the point's line)."""
        offset = QPointF(self.horizontalScrollBar().value(), self.verticalScrollBar().value())
        hit = self.document().documentLayout().hitTest(QPointF(point) + offset, Qt.HitTestAccuracy.FuzzyHit)
        if hit < 0:
            return None
        cursor = QTextCursor(self.document())
        cursor.setPosition(hit)
        rect = self.cursorRect(cursor)
        if not rect.top() <= point.y() <= rect.bottom():
            return None  # below the last line, or in the margins above
        return self.token_at(hit - 1 if point.x() < rect.left() and hit > 0 else hit)

    def token_point(self, index: int) -> QPoint:
        """The middle of token ``index``'s first character, in viewport coordinates (for tests
        and popups)."""
        start, _end = self._spans[index]
        cursor = QTextCursor(self.document())
        cursor.setPosition(start)
        left = self.cursorRect(cursor)
        cursor.setPosition(start + 1)
        right = self.cursorRect(cursor)
        x = (left.left() + right.left()) // 2 if right.top() == left.top() else left.left() + 2
        return QPoint(x, left.center().y())

    # ----- tooltips --------------------------------------------------------------------------

    def tooltip_html(self, index: int) -> str:
        """The hover text of token ``index``: its probability and the most likely alternatives."""
        record = self.tokens[index]
        shown = token_label(record)
        lines = [f"<b>token {index}</b> &nbsp;<code>{html.escape(shown)}</code>"]
        if record.forced:
            lines.append("<i>forced by the calculator (not sampled)</i>")
        if record.given:
            lines.append("<i>your choice at a fork (not sampled)</i>")
        if record.draft and self.drafts_shown:
            lines.append(
                "<i>drafted and accepted</i>"
                if record.draft == "accepted"
                else "<i>the target's correction</i>"
            )
        mark = self.diff_marks.get(index)
        if mark is not None:
            side = "A" if mark == "delete" else "B"
            lines.append(f"<i>diff: only in this reply (side {side}), not in the other</i>")
        if record.logprobs is None:
            lines.append("no probabilities: turn on Probabilities to compute them")
            return "<br/>".join(lines)
        chosen, top = record.logprobs
        lines.append(f"p = {math.exp(chosen):.4f} &nbsp;·&nbsp; log p = {chosen:.3f}")
        rows = []
        for rank, (_tid, label, lp) in enumerate(top, start=1):
            p = math.exp(lp)
            bar = "█" * max(1, round(p * 12)) if p >= 0.005 else "·"
            weight = "font-weight:700;" if label in (record.special, record.text) else ""
            shown_alt = html.escape(visible_text(label))
            rows.append(
                f"<tr style='{weight}'><td>{rank}.</td><td><code>{shown_alt}</code></td>"
                f"<td align='right'>&nbsp;{p:.3f}</td><td>&nbsp;{bar}</td></tr>"
            )
        lines.append(f"<table cellspacing='0' cellpadding='1'>{''.join(rows)}</table>")
        return "<br/>".join(lines)

    def viewportEvent(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            assert isinstance(event, QHelpEvent)  # what Qt sends a ToolTip as
            index = self.token_at_point(event.pos())
            if index is not None:
                QToolTip.showText(event.globalPos(), self.tooltip_html(index), self)
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)

    # ----- theme -----------------------------------------------------------------------------

    def _restyle(self) -> None:
        c = self._styled_for = theme.colors()
        self.setStyleSheet(
            f"QTextEdit#TokenView {{ background: {c.surface}; color: {c.text}; border: none; }}"
        )

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        # Our own setStyleSheet also sends PaletteChange: restyle only when the theme really changed.
        if event.type() == QEvent.Type.PaletteChange and self._styled_for is not theme.colors():
            self._restyle()
            self._formats.clear()
            self.rebuild()
