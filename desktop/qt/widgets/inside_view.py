"""The Inside view (issue #45, docs/INSIDE.md): at one token, what each layer predicted, where
each head looked, and which paths pushed the produced token.

A view only: it shows what a :class:`~desktop.session.conversation.ReplyInside` gives for a
position (the numbers of one hooked pass, or those kept in history) and asks for nothing else.
Clicking an earlier token shows that token's own position from the same numbers
(``position_changed``); a position the kept numbers lack says it needs the model.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QEvent, QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QMouseEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.qt.widgets import theme
from desktop.qt.widgets.token_records import visible_text

NOT_KEPT = (
    "Position {p} was not computed for this reply, and the model that made it is not loaded: "
    "load it to see this token's Inside view."
)


def _mix(a: str, b: str, t: float) -> QColor:
    """``a`` blended toward ``b`` by ``t`` (0..1)."""
    ca, cb = QColor(a), QColor(b)
    t = max(0.0, min(1.0, t))
    return QColor(
        round(ca.red() + (cb.red() - ca.red()) * t),
        round(ca.green() + (cb.green() - ca.green()) * t),
        round(ca.blue() + (cb.blue() - ca.blue()) * t),
    )


def _heat(t: float) -> QColor:
    """A weight (0..1) as the theme's surface shaded toward its accent."""
    c = theme.colors()
    return _mix(c.surface, c.accent, t**0.6)


