"""The checkpoint picker bar: source / tag / step, Open folder…, Load, and a summary before loading."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton

PRECISIONS = (("Auto", "auto"), ("Exact · fp32", "float32"), ("Fast · bf16", "bfloat16"))
SOURCE_NAMES = {"base": "base", "mid": "mid", "sft": "sft", "rl": "rl", "folder": "folder"}


def human_params(n: int) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "")
    return str(n)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


class CheckpointPicker(QFrame):
    """Signals: selection_changed(Path, int), load_requested(Path, int), folder_chosen(Path)."""

    selection_changed = Signal(Path, int)
    load_requested = Signal(Path, int)
    folder_chosen = Signal(Path)
    precision_changed = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("PickerBar")
        self.entries: list = []
        self.source = QComboBox()
        self.tag = QComboBox()
        self.step = QComboBox()
        for combo, name, tip in (
            (self.source, "Source", "Training phase: base, mid, sft or rl"),
            (self.tag, "Tag", "Model tag (e.g. d20)"),
            (self.step, "Step", "Checkpoint step"),
        ):
            combo.setAccessibleName(name)
            combo.setToolTip(tip)
            combo.setMinimumWidth(90)
        self.tag.setMinimumWidth(140)
        self.precision = QComboBox()
        self.precision.setAccessibleName("Precision")
        for label, value in PRECISIONS:
            self.precision.addItem(label, value)
        self.precision.setToolTip(
            "Exact: float32, the same tokens as nanochat's Engine.\n"
            "Fast: bfloat16 weights and compute; close, not identical, numbers.\n"
            "Auto: bfloat16 on recent NVIDIA GPUs, float32 elsewhere (as nanochat)."
        )
        self.open_btn = QPushButton("Open folder…")
        self.open_btn.setToolTip("Pick any folder holding model_*.pt and meta_*.json")
        self.load_btn = QPushButton("Load")
        self.load_btn.setObjectName("Primary")
        self.load_btn.setToolTip("Load the selected checkpoint")
        self.summary = QLabel("No checkpoint selected")
        self.summary.setObjectName("Muted")
        self.summary.setAccessibleName("Checkpoint summary")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(160)
        self.progress.setTextVisible(False)
        self.progress.hide()
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 8, 12, 8)
        for w in (
            QLabel("Checkpoint"),
            self.source,
            self.tag,
            self.step,
            self.precision,
            self.load_btn,
            self.open_btn,
        ):
            row.addWidget(w)
        row.addSpacing(12)
        row.addWidget(self.summary, 1)
        row.addWidget(self.progress)
        self.source.currentIndexChanged.connect(self._fill_tags)
        self.tag.currentIndexChanged.connect(self._fill_steps)
        self.step.currentIndexChanged.connect(self._emit_selection)
        self.load_btn.clicked.connect(self._load)
        self.precision.activated.connect(lambda _i: self.precision_changed.emit(self.precision.currentData()))
        self.open_btn.clicked.connect(self._open_folder)
        self._device = ""

    def set_entries(self, entries: list) -> None:
        previous = self.current()
        self.entries = list(entries)
        self.source.blockSignals(True)
        self.source.clear()
        for name in dict.fromkeys(e.source for e in self.entries):
            self.source.addItem(SOURCE_NAMES.get(name, name), name)
        self.source.blockSignals(False)
        self._fill_tags()
        if previous is not None:
            self.select(*previous)
        self.load_btn.setEnabled(bool(self.entries))

    def _entry(self):
        src, tag = self.source.currentData(), self.tag.currentData()
        return next((e for e in self.entries if e.source == src and str(e.path) == tag), None)

    def _fill_tags(self) -> None:
        src = self.source.currentData()
        self.tag.blockSignals(True)
        self.tag.clear()
        for e in self.entries:
            if e.source == src:
                self.tag.addItem(e.tag, str(e.path))
        self.tag.blockSignals(False)
        self._fill_steps()

    def _fill_steps(self) -> None:
        entry = self._entry()
        self.step.blockSignals(True)
        self.step.clear()
        for s in reversed(entry.steps if entry else []):
            self.step.addItem(str(s), s)
        self.step.blockSignals(False)
        self._emit_selection()

    def _emit_selection(self) -> None:
        cur = self.current()
        if cur is not None:
            self.selection_changed.emit(*cur)

    def current(self) -> tuple[Path, int] | None:
        entry, step = self._entry(), self.step.currentData()
        return (entry.path, int(step)) if entry is not None and step is not None else None

    def select(self, path: Path, step: int) -> None:
        entry = next((e for e in self.entries if Path(e.path) == Path(path)), None)
        if entry is None:
            return
        self.source.setCurrentIndex(self.source.findData(entry.source))
        self.tag.setCurrentIndex(self.tag.findData(str(entry.path)))
        index = self.step.findData(step)
        if index >= 0:
            self.step.setCurrentIndex(index)

    def set_precision(self, dtype: str) -> None:
        index = self.precision.findData(dtype)
        self.precision.setCurrentIndex(max(0, index))

    def open_popup(self) -> None:
        self.source.setFocus()
        self.source.showPopup()

    def set_summary(self, info: dict) -> None:
        if info.get("error"):
            self.summary.setText(f"⚠ {info['error']}")
            self.summary.setToolTip(info["error"])
            return
        mem = human_bytes(info.get("memory_bytes", 0))
        parts = [
            info.get("era", "?"),
            f"{human_params(info.get('params', 0))} params",
            f"stored {info.get('dtype', '?')}",
            f"ctx {info.get('sequence_len', '?')}",
            f"≈{mem} to run",
        ]
        if info.get("device"):
            parts.append(info["device"])
        self.summary.setText("  ·  ".join(parts))
        self.summary.setToolTip("Estimated from the meta and tensor shapes, before loading")

    def set_progress(self, percent: int, message: str) -> None:
        self.progress.setValue(percent)
        self.progress.setVisible(0 < percent < 100)
        self.load_btn.setEnabled(not 0 < percent < 100)
        self.progress.setToolTip(message)

    def _load(self) -> None:
        cur = self.current()
        if cur is not None:
            self.load_requested.emit(*cur)

    def _open_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a checkpoint folder")
        if folder:
            self.folder_chosen.emit(Path(folder))
