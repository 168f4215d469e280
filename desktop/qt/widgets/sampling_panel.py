"""The sampling panel (right side): presets, system prompt, sampling knobs, reply length and seed.

Each knob is a slider and a spin box kept in sync; the spin box holds the true value (a typed
0.73 stays 0.73 while the slider shows the nearest step). Values are plain dicts with the keys of
``DEFAULTS`` so they go straight into settings and the worker's request. The panel folds to a
thin strip with its header button.

The values live in a :class:`~desktop.session.sampling.SamplingState`: the panel shows it and
sends the user's changes to it, so the window takes each reply's request from the state.
"""

from __future__ import annotations

from collections.abc import Collection

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QComboBox,
    QDoubleSpinBox,
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSlider,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop.engine.params import FILTER_KEYS, KNOB, PRESETS, Knob
from desktop.qt.widgets import common, icons, theme
from desktop.qt.widgets.speculative_box import SpeculativeBox
from desktop.session.sampling import DEFAULTS, SEED_MAX, SamplingState

# The knobs, their ranges, the presets and the defaults all come from engine/params.py.
PANEL_KNOBS = tuple(KNOB[k] for k in (*FILTER_KEYS, "max_tokens"))
BUILTIN_PRESETS: dict[str, dict] = {
    name: {k: getattr(preset, k) for k in FILTER_KEYS} for name, preset in PRESETS.items()
}
EXPANDED_MIN_WIDTH = 270
COLLAPSED_WIDTH = 44


class _KnobRow(QWidget):
    """Label, "off" note and spin box on one line, the slider under them."""

    changed = Signal()

    def __init__(self, knob: Knob) -> None:
        super().__init__()
        self.knob = knob
        self.scale = 1 / knob.step
        self.label = QLabel(knob.label)
        self.note = QLabel()
        self.note.setObjectName("Muted")
        # An open lower bound (top-p 0 keeps no token) starts one step above it.
        lo = knob.lo + (knob.step if knob.lo_open else 0)
        if knob.decimals:
            decimal_box = QDoubleSpinBox()
            decimal_box.setDecimals(knob.decimals)
            decimal_box.setSingleStep(knob.step)
            decimal_box.setRange(lo, knob.hi)
            self.box: QSpinBox | QDoubleSpinBox = decimal_box
        else:
            self.box = QSpinBox()
            self.box.setRange(int(lo), int(knob.hi))  # a knob without decimals has whole bounds
        self.box.setFixedWidth(78)
        self.box.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.box.setButtonSymbols(QAbstractSpinBox.ButtonSymbols.NoButtons)
        self.box.setKeyboardTracking(False)  # typing "0.7" does not pass through 0 on the way
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(round(knob.slider_lo * self.scale), round(knob.ui_hi * self.scale))
        self.slider.setPageStep(max(1, (self.slider.maximum() - self.slider.minimum()) // 10))
        for w in (self.label, self.box, self.slider):
            w.setToolTip(knob.tip)
        self.box.setAccessibleName(knob.label)
        self.slider.setAccessibleName(f"{knob.label} slider")
        self.label.setBuddy(self.box)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.label)
        top.addStretch(1)
        top.addWidget(self.note)
        top.addWidget(self.box)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 2, 0, 2)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.slider)
        self.slider.valueChanged.connect(self._from_slider)
        self.box.valueChanged.connect(self._from_box)

    def _from_slider(self, position: int) -> None:
        value = position / self.scale
        common.set_spin_value(
            self.box, round(value, self.knob.decimals) if self.knob.decimals else round(value)
        )

    def _from_box(self, _value: float) -> None:
        self._sync_slider()
        self.changed.emit()

    def _sync_slider(self) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(round(self.box.value() * self.scale))
        self.slider.blockSignals(False)
        self._update_note()

    def _update_note(self) -> None:
        off = self.knob.off is not None and abs(self.value() - self.knob.off) < 1e-9
        self.note.setText(("greedy" if self.knob.key == "temperature" else "off") if off else "")

    def value(self) -> float | int:
        v = self.box.value()
        return round(float(v), self.knob.decimals) if self.knob.decimals else int(v)

    def set_value(self, value: float) -> None:
        """Set without emitting ``changed``."""
        self.box.blockSignals(True)
        common.set_spin_value(self.box, value)
        self.box.blockSignals(False)
        self._sync_slider()


