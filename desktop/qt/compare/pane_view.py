"""One pane of the Compare view: a compact checkpoint picker, overrides, the reply and its stats.

The picker is two combo boxes (checkpoint, step) instead of the main window's full bar, so four
panes fit side by side. Overrides default to "shared" (the value in the Compare view's sampling
row); a pane that sets one shows it in the accent colour so a different setting is never missed.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QComboBox,
    QDoubleSpinBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from desktop.engine.messages import TokenEvent, TokenTrace
from desktop.engine.params import KNOB
from desktop.qt.chat.message_footer import RENEWED, SPECULATIVE_NOTE, drafted, speculative_line, step_line
from desktop.qt.widgets import common, theme
from desktop.qt.widgets.checkpoint_picker import FOLLOW, entry_name, fill_steps, human_params
from desktop.qt.widgets.fork_popup import ForkPopup
from desktop.qt.widgets.token_view import TokenView, record_of, records_of
from desktop.session.compare.pane_run import PaneRun
from desktop.session.compare.panes import Key, PaneState

SHARED = "shared"
LOOKING = "Looking for checkpoints…"  # until the first folder scan answers
PICK = "Pick a checkpoint and press Load"
NONE_FOUND = "No checkpoints found: use Open folder… in the chat view"


def format_pane_stats(stats: dict) -> list[str]:
    """ "31.2 tok/s · TTFT 120 ms · 64 tokens · stopped" (or the error), then on a line of its
    own speculative decoding's draft and how much of it was kept (it must not be elided away)."""
    if stats.get("error"):
        return [f"⚠ {stats['error']}"]
    bits = []
    if stats.get("decode_tok_s"):
        bits.append(f"{stats['decode_tok_s']:.1f} tok/s")
    if line := step_line(stats):
        bits.append(line)
    if stats.get("ttft_ms"):
        bits.append(f"TTFT {stats['ttft_ms']:.0f} ms")
    if "new_tokens" in stats:
        bits.append(f"{stats['new_tokens']} tokens")
    reason = {"cancelled": "stopped", "max_tokens": "max tokens", "context": "context full"}
    if stats.get("stopped") in reason:
        bits.append(reason[stats["stopped"]])
    draft = speculative_line(str(stats["draft"]), stats) if stats.get("draft") else stats.get("draft_skipped")
    renewed = RENEWED if stats.get("choices_renewed") else ""
    return ["  ·  ".join(bits), *(line for line in (draft, renewed) if line)]


def format_score(source: str, result: dict) -> str:
    """One line for a cross-score: "A's reply here: 1.234 bits/byte · mean log p −0.81"."""
    if result.get("error"):
        return f"{source}'s reply: not scored ({result['error']})"
    bpb, mean = result.get("bits_per_byte"), result.get("mean_logprob")
    if mean is None:
        return f"{source}'s reply: nothing to score (every token was forced)"
    bpb_text = f"{bpb:.3f} bits/byte" if bpb is not None else "no text bytes"
    agreement = result.get("agreement")
    agrees = f" · top-1 agrees {100 * agreement:.0f}%" if agreement is not None else ""
    return f"{source}'s reply here: {bpb_text} · mean log p {mean:.3f}{agrees}"


def _override_box(box: QAbstractSpinBox, tip: str, width: int) -> None:
    box.setSpecialValueText(SHARED)
    box.setToolTip(tip)
    box.setAccessibleName(tip)
    box.setFixedWidth(width)
    box.setKeyboardTracking(False)
    box.setAlignment(Qt.AlignmentFlag.AlignRight)


class _Lines(QWidget):
    """Lines of a pane (its footer, its cross-scores), each elided on its own; ``text()`` is all
    of them."""

    def __init__(self) -> None:
        super().__init__()
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._box = QVBoxLayout(self)
        self._box.setContentsMargins(0, 0, 0, 0)
        self._box.setSpacing(2)
        self._labels: list[common.ElidedLabel] = []

    def set_lines(self, lines: list[str], tip: str | None = None) -> None:
        """Show ``lines``; ``tip``, when given, is the tooltip, after a line's whole text where
        that line is long enough to be elided."""
        while len(self._labels) < len(lines):
            label = common.ElidedLabel()
            label.setObjectName("Muted")
            self._box.addWidget(label)
            self._labels.append(label)
        while len(self._labels) > len(lines):
            label = self._labels.pop()
            self._box.removeWidget(label)
            label.deleteLater()
        for label, line in zip(self._labels, lines, strict=True):
            label.setText(line)  # a long line is its own tooltip
            if tip is not None:
                label.setToolTip("\n".join(t for t in (label.toolTip(), tip) if t))
        if tip is not None:
            self.setToolTip(tip)
        self.setVisible(bool(lines))

    def text(self) -> str:
        return "\n".join(label.text() for label in self._labels)


