"""The sampling panel: sliders with numeric boxes, seed lock, presets, system prompt."""

from __future__ import annotations

import random
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
)


@dataclass(frozen=True)
class Knob:
    key: str
    label: str
    lo: float
    hi: float
    step: float
    decimals: int
    tip: str


KNOBS = (
    Knob(
        "temperature",
        "Temperature",
        0.0,
        2.0,
        0.05,
        2,
        "Randomness. 0 always picks the most likely token (greedy); higher values flatten the distribution.",
    ),
    Knob("top_k", "Top-k", 0, 200, 1, 0, "Sample only among the k most likely tokens. 0 turns it off."),
    Knob(
        "top_p",
        "Top-p",
        0.05,
        1.0,
        0.01,
        2,
        "Nucleus sampling: keep the smallest set of tokens whose probability adds up to p. 1 turns it off.",
    ),
    Knob(
        "min_p",
        "Min-p",
        0.0,
        0.99,
        0.01,
        2,
        "Drop tokens less likely than min-p times the top token's probability. 0 turns it off.",
    ),
    Knob(
        "repetition_penalty",
        "Repetition penalty",
        1.0,
        2.0,
        0.01,
        2,
        "Make tokens that already appeared less likely. 1 turns it off.",
    ),
    Knob("max_tokens", "Max tokens", 1, 4096, 1, 0, "The longest reply, in tokens."),
)

BUILTIN_PRESETS: dict[str, dict] = {
    "Greedy": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0},
    "Balanced": {"temperature": 0.8, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0},
    "Creative": {"temperature": 1.2, "top_k": 0, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1},
}
DEFAULTS = {
    "temperature": 0.8,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "max_tokens": 512,
    "seed": 42,
    "seed_locked": True,
    "system_prompt": "",
}


class _KnobRow:
    """A slider and a spin box kept in sync; the spin box holds the true value."""

    def __init__(self, knob: Knob, on_change) -> None:
        self.knob = knob
        self.scale = 1 / knob.step
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(round(knob.lo * self.scale), round(knob.hi * self.scale))
        if knob.decimals:
            self.box = QDoubleSpinBox()
            self.box.setDecimals(knob.decimals)
            self.box.setSingleStep(knob.step)
        else:
            self.box = QSpinBox()
        self.box.setRange(knob.lo, knob.hi)
        self.box.setFixedWidth(76)
        self.label = QLabel(knob.label)
        self.note = QLabel()
        self.note.setObjectName("Muted")
        for w in (self.slider, self.box, self.label):
            w.setToolTip(knob.tip)
        self.slider.setAccessibleName(f"{knob.label} slider")
        self.box.setAccessibleName(knob.label)
        self.slider.valueChanged.connect(lambda v: self.box.setValue(v / self.scale if knob.decimals else v))
        self.box.valueChanged.connect(self._from_box)
        self._on_change = on_change

    def _from_box(self, value: float) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(round(value * self.scale))
        self.slider.blockSignals(False)
        self._update_note()
        self._on_change()

    def _update_note(self) -> None:
        v = self.value()
        off = {
            "temperature": v == 0,
            "top_k": v == 0,
            "top_p": v >= 1,
            "min_p": v == 0,
            "repetition_penalty": v == 1,
        }.get(self.knob.key, False)
        self.note.setText(("greedy" if self.knob.key == "temperature" else "off") if off else "")

    def value(self) -> float | int:
        v = self.box.value()
        return round(v, self.knob.decimals) if self.knob.decimals else int(v)

    def set_value(self, v: float) -> None:
        self.box.setValue(v)
        self._update_note()