class SamplingPanel(QFrame):
    """A view over ``state`` (its own when none is given). Signals:
    values_changed(dict): any value changed (by the user, a preset, Reset, ``set_values`` or the
    state itself, as a reply's fresh seed).
    presets_changed(dict): the user presets (name → values) after a save or delete.
    collapsed_changed(bool): the panel was folded or unfolded.
    """

    values_changed = Signal(dict)
    presets_changed = Signal(dict)
    collapsed_changed = Signal(bool)

    def __init__(self, state: SamplingState | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state if state is not None else SamplingState()
        self.setObjectName("SamplingPanel")
        self.setAccessibleName("Sampling settings")
        self.setMinimumWidth(EXPANDED_MIN_WIDTH)
        self._user_presets: dict[str, dict] = {}
        self._quiet = False
        self._last_emitted: dict | None = None

        self.title = QLabel("Parameters")
        self.title.setObjectName("PanelTitle")
        self.collapse_btn = common.flat_button("chevron-right", "Hide the parameters panel")
        self.collapse_btn.clicked.connect(lambda: self.set_collapsed(not self.is_collapsed()))
        header = QHBoxLayout()
        header.setContentsMargins(14, 10, 8, 6)
        header.addWidget(self.title)
        header.addStretch(1)
        header.addWidget(self.collapse_btn)

        self.body = QWidget()
        self.body.setObjectName("PanelBody")
        col = QVBoxLayout(self.body)
        col.setContentsMargins(14, 4, 14, 14)
        col.setSpacing(6)
        col.addWidget(self._section("PRESET"))
        col.addLayout(self._build_presets())
        col.addSpacing(8)
        col.addWidget(self._section("SYSTEM PROMPT"))
        self.system_edit = QPlainTextEdit()
        self.system_edit.setObjectName("Field")
        self.system_edit.setAccessibleName("System prompt")
        self.system_edit.setPlaceholderText("Optional instructions, merged into your first message")
        self.system_edit.setToolTip(
            "nanochat has no system role: this text is put before your first message, as nanochat does."
        )
        self.system_edit.setFixedHeight(84)
        self.system_edit.setTabChangesFocus(True)
        col.addWidget(self.system_edit)
        col.addSpacing(8)
        col.addWidget(self._section("SAMPLING"))
        self.rows: dict[str, _KnobRow] = {}
        for knob in PANEL_KNOBS:
            if knob.key == "max_tokens":
                col.addSpacing(8)
                col.addWidget(self._section("LENGTH"))
            row = _KnobRow(knob)
            row.changed.connect(lambda key=knob.key: self._send({key: self.rows[key].value()}))
            self.rows[knob.key] = row
            col.addWidget(row)
        col.addSpacing(8)
        col.addWidget(self._section("SEED"))
        col.addLayout(self._build_seed())
        col.addSpacing(8)
        col.addWidget(self._section("SPEED"))
        self.speculative = SpeculativeBox()
        col.addWidget(self.speculative)
        col.addSpacing(12)
        self.reset_btn = QPushButton("Reset to defaults")
        self.reset_btn.setToolTip("Restore nanochat's default sampling values (keeps your presets)")
        self.reset_btn.setAccessibleName("Reset to defaults")
        self.reset_btn.clicked.connect(self.reset)
        col.addWidget(self.reset_btn)
        col.addStretch(1)

        self.scroll_area = QScrollArea()
        self.scroll_area.setObjectName("PanelScroll")
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll_area.setWidget(self.body)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        outer.addLayout(header)
        outer.addWidget(self.scroll_area, 1)
        self._filler = QWidget()  # keeps the header at the top while the panel is folded
        self._filler.hide()
        outer.addWidget(self._filler, 1)

        self.system_edit.textChanged.connect(
            lambda: self._send({"system_prompt": self.system_edit.toPlainText()})
        )
        self._refresh_presets()
        self.state.events.changed.connect(self._render)
        self._render(self.state.values())

    @staticmethod
    def _section(text: str) -> QLabel:
        label = QLabel(text)
        label.setObjectName("SectionTitle")
        return label

    def _build_presets(self) -> QHBoxLayout:
        self.preset_box = QComboBox()
        self.preset_box.setAccessibleName("Preset")
        self.preset_box.setToolTip("Apply a set of sampling values")
        self.preset_box.setPlaceholderText("Custom")
        self.preset_box.activated.connect(self._on_preset_activated)
        self.save_preset_btn = common.flat_button("plus", "Save the current values as a preset…")
        self.save_preset_btn.clicked.connect(self._ask_preset_name)
        self.delete_preset_btn = common.flat_button("close", "Delete this preset")
        self.delete_preset_btn.clicked.connect(self._delete_current_preset)
        row = QHBoxLayout()
        row.setSpacing(4)
        row.addWidget(self.preset_box, 1)
        row.addWidget(self.save_preset_btn)
        row.addWidget(self.delete_preset_btn)
        return row

    def _build_seed(self) -> QHBoxLayout:
        self.seed_box = QSpinBox()
        self.seed_box.setRange(0, SEED_MAX)
        self.seed_box.setButtonSymbols(QAbstractSpinBox.ButtonSymbols.NoButtons)
        self.seed_box.setAccessibleName("Seed")
        self.seed_box.setToolTip("The random seed: the same seed, prompt and settings give the same reply.")
        self.lock_btn = QToolButton()
        self.lock_btn.setObjectName("Flat")
        self.lock_btn.setCheckable(True)
        self.lock_btn.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.lock_btn.setIconSize(QSize(16, 16))
        self.lock_btn.setAccessibleName("Lock seed")
        self.lock_btn.setToolTip(
            "Locked: every reply uses this seed.\nUnlocked: a new random seed for each reply."
        )
        self.random_btn = common.flat_button("dice", "Pick a new random seed")
        self.seed_box.valueChanged.connect(lambda seed: self._send({"seed": seed}))
        self.lock_btn.toggled.connect(lambda locked: self._send({"seed_locked": locked}))
        self.random_btn.clicked.connect(lambda: self.state.new_seed())
        row = QHBoxLayout()
        row.setSpacing(4)
        row.addWidget(self.seed_box, 1)
        row.addWidget(self.lock_btn)
        row.addWidget(self.random_btn)
        return row

    # ----- values ----------------------------------------------------------------------------

    def values(self) -> dict:
        return self.state.values()

    def set_values(self, values: dict) -> None:
        """Show ``values`` (missing keys keep their value); emits values_changed once if any changed."""
        self.state.update(values)

    def reset(self) -> None:
        self.set_values({k: v for k, v in DEFAULTS.items() if k != "system_prompt"})

    def set_ignored(self, keys: Collection[str], why: str = "") -> None:
        """Grey out the knobs the current model ignores (a served model that refuses top-k)."""
        for key, row in self.rows.items():
            ignored = key in keys
            row.setEnabled(not ignored)
            row.setToolTip(f"Ignored by this model: {why}" if ignored and why else "")

    def _update_lock_look(self) -> None:
        locked = self.lock_btn.isChecked()
        self.lock_btn.setText("Locked" if locked else "Random")
        self.lock_btn.setProperty("icon_name", "lock" if locked else "unlock")
        self.lock_btn.setIcon(icons.icon("lock" if locked else "unlock", theme.colors().muted))

    def _send(self, values: dict) -> None:
        """A widget the user changed: the state takes the value (and re-renders the panel)."""
        if not self._quiet:
            self.state.update(values)

    def _render(self, values: dict) -> None:
        """Show the state's values; the widgets' own signals are held so nothing echoes back."""
        self._quiet = True
        for key, row in self.rows.items():
            row.set_value(values[key])
        self.seed_box.setValue(min(int(values["seed"]), SEED_MAX))
        self.lock_btn.setChecked(bool(values["seed_locked"]))
        if values["system_prompt"] != self.system_edit.toPlainText():
            self.system_edit.setPlainText(values["system_prompt"])
        self._quiet = False
        self._update_lock_look()
        self._sync_preset_box()
        if values != self._last_emitted:
            self._last_emitted = values
            self.values_changed.emit(dict(values))

    # ----- presets ---------------------------------------------------------------------------

    def set_user_presets(self, presets: dict) -> None:
        """The saved user presets (name → values); does not emit presets_changed."""
        self._user_presets = {name: dict(values) for name, values in presets.items()}
        self._refresh_presets()

    def user_presets(self) -> dict:
        return {name: dict(values) for name, values in self._user_presets.items()}

    def apply_preset(self, name: str) -> bool:
        """Apply a built-in or user preset by name; False if there is none by that name."""
        values = BUILTIN_PRESETS.get(name) or self._user_presets.get(name)
        if values is None:
            return False
        self.set_values(values)
        return True

    def save_preset(self, name: str) -> None:
        """Save the current values (not the system prompt) as user preset ``name``."""
        name = name.strip()
        if not name:
            return
        if name in BUILTIN_PRESETS:
            name = f"{name} (mine)"
        self._user_presets[name] = {k: v for k, v in self.values().items() if k != "system_prompt"}
        self._refresh_presets()
        self.presets_changed.emit(self.user_presets())

    def delete_preset(self, name: str) -> None:
        if self._user_presets.pop(name, None) is not None:
            self._refresh_presets()
            self.presets_changed.emit(self.user_presets())

    def _refresh_presets(self) -> None:
        self.preset_box.blockSignals(True)
        self.preset_box.clear()
        for name in BUILTIN_PRESETS:
            self.preset_box.addItem(name, name)
            self.preset_box.setItemData(
                self.preset_box.count() - 1, _describe(BUILTIN_PRESETS[name]), Qt.ItemDataRole.ToolTipRole
            )
        if self._user_presets:
            self.preset_box.insertSeparator(self.preset_box.count())
        for name in sorted(self._user_presets, key=str.lower):
            self.preset_box.addItem(name, name)
            self.preset_box.setItemData(
                self.preset_box.count() - 1, _describe(self._user_presets[name]), Qt.ItemDataRole.ToolTipRole
            )
        self.preset_box.blockSignals(False)
        self._sync_preset_box()

    def _sync_preset_box(self) -> None:
        """Show the preset the current values match, or "Custom"."""
        current = self.values()
        match = -1
        for i in range(self.preset_box.count()):
            name = self.preset_box.itemData(i)
            values = BUILTIN_PRESETS.get(name) or self._user_presets.get(name)
            if values and all(
                abs(float(values[k]) - float(current[k])) < 1e-9 for k in FILTER_KEYS if k in values
            ):
                match = i
                break
        self.preset_box.setCurrentIndex(match)
        self.delete_preset_btn.setEnabled(self.preset_box.currentData() in self._user_presets)

    def _on_preset_activated(self, index: int) -> None:
        self.apply_preset(self.preset_box.itemData(index))

    def _ask_preset_name(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Name for these sampling values:")
        if ok:
            self.save_preset(name)

    def _delete_current_preset(self) -> None:
        name = self.preset_box.currentData()
        if name in self._user_presets:
            self.delete_preset(name)

    # ----- folding ---------------------------------------------------------------------------

    def is_collapsed(self) -> bool:
        return self.scroll_area.isHidden()

    def set_collapsed(self, collapsed: bool) -> None:
        """Fold to a thin strip holding only the unfold button (or unfold)."""
        if collapsed == self.is_collapsed():
            return
        self.scroll_area.setVisible(not collapsed)
        self.title.setVisible(not collapsed)
        self._filler.setVisible(collapsed)
        self.setMinimumWidth(COLLAPSED_WIDTH if collapsed else EXPANDED_MIN_WIDTH)
        self.setMaximumWidth(COLLAPSED_WIDTH if collapsed else 16777215)
        icon = "chevron-left" if collapsed else "chevron-right"
        self.collapse_btn.setProperty("icon_name", icon)
        self.collapse_btn.setIcon(icons.icon(icon, theme.colors().muted))
        tip = "Show the parameters panel" if collapsed else "Hide the parameters panel"
        self.collapse_btn.setToolTip(tip)
        self.collapse_btn.setAccessibleName(tip)
        self.collapsed_changed.emit(collapsed)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            common.retint_flat_buttons(self)


def _describe(values: dict) -> str:
    if values.get("temperature") == 0:
        return "Greedy: always the most likely token"
    return ", ".join(f"{k.replace('_', ' ')} {values[k]:g}" for k in FILTER_KEYS if k in values)