class LensStrip(QWidget):
    """One cell per layer, shaded by the produced token's probability there; the layer where it
    first becomes the top prediction is outlined and marked."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.probs: list[float] = []
        self.ranks: list[int] = []
        self.first: int | None = None
        self.setMinimumHeight(34)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_layers(self, probs: list[float], ranks: list[int], first: int | None) -> None:
        self.probs, self.ranks, self.first = probs, ranks, first
        self.setToolTip(
            "\n".join(
                f"after block {i}: rank {r}, p {p:.3f}"
                for i, (p, r) in enumerate(zip(probs, ranks, strict=True))
            )
        )
        self.update()

    def cell(self, layer: int) -> QRect:
        n = max(1, len(self.probs))
        w = max(1, (self.width() - 2) // n)
        return QRect(1 + layer * w, 1, w - 3, self.height() - 14)

    def paintEvent(self, event: QPaintEvent) -> None:
        c = theme.colors()
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        font = QFont(self.font())
        font.setPointSizeF(max(6.0, font.pointSizeF() * 0.8))
        p.setFont(font)
        for layer, prob in enumerate(self.probs):
            r = self.cell(layer)
            p.setBrush(_heat(prob))
            first = layer == self.first
            p.setPen(QPen(QColor(c.success if first else c.border), 2 if first else 1))
            p.drawRoundedRect(r, 3, 3)
            p.setPen(QColor(c.on_accent if prob > 0.55 else c.text))
            rank = self.ranks[layer] if layer < len(self.ranks) else 0
            p.drawText(r, Qt.AlignmentFlag.AlignCenter, f"p {prob:.2f} · rank {rank}")
            p.setPen(QColor(c.success if first else c.muted))
            label = f"L{layer}" + (" ★" if first else "")
            p.drawText(QRect(r.left(), r.bottom() + 1, r.width(), 12), Qt.AlignmentFlag.AlignCenter, label)
        p.end()


class HeadGrid(QWidget):
    """A layer × head grid of tiny maps: each cell is that head's weights over the tokens up to
    this position (the last ``SHOWN`` of them), as a heat strip. A click picks a head."""

    picked = Signal(int, int)
    SHOWN = 48
    CELL = QSize(96, 18)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.attention: Any = ()
        self.chosen = (0, 0)
        self.setMouseTracking(True)

    def set_attention(self, attention: Any, chosen: tuple[int, int]) -> None:
        self.attention, self.chosen = attention, chosen
        layers = len(attention)
        heads = len(attention[0]) if layers else 0
        self.setFixedSize(40 + heads * (self.CELL.width() + 4), 18 + layers * (self.CELL.height() + 4))
        self.update()

    def cell(self, layer: int, head: int) -> QRect:
        return QRect(
            40 + head * (self.CELL.width() + 4),
            18 + layer * (self.CELL.height() + 4),
            self.CELL.width(),
            self.CELL.height(),
        )

    def _at(self, point: QPoint) -> tuple[int, int] | None:
        for layer, heads in enumerate(self.attention):
            for head in range(len(heads)):
                if self.cell(layer, head).contains(point):
                    return layer, head
        return None

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        at = self._at(event.position().toPoint())
        self.setToolTip(f"layer {at[0]}, head {at[1]}: click to show its weights" if at else "")

    def mousePressEvent(self, event: QMouseEvent) -> None:
        at = self._at(event.position().toPoint())
        if at is not None:
            self.chosen = at
            self.update()
            self.picked.emit(*at)

    def paintEvent(self, event: QPaintEvent) -> None:
        c = theme.colors()
        p = QPainter(self)
        font = QFont(self.font())
        font.setPointSizeF(max(6.0, font.pointSizeF() * 0.8))
        p.setFont(font)
        p.setPen(QColor(c.muted))
        heads = len(self.attention[0]) if self.attention else 0
        for head in range(heads):
            r = self.cell(0, head)
            p.drawText(QRect(r.left(), 0, r.width(), 16), Qt.AlignmentFlag.AlignCenter, f"head {head}")
        for layer, rows in enumerate(self.attention):
            r0 = self.cell(layer, 0)
            p.setPen(QColor(c.muted))
            p.drawText(QRect(0, r0.top(), 36, r0.height()), Qt.AlignmentFlag.AlignVCenter, f"L{layer}")
            for head, row in enumerate(rows):
                r = self.cell(layer, head)
                shown = list(row)[-self.SHOWN :]
                top = max(shown) if shown else 1.0
                w = r.width() / max(1, len(shown))
                for j, weight in enumerate(shown):
                    x0, x1 = r.left() + round(j * w), r.left() + round((j + 1) * w)
                    p.fillRect(QRect(x0, r.top(), max(1, x1 - x0), r.height()), _heat(weight / (top or 1.0)))
                chosen = (layer, head) == self.chosen
                p.setPen(QPen(QColor(c.accent if chosen else c.border), 2 if chosen else 1))
                p.setBrush(Qt.BrushStyle.NoBrush)
                p.drawRect(r)
        p.end()


class TokenWeights(QWidget):
    """The conversation's tokens up to this position as chips, each shaded by the chosen head's
    weight on it. Hovering one shows its weight; clicking one emits ``clicked(j)``."""

    clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.labels: list[str] = []
        self.weights: list[float] = []
        self.reply_start = 0
        self.position = 0
        self._rects: list[QRect] = []
        self._widths: list[int] = []  # each chip's width, measured once per set of labels
        self._laid: tuple[int, int] = (-1, 0)  # (width laid out for, the height it took)
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)

    def set_tokens(self, labels: list[str], weights: list[float], reply_start: int, position: int) -> None:
        if labels != self.labels or not self._widths:
            fm = QFontMetrics(self.font())
            self._widths = [fm.horizontalAdvance(label) + 10 for label in labels]
            self._laid = (-1, 0)
        self.labels, self.weights = labels, weights
        self.reply_start, self.position = reply_start, position
        self._layout(max(200, self.width()))
        self.update()

    def _layout(self, width: int) -> int:
        """Chips in rows that fit ``width`` (a thousand-token conversation is laid out once a width)."""
        if self._laid[0] == width:
            return self._laid[1]
        x = y = 2
        h = QFontMetrics(self.font()).height() + 6
        self._rects = []
        for w in self._widths:
            if x + w > width - 2 and x > 2:
                x, y = 2, y + h + 4
            self._rects.append(QRect(x, y, w, h))
            x += w + 3
        height = y + h + 4
        self._laid = (width, height)
        self.setMinimumHeight(height)
        return height

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._layout(width)

    def resizeEvent(self, event: Any) -> None:
        self._layout(self.width())
        super().resizeEvent(event)

    def chip(self, j: int) -> QRect:
        """Where token ``j`` is drawn (for tests and the tooltip)."""
        return self._rects[j]

    def tooltip_of(self, j: int) -> str:
        where = "prompt" if j < self.reply_start else "reply"
        here = "  (this position)" if j == self.position else ""
        return f"token {j} ({where}) {self.labels[j]}: weight {self.weights[j]:.4f}{here}"

    def _at(self, point: QPoint) -> int | None:
        return next((j for j, r in enumerate(self._rects) if r.contains(point)), None)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        j = self._at(event.position().toPoint())
        self.setToolTip(self.tooltip_of(j) if j is not None else "")

    def mousePressEvent(self, event: QMouseEvent) -> None:
        j = self._at(event.position().toPoint())
        if j is not None:
            self.clicked.emit(j)

    def paintEvent(self, event: QPaintEvent) -> None:
        c = theme.colors()
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        top = max(self.weights) if self.weights else 1.0
        for j, (label, r) in enumerate(zip(self.labels, self._rects, strict=True)):
            t = self.weights[j] / (top or 1.0)
            p.setBrush(_heat(t))
            here = j == self.position
            p.setPen(
                QPen(
                    QColor(c.accent if here else (c.border if j < self.reply_start else c.muted)),
                    2 if here else 1,
                )
            )
            p.drawRoundedRect(r, 4, 4)
            p.setPen(QColor(c.on_accent if t > 0.6 else c.text))
            p.drawText(r, Qt.AlignmentFlag.AlignCenter, label)
        p.end()


def _table(columns: list[str]) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(columns)
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
    table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.horizontalHeader().setStretchLastSection(True)
    table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    return table


def _fit_height(table: QTableWidget) -> None:
    table.resizeRowsToContents()
    h = table.horizontalHeader().height() + sum(table.rowHeight(r) for r in range(table.rowCount())) + 4
    table.setFixedHeight(h)


def _section(title: str) -> QLabel:
    label = QLabel(title)
    font = label.font()
    font.setBold(True)
    font.setPointSizeF(font.pointSizeF() * 1.1)
    label.setFont(font)
    label.setContentsMargins(0, 8, 0, 0)
    return label


class InsideView(QFrame):
    """One position's Inside view: logit lens, attention and attribution.

    Signals:
        position_changed(int): the view now shows this position (an earlier token was clicked).
    """

    position_changed = Signal(int)

    def __init__(self, source: Any, position: int, parent: QWidget | None = None) -> None:
        """``source``: a :class:`~desktop.session.conversation.ReplyInside`."""
        super().__init__(parent)
        self.setObjectName("InsideView")
        self.setWindowTitle("Inside the model")
        self.source = source
        self.position = position
        self.inside: Any = None
        self.layer, self.head = 0, 0
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        outer.addWidget(scroll)
        body = QWidget()
        scroll.setWidget(body)
        lay = QVBoxLayout(body)
        lay.setContentsMargins(14, 12, 14, 14)
        lay.setSpacing(6)
        self.title = QLabel()
        font = self.title.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.2)
        self.title.setFont(font)
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.title.setWordWrap(True)
        lay.addWidget(self.title)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setTextFormat(Qt.TextFormat.PlainText)
        lay.addWidget(self.note)
        self.missing = QLabel()
        self.missing.setWordWrap(True)
        self.missing.setObjectName("Muted")
        lay.addWidget(self.missing)

        self.content = QWidget()
        col = QVBoxLayout(self.content)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(6)
        lay.addWidget(self.content)
        col.addWidget(_section("Logit lens"))
        self.readout = QLabel()
        self.readout.setObjectName("Muted")
        self.readout.setWordWrap(True)
        col.addWidget(self.readout)
        self.strip = LensStrip()
        col.addWidget(self.strip)
        self.first = QLabel()
        col.addWidget(self.first)
        self.lens = _table(["after block", "1", "2", "3", "4", "5", "rank", "p"])
        col.addWidget(self.lens)

        col.addWidget(_section("Attention"))
        hint = QLabel("Pick a head; hover a token for its weight, click one to see its own position.")
        hint.setObjectName("Muted")
        col.addWidget(hint)
        self.grid = HeadGrid()
        self.grid.picked.connect(self.pick)
        col.addWidget(self.grid)
        self.head_label = QLabel()
        col.addWidget(self.head_label)
        self.tokens = TokenWeights()
        self.tokens.clicked.connect(self._token_clicked)
        col.addWidget(self.tokens)

        col.addWidget(_section("Attribution"))
        self.attr_title = QLabel()
        self.attr_title.setWordWrap(True)
        col.addWidget(self.attr_title)
        row = QHBoxLayout()
        self.heads_btn = QPushButton("Show each head's share")
        self.heads_btn.setCheckable(True)
        self.heads_btn.toggled.connect(lambda _on: self._fill_attribution())
        row.addWidget(self.heads_btn)
        row.addStretch(1)
        col.addLayout(row)
        self.attribution = _table(["path", "push on the logit", "heads"])
        col.addWidget(self.attribution)
        self.residual = QLabel()
        self.residual.setWordWrap(True)
        col.addWidget(self.residual)
        lay.addStretch(1)
        self.resize(760, 820)
        self.show_position(position)

    # ----- what is shown -----------------------------------------------------------------------

    def _label(self, token: int) -> str:
        return visible_text(self.source.label(token))

    def _quoted(self, token: int) -> str:
        return f"‘{self._label(token)}’"

    def show_position(self, position: int) -> bool:
        """Show ``position`` from the source's numbers; False (and a line) where it has none."""
        self.position = position
        inside = self.source.at(position)
        self.inside = inside
        ids = self.source.ids
        where = "reply" if position >= self.source.reply_start else "prompt"
        self.content.setVisible(inside is not None)
        self.missing.setVisible(inside is None)
        if inside is None:
            self.title.setText(f"Position {position} ({where}): {self._quoted(ids[position])}")
            self.missing.setText(NOT_KEPT.format(p=position))
            self.note.setVisible(False)
            return False
        came = "came next" if position + 1 < len(ids) else "the model's top guess"
        self.title.setText(
            f"Position {position} of {len(ids)} ({where}): {self._quoted(inside.token)} "
            f"predicts {self._quoted(inside.produced)} ({came})"
        )
        kind = inside.kind
        self.note.setVisible(not inside.exact or bool(kind))
        self.note.setText(
            (f"{kind} · " if kind else "")
            + ("exact (float32)" if inside.exact else f"approximate: {inside.note}")
        )
        c = theme.colors()
        self.note.setStyleSheet("" if inside.exact else f"color: {c.warning};")
        self.readout.setText(f"Read out: {inside.readout}")
        self._fill_lens()
        layers = len(inside.attention)
        heads = len(inside.attention[0]) if layers else 0
        self.layer, self.head = min(self.layer, layers - 1), min(self.head, heads - 1)
        self.pick(self.layer, self.head)
        self._fill_attribution()
        return True

    def _fill_lens(self) -> None:
        inside = self.inside
        self.strip.set_layers(
            [x.produced_prob for x in inside.lens], [x.produced_rank for x in inside.lens], inside.first_top1
        )
        produced = self._quoted(inside.produced)
        first = inside.first_top1
        self.first.setText(
            f"{produced} is first the top prediction after block {first}"
            if first is not None
            else f"{produced} is never the top prediction"
        )
        t = self.lens
        t.setRowCount(len(inside.lens))
        c = theme.colors()
        for r, layer in enumerate(inside.lens):
            t.setItem(r, 0, QTableWidgetItem(f"L{layer.layer}"))
            for k in range(5):
                text = ""
                item = QTableWidgetItem()
                if k < len(layer.top):
                    g = layer.top[k]
                    text = f"{self._label(g.token)}  {g.prob:.3f}"
                    if g.token == inside.produced:
                        item.setForeground(QColor(c.success))
                        font = item.font()
                        font.setBold(True)
                        item.setFont(font)
                item.setText(text)
                t.setItem(r, 1 + k, item)
            t.setItem(r, 6, QTableWidgetItem(str(layer.produced_rank)))
            t.setItem(r, 7, QTableWidgetItem(f"{layer.produced_prob:.4f}"))
        _fit_height(t)

    def pick(self, layer: int, head: int) -> None:
        """Show head ``head`` of ``layer``'s weights over the tokens."""
        inside = self.inside
        if inside is None:
            return
        self.layer, self.head = layer, head
        self.grid.set_attention(inside.attention, (layer, head))
        row = list(inside.attention[layer][head])
        labels = [self._label(t) for t in self.source.ids[: self.position + 1]]
        self.head_label.setText(f"Layer {layer}, head {head}: its weights from position {self.position}")
        self.tokens.set_tokens(labels, row, self.source.reply_start, self.position)

    def changeEvent(self, event: QEvent) -> None:
        """A theme switch re-renders the tables' baked colours (the painted parts follow)."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and self.inside is not None:
            self.show_position(self.position)

    def weight(self, j: int) -> float:
        """The chosen head's weight on token ``j`` as shown."""
        return self.tokens.weights[j]

    def _token_clicked(self, j: int) -> None:
        if j == self.position:
            return
        self.show_position(j)
        self.position_changed.emit(j)

    def _fill_attribution(self) -> None:
        inside = self.inside
        if inside is None:
            return
        a = inside.attribution
        self.attr_title.setText(f"How each path pushes the logit of {self._quoted(a.token)} {a.logit_words}:")
        heads_on = self.heads_btn.isChecked()
        t = self.attribution
        t.setColumnHidden(2, not heads_on)
        t.setRowCount(len(a.terms))
        c = theme.colors()
        for r, term in enumerate(a.terms):
            t.setItem(r, 0, QTableWidgetItem(term.name))
            value = QTableWidgetItem(f"{term.value:+.4f}")
            value.setForeground(QColor(c.success if term.value >= 0 else c.error))
            t.setItem(r, 1, value)
            shares = ""
            if heads_on and term.kind == "attn" and 0 <= term.layer < len(a.heads):
                shares = "  ".join(f"h{h} {v:+.3f}" for h, v in enumerate(a.heads[term.layer]))
            t.setItem(r, 2, QTableWidgetItem(shares))
        _fit_height(t)
        total = sum(term.value for term in a.terms)
        self.residual.setText(
            f"The terms sum to {total:.4f}; the logit is {a.pre_softcap:.4f}; residual {a.residual:+.2e}"
        )