class ComparePane(QFrame):
    """Signals: selection_changed(Path, int), load_requested(Path, int), unload_requested(),
    remove_requested(), overrides_changed(dict of temperature/top_k/seed → value or None)."""

    selection_changed = Signal(Path, int)
    load_requested = Signal(Path, int)
    unload_requested = Signal()
    remove_requested = Signal()
    overrides_changed = Signal(dict)
    fork_requested = Signal(int, int, str)  # token position, alternative id (-1: text), text
    inside_requested = Signal(int)  # token position: every pane's Inside view there (#45)

    _styled_for: theme.Colors | None = None  # the palette the style sheet was built for

    def __init__(self, letter: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ComparePane")
        self.entries: list = []
        self.listed = False  # set_entries was called: a scan has answered
        self.loaded = False
        self.letter = ""
        self.state = PaneState()  # what the pane shows: show_state() replaces it

        self.badge = QLabel()
        self.badge.setObjectName("PaneBadge")
        self.badge.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.badge.setFixedSize(24, 24)
        self.checkpoint = common.ElidedCombo()
        self.checkpoint.setToolTip("Checkpoint: training phase and model tag")
        self.checkpoint.setMinimumContentsLength(5)
        self.checkpoint.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.checkpoint.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.step = common.ElidedCombo()
        self.step.setToolTip("Training step (newest first)")
        self.step.setMinimumContentsLength(5)
        self.step.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.load_btn = QPushButton("Load")
        self.load_btn.setObjectName("Primary")
        self.remove_btn = common.flat_button("close", "Remove this pane")

        self.summary = common.ElidedLabel(LOOKING)
        self.summary.setObjectName("Muted")
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setFixedWidth(70)
        self.progress.hide()

        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(-0.05, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setDecimals(2)
        _override_box(self.temperature, "Temperature for this pane (shared: the sampling row's)", 74)
        self.top_k = QSpinBox()
        self.top_k.setRange(-1, 1000)
        _override_box(self.top_k, "Top-k for this pane (0 = off; shared: the sampling row's)", 64)
        self.seed = QSpinBox()
        self.seed.setRange(-1, int(KNOB["seed"].ui_hi))
        _override_box(self.seed, "Seed for this pane (shared: the sampling row's)", 96)
        for box in (self.temperature, self.top_k, self.seed):
            common.set_spin_value(box, box.minimum())

        self.view = TokenView()
        self.view.clear_tokens("The reply appears here.")
        self.view.token_clicked.connect(self._open_popup)
        self.popup: ForkPopup | None = None
        self.busy = False  # Compare is replying: a fork waits until every pane is done
        self.stats = _Lines()
        self.stats.set_lines([""])  # the footer keeps its line before the first reply
        # One line per reply scored under this pane's checkpoint ("A's reply here: …").
        self.score = _Lines()
        self.score.setToolTip(
            "Teacher-forced score of a reply under this pane's checkpoint: lower bits per byte "
            "means this checkpoint finds the reply more likely."
        )
        self._scores: dict[str, dict] = {}  # source pane letter -> score
        self.score.hide()

        head = QHBoxLayout()
        head.setSpacing(6)
        head.addWidget(self.badge)
        head.addWidget(self.checkpoint, 1)
        head.addWidget(self.step)
        head.addWidget(self.remove_btn)
        info = QHBoxLayout()  # what is loaded, and the button that loads or frees it
        info.setSpacing(6)
        info.addWidget(self.summary, 1)
        info.addWidget(self.progress)
        info.addWidget(self.load_btn)
        knobs = QWidget()  # the overrides wrap onto a second row in a narrow pane
        knob_flow = common.FlowLayout(knobs, spacing=10, row_spacing=4)
        knob_flow.setContentsMargins(0, 0, 0, 0)
        for text, box in (("T", self.temperature), ("top-k", self.top_k), ("seed", self.seed)):
            label = QLabel(text)
            label.setObjectName("Muted")
            label.setBuddy(box)
            pair = QWidget()
            pair_lay = QHBoxLayout(pair)
            pair_lay.setContentsMargins(0, 0, 0, 0)
            pair_lay.setSpacing(4)
            pair_lay.addWidget(label)
            pair_lay.addWidget(box)
            knob_flow.addWidget(pair)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 8, 10, 8)
        lay.setSpacing(6)
        lay.addLayout(head)
        lay.addLayout(info)
        lay.addWidget(knobs)
        lay.addWidget(self.view, 1)
        lay.addWidget(self.stats)
        lay.addWidget(self.score)

        self.checkpoint.currentIndexChanged.connect(self._on_checkpoint_chosen)
        self.step.currentIndexChanged.connect(self._emit_selection)
        self.load_btn.clicked.connect(self._on_load_button)
        self.remove_btn.clicked.connect(self.remove_requested)
        for box in (self.temperature, self.top_k, self.seed):
            box.valueChanged.connect(self._on_override)
        self.set_letter(letter)
        self._restyle()
        self.show_state(self.state)

    # ----- checkpoint picker -----------------------------------------------------------------

    def set_letter(self, letter: str) -> None:
        self.letter = letter
        self.badge.setText(letter)
        self.setAccessibleName(f"Pane {letter}")
        self.load_btn.setAccessibleName(f"Load checkpoint in pane {letter}")

    def set_entries(self, entries: list) -> None:
        """CheckpointEntry list (source, tag, path, steps); the pane's pick stays shown."""
        self.entries = list(entries)
        self.listed = True
        self.show_state(self.state)

    def _entry(self, path: str | None):
        return next((e for e in self.entries if path is not None and Path(e.path) == Path(path)), None)

    def current(self) -> tuple[Path, int] | None:
        """What the two lists show (the pane's pick, once the session has one); "Latest" is the
        newest saved step."""
        path, step = self.checkpoint.currentData(), self.step.currentData()
        if step == FOLLOW and (entry := self._entry(path)) is not None:
            step = entry.steps[-1]
        return (Path(path), int(step)) if path is not None and step is not None else None

    def following(self) -> bool:
        """Whether the pane's Step list shows "Latest · follows the run"."""
        return self.step.currentData() == FOLLOW

    def _fill(self, picked: Key | None) -> None:
        """Both lists from the entries, showing ``picked``: a checkpoint or step the scan did not
        list (a run opened from the Run tab) is added, never replaced by another one."""
        boxes = (self.checkpoint, self.step)
        for box in boxes:
            box.blockSignals(True)
        self.checkpoint.clear()
        for e in self.entries:
            self.checkpoint.addItem(entry_name(e), str(e.path))
            self.checkpoint.setItemData(self.checkpoint.count() - 1, str(e.path), Qt.ItemDataRole.ToolTipRole)
        if picked is not None and self._entry(str(picked[0])) is None:
            self.checkpoint.addItem(picked[0].name, str(picked[0]))
            self.checkpoint.setItemData(
                self.checkpoint.count() - 1, str(picked[0]), Qt.ItemDataRole.ToolTipRole
            )
        paths = [Path(self.checkpoint.itemData(i)) for i in range(self.checkpoint.count())]
        self.checkpoint.setCurrentIndex(paths.index(picked[0]) if picked is not None else 0)
        self._fill_steps_of(picked[1] if picked is not None else None)
        for box in boxes:
            box.blockSignals(False)

    def _fill_steps_of(self, step: int | None) -> None:
        entry = self._entry(self.checkpoint.currentData())
        fill_steps(self.step, entry, step, follow=step is not None and self.state.following.on)

    def _on_checkpoint_chosen(self) -> None:
        self.step.blockSignals(True)
        self._fill_steps_of(None)  # the newest step of the checkpoint chosen
        self.step.blockSignals(False)
        self._emit_selection()

    def _emit_selection(self) -> None:
        cur = self.current()
        if cur is not None:
            self.selection_changed.emit(*cur)

    def _on_load_button(self) -> None:
        state = self.state
        if state.pick_is_loaded:
            self.unload_requested.emit()
        elif state.picked is not None:
            self.load_requested.emit(*state.picked)

    # ----- the pane's state ------------------------------------------------------------------

    def show_state(self, state: PaneState) -> None:
        """Show ``state``: its pick in the lists, which step answers, and a button that loads the
        pick or frees the model that answers."""
        self.state = state
        self._fill(state.picked)
        self.loaded = state.info is not None
        self.progress.setVisible(state.status == "loading")
        self.progress.setValue(state.progress[0])
        self.summary.setText(self._summary(state))
        info = state.info
        self.summary.setToolTip(f"{info.path} · step {info.step}" if info is not None else "")
        if state.overrides != {k: v for k, v in self.overrides().items() if v is not None}:
            self.set_overrides(state.overrides)
        self._update_enabled()

    def _summary(self, state: PaneState) -> str:
        info, headline = state.info, state.headline()
        if state.status == "loaded" and info is not None:
            parts = [
                headline,
                info.era,
                f"{human_params(info.parameters)} params",
                info.device,
                info.precision,
            ]
            return "  ·  ".join(p for p in parts if p)
        if headline:
            return headline
        if not self.listed:
            return LOOKING
        return PICK if self.entries else NONE_FOUND

    def _update_enabled(self) -> None:
        state = self.state
        has = bool(self.entries) or state.picked is not None
        for w in (self.checkpoint, self.step):
            w.setEnabled(has)
        loading = state.status == "loading"
        unload = state.pick_is_loaded
        self.load_btn.setEnabled(state.picked is not None and not loading)
        self.load_btn.setText("Loading…" if loading else "Unload" if unload else "Load")
        self.load_btn.setObjectName("" if unload else "Primary")
        what = f"step {state.picked[1]:,}" if state.picked is not None else "the selected checkpoint"
        self.load_btn.setToolTip(
            f"Free pane {self.letter}'s model" if unload else f"Load {what} in pane {self.letter}"
        )
        theme.repolish(self.load_btn)

    # ----- overrides -------------------------------------------------------------------------

    def overrides(self) -> dict:
        """temperature / top_k / seed → the pane's value, or None for "shared"."""
        out: dict = {}
        for key, box in (("temperature", self.temperature), ("top_k", self.top_k), ("seed", self.seed)):
            value = box.value()
            out[key] = (
                None if value == box.minimum() else (round(value, 2) if key == "temperature" else value)
            )
        return out

    def set_overrides(self, overrides: dict) -> None:
        """Show overrides chosen elsewhere (a sweep) without echoing them back."""
        for key, box in (("temperature", self.temperature), ("top_k", self.top_k), ("seed", self.seed)):
            box.blockSignals(True)
            value = overrides.get(key)
            common.set_spin_value(box, box.minimum() if value is None else value)
            box.blockSignals(False)
        self._mark_overrides()

    def _on_override(self) -> None:
        self._mark_overrides()
        self.overrides_changed.emit(self.overrides())

    def _mark_overrides(self) -> None:
        accent = theme.colors().accent
        for box in (self.temperature, self.top_k, self.seed):
            changed = box.value() != box.minimum()
            box.setStyleSheet(f"color: {accent}; font-weight: 600;" if changed else "")

    # ----- the reply -------------------------------------------------------------------------

    def _open_popup(self, index: int, where: QPoint) -> None:
        """A click on token ``index``: its alternatives, each a fork raced on every pane."""
        if not 0 <= index < len(self.view.tokens):
            return
        refusal = "The panes are still replying: fork once they are done." if self.busy else ""
        if self.popup is not None:
            self.popup.close()
        self.popup = ForkPopup(index, self.view.tokens[index], refusal, parent=self, inside=True)
        self.popup.chosen.connect(lambda token, text, _race: self.fork_requested.emit(index, token, text))
        self.popup.inside_requested.connect(lambda: self.inside_requested.emit(index))
        self.popup.show_at(where)

    def begin(self, said: TokenTrace | None = None) -> None:
        """A reply starts; ``said``: what it holds already (a raced fork's start)."""
        self.view.clear_tokens()
        if said is not None and len(said):
            self.view.set_tokens(records_of(said))
        self.stats.set_lines(["…"], "")
        self.set_scores({})

    def append(self, index: int, ev: TokenEvent) -> None:
        if ev.continues:
            self.view.append_text(ev.text)
        elif index == len(self.view.tokens):
            self.view.append_token(record_of(ev))

    def finish(self, stats: dict) -> None:
        self._show_stats(stats)

    def _show_stats(self, stats: dict) -> None:
        self.stats.set_lines(format_pane_stats(stats), SPECULATIVE_NOTE if drafted(stats) else "")

    def set_draft_colours(self, on: bool) -> None:
        """Colour speculative decoding's kept drafts and corrections instead of probabilities."""
        self.view.set_drafts_shown(on)

    def show_run(self, run: PaneRun) -> None:
        """Redraw from a PaneRun (reopened comparison, probabilities filled in afterwards)."""
        records = records_of(run.trace)
        if records:
            self.view.set_tokens(records)
        else:
            self.view.clear_tokens("The reply appears here.")
        self._show_stats(run.stats)

    def set_score(self, source: str, result: dict) -> None:
        """Pane ``source``'s reply was scored under this pane's checkpoint."""
        self.set_scores({**self._scores, source: result})

    def set_scores(self, scores: dict[str, dict]) -> None:
        """Every score shown here: source pane letter -> result (an empty dict hides them)."""
        self._scores = dict(scores)
        self.score.set_lines(self.score_lines())

    def score_lines(self) -> list[str]:
        return [format_score(source, self._scores[source]) for source in sorted(self._scores)]

    # ----- theme -----------------------------------------------------------------------------

    def _restyle(self) -> None:
        c = self._styled_for = theme.colors()
        self.setStyleSheet(
            f"QFrame#ComparePane {{ background: {c.surface}; border: 1px solid {c.border};"
            f" border-radius: 10px; }}"
            f"QLabel#PaneBadge {{ background: {c.accent}; color: {c.on_accent}; border-radius: 12px;"
            f" font-weight: 700; }}"
        )
        self._mark_overrides()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        # Our own setStyleSheet also sends PaletteChange: restyle only when the theme really changed.
        if event.type() == QEvent.Type.PaletteChange and self._styled_for is not theme.colors():
            self._restyle()