class SamplingPanel(QFrame):
    """Signals: values_changed(dict), presets_changed(dict)."""

    values_changed = Signal(dict)
    presets_changed = Signal(dict)

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("SamplingPanel")
        self.setMinimumWidth(260)
        self.setAccessibleName("Sampling settings")
        self._user_presets: dict[str, dict] = {}
        self._loading = False
        col = QVBoxLayout(self)
        col.setContentsMargins(14, 12, 14, 12)
        title = QLabel("Sampling")
        title.setObjectName("SectionTitle")
        col.addWidget(title)

        presets = QHBoxLayout()
        self.preset_box = QComboBox()
        self.preset_box.setAccessibleName("Sampling preset")
        self.preset_box.setToolTip("Apply a saved set of sampling values")
        self.save_preset_btn = QToolButton()
        self.save_preset_btn.setText("Save…")
        self.save_preset_btn.setToolTip("Save the current values as a preset")
        self.delete_preset_btn = QToolButton()
        self.delete_preset_btn.setText("Delete")
        self.delete_preset_btn.setToolTip("Delete the selected user preset")
        presets.addWidget(self.preset_box, 1)
        presets.addWidget(self.save_preset_btn)
        presets.addWidget(self.delete_preset_btn)
        col.addLayout(presets)

        grid = QGridLayout()
        grid.setVerticalSpacing(4)
        self.rows: dict[str, _KnobRow] = {}
        for i, knob in enumerate(KNOBS):
            row = _KnobRow(knob, self._changed)
            self.rows[knob.key] = row
            grid.addWidget(row.label, 2 * i, 0)
            grid.addWidget(row.note, 2 * i, 1, Qt.AlignmentFlag.AlignRight)
            grid.addWidget(row.box, 2 * i, 2)
            grid.addWidget(row.slider, 2 * i + 1, 0, 1, 3)
        col.addLayout(grid)

        seed_row = QHBoxLayout()
        seed_label = QLabel("Seed")
        seed_label.setToolTip(
            "The random seed. With the lock on, every reply uses it: same prompt, same output."
        )
        self.seed_box = QSpinBox()
        self.seed_box.setRange(0, 2**31 - 1)
        self.seed_box.setAccessibleName("Seed")
        self.seed_box.setToolTip(seed_label.toolTip())
        self.lock_btn = QToolButton()
        self.lock_btn.setCheckable(True)
        self.lock_btn.setToolTip("Locked: reuse this seed. Unlocked: a new random seed for every reply.")
        self.lock_btn.setAccessibleName("Lock seed")
        self.random_btn = QToolButton()
        self.random_btn.setText("Random")
        self.random_btn.setToolTip("Pick a random seed")
        self.random_btn.setAccessibleName("Randomise seed")
        seed_row.addWidget(seed_label)
        seed_row.addWidget(self.seed_box, 1)
        seed_row.addWidget(self.lock_btn)
        seed_row.addWidget(self.random_btn)
        col.addLayout(seed_row)

        sys_label = QLabel("System prompt")
        sys_label.setToolTip("Merged into your first message, as nanochat does.")
        self.system_edit = QPlainTextEdit()
        self.system_edit.setAccessibleName("System prompt")
        self.system_edit.setPlaceholderText("Optional instructions for the model")
        self.system_edit.setMaximumHeight(90)
        col.addWidget(sys_label)
        col.addWidget(self.system_edit)
        self.reset_btn = QPushButton("Reset to defaults")
        self.reset_btn.setToolTip("Restore the default sampling values")
        col.addWidget(self.reset_btn)
        col.addStretch(1)

        self.seed_box.valueChanged.connect(self._changed)
        self.lock_btn.toggled.connect(self._on_lock)
        self.random_btn.clicked.connect(lambda: self.seed_box.setValue(random.randrange(2**31 - 1)))
        self.system_edit.textChanged.connect(self._changed)
        self.reset_btn.clicked.connect(lambda: self.set_values(DEFAULTS))
        self.preset_box.activated.connect(self._apply_preset)
        self.save_preset_btn.clicked.connect(self._save_preset)
        self.delete_preset_btn.clicked.connect(self._delete_preset)
        self._refresh_presets()
        self.set_values(DEFAULTS)

    # ----- values ------------------------------------------------------------------------

    def values(self) -> dict:
        out: dict = {k: row.value() for k, row in self.rows.items()}
        out.update(
            seed=self.seed_box.value(),
            seed_locked=self.lock_btn.isChecked(),
            system_prompt=self.system_edit.toPlainText(),
        )
        return out

    def set_values(self, values: dict) -> None:
        self._loading = True
        for k, row in self.rows.items():
            if k in values:
                row.set_value(values[k])
        if "seed" in values:
            self.seed_box.setValue(int(values["seed"]))
        if "seed_locked" in values:
            self.lock_btn.setChecked(bool(values["seed_locked"]))
            self._on_lock(bool(values["seed_locked"]))
        if "system_prompt" in values and values["system_prompt"] != self.system_edit.toPlainText():
            self.system_edit.setPlainText(values["system_prompt"])
        self._loading = False
        self._changed()

    def next_seed(self) -> int:
        """The seed for the next reply: the locked one, or a fresh random one (shown in the box)."""
        if not self.lock_btn.isChecked():
            self.seed_box.setValue(random.randrange(2**31 - 1))
        return self.seed_box.value()

    def _on_lock(self, locked: bool) -> None:
        self.lock_btn.setText("Locked" if locked else "Unlocked")
        self._changed()

    def _changed(self) -> None:
        if not self._loading:
            self.values_changed.emit(self.values())

    # ----- presets -----------------------------------------------------------------------

    def set_user_presets(self, presets: dict) -> None:
        self._user_presets = dict(presets)
        self._refresh_presets()

    def _refresh_presets(self) -> None:
        self.preset_box.clear()
        self.preset_box.addItem("Presets…")
        for name in BUILTIN_PRESETS:
            self.preset_box.addItem(name)
        for name in sorted(self._user_presets):
            self.preset_box.addItem(f"★ {name}", name)

    def _preset_values(self, index: int) -> dict | None:
        name = self.preset_box.itemText(index)
        if name in BUILTIN_PRESETS:
            return BUILTIN_PRESETS[name]
        user = self.preset_box.itemData(index)
        return self._user_presets.get(user) if user else None

    def _apply_preset(self, index: int) -> None:
        values = self._preset_values(index)
        if values:
            self.set_values(values)

    def apply_preset(self, name: str) -> None:
        index = self.preset_box.findText(name)
        if index < 0:
            index = self.preset_box.findData(name)
        if index >= 0:
            self.preset_box.setCurrentIndex(index)
            self._apply_preset(index)

    def save_preset(self, name: str) -> None:
        values = {k: v for k, v in self.values().items() if k != "system_prompt"}
        self._user_presets[name] = values
        self._refresh_presets()
        self.presets_changed.emit(dict(self._user_presets))

    def _save_preset(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Preset name:")
        if ok and name.strip():
            self.save_preset(name.strip())

    def _delete_preset(self) -> None:
        user = self.preset_box.currentData()
        if user in self._user_presets:
            del self._user_presets[user]
            self._refresh_presets()
            self.presets_changed.emit(dict(self._user_presets))
