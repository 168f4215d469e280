"""A read-only reply shown token by token: probability colours, top-5 tooltips, divergence, diffs.

Each token is one run of text in a ``QTextDocument`` whose character format carries the token's
index, so hovering finds the token, and restyling never re-parses text. Streaming appends at the
end (O(1) per token); switching the overlay, marking the divergence or showing a diff rebuilds the
document once.

Colours: the probability of each token is mapped through a perceptual scale
(:mod:`.probability_colors`), so unlikely tokens stand out and likely ones stay quiet, in both
themes. Diff spans, between replies A and B: tokens only in B ("insert") are green with a
solid underline, tokens only in A ("delete") red with a dashed one. Tool-call tokens use the
chat's tool-block colours; special tokens show as small muted ‹names›.
"""

from __future__ import annotations

import html
import math
from bisect import bisect_left, bisect_right

from PySide6.QtCore import QEvent, QPoint, QPointF, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QHelpEvent,
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
)
from desktop.qt.widgets import theme
from desktop.qt.widgets.probability_colors import SCALE_STEPS, mix, probability_color
from desktop.qt.widgets.probability_colors import ProbabilityLegend as ProbabilityLegend  # Compare's
from desktop.qt.widgets.token_records import FORK_GLYPH, TokenRecord, special_label, token_label, visible_text
from desktop.qt.widgets.token_records import record_of as record_of  # Compare's
from desktop.qt.widgets.token_records import records_of as records_of  # Compare's

MARKER_GLYPH = "▍"
CALL_KINDS = (PYTHON, TOOL_QUERY)
RESULT_KINDS = (PYTHON_OUTPUT, TOOL_RESULT)


# ----- the view ----------------------------------------------------------------------------------


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
            cursor.insertText(special_label(record.special), special)
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
