"""The checkpoint bar: Source / Tag / Step, precision, Load, Open folder…, a summary and load progress.

The summary (era, parameters, stored dtype, context, memory needed) is shown *before* loading,
so a user sees that a 1.9B checkpoint needs 8 GB before pressing Load.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QWidget,
)

from desktop.engine.discovery import source_of
from desktop.qt.widgets import common, icons, theme

PRECISIONS = (
    ("Auto", "auto"),
    ("Exact · fp32", "float32"),
    ("Fast · 16-bit", "fast"),
    ("Int8 · CPU", "int8"),
)
LOOKING = "Looking for checkpoints…"  # until the first folder scan answers
NONE_FOUND = "No checkpoints found: use Open folder… or train one with nanochat"
CHOOSE = "Choose a checkpoint"
FOLLOW = -1  # the Step list's "Latest": the newest saved step, followed as the run trains
FOLLOW_TEXT = "Latest (follows)"
FOLLOW_TIP = (
    "The newest saved step; as the run trains, each new step is announced and answers the next "
    "reply (a reply streaming finishes with its own step)"
)
MODEL_BUTTON_TEXT_PX = 220  # longer names are elided in the middle (the tooltip has the path)
SOURCE_NAMES = {"base": "Base", "mid": "Mid", "sft": "SFT", "rl": "RL", "folder": "Folder", "demo": "Demo"}


def human_params(n: int) -> str:
    """561_000_000 → "561M", 1_880_000_000 → "1.9B", 85_000 → "85K"."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value >= 100 else f"{value:.1f}".removesuffix(".0") + unit
    return str(n)


def human_bytes(n: float) -> str:
    """Binary units, one decimal from KB up: 1_288_490_188 → "1.2 GB"."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_summary(info: dict) -> str:
    """One line: "E7 · 561M params · stored bfloat16 · 2048 ctx · ≈1.2 GB on cuda"."""
    parts = [str(info.get("era", "?")), f"{human_params(int(info.get('params', 0)))} params"]
    if info.get("dtype"):
        parts.append(f"stored {info['dtype']}")
    if info.get("sequence_len"):
        parts.append(f"{info['sequence_len']} ctx")
    memory = f"≈{human_bytes(info['memory_bytes'])}" if info.get("memory_bytes") else ""
    if memory:
        parts.append(f"{memory} on {info['device']}" if info.get("device") else f"{memory} to run")
    elif info.get("device"):
        parts.append(str(info["device"]))
    return "  ·  ".join(parts)


def fill_steps(combo: QComboBox, entry, shown: int | None = None, follow: bool = False) -> None:
    """A checkpoint's Step list: "Latest · follows the run" (a run with steps on disk), then its
    saved steps newest first, among them those still saving or never finished, greyed, with why.
    Shows "Latest" when ``follow``, else ``shown`` (added when the list lacks it: a step opened
    from the Run tab), else the newest saved step."""
    combo.clear()
    steps = list(entry.steps) if entry is not None else []
    if entry is not None and entry.source not in ("remote", "hf", "demo") and steps:
        combo.addItem(FOLLOW_TEXT, FOLLOW)
        combo.setItemData(0, FOLLOW_TIP, Qt.ItemDataRole.ToolTipRole)
    unsaved = {s.step: s for s in getattr(entry, "unsaved", ()) if s.step != shown}
    listed = set(steps) | set(unsaved) | ({shown} if shown is not None else set())
    for step in sorted(listed, reverse=True):
        if step in unsaved:
            combo.addItem(unsaved[step].label(), None)
            index = combo.count() - 1
            combo.setItemData(index, unsaved[step].reason, Qt.ItemDataRole.ToolTipRole)
            item = combo.model().item(index)  # type: ignore[attr-defined]  # a QStandardItemModel
            item.setEnabled(False)
        else:
            latest = bool(steps) and step == steps[-1] and len(steps) > 1
            combo.addItem(f"step {step:,}" + ("  (latest)" if latest else ""), step)
    want = FOLLOW if follow and steps else shown
    index = combo.findData(want) if want is not None else -1
    if index < 0:  # the newest saved step
        index = next((i for i in range(combo.count()) if combo.itemData(i) not in (None, FOLLOW)), 0)
    combo.setCurrentIndex(index)


def entry_name(entry) -> str:
    """A checkpoint as ``ModelInfo.name`` and the exports call it: "sft/d20" (nanochat's phase
    folder, then the tag), an opened folder by its own name, a served model by its label."""
    if entry.source == "remote":
        return str(entry.tag)
    phase = source_of(Path(entry.path))
    return f"{phase}/{entry.tag}" if phase else str(entry.tag)


class CheckpointPicker(QFrame):
    """Signals: selection_changed(Path, int step), load_requested(Path, int step),
    folder_chosen(Path), precision_changed(str: one of engine.device.PRECISIONS),
    picker_requested() (the checkpoint button or Ctrl+K: the window opens the full picker).

    Entries have .source, .tag, .path and .steps (ascending). Programmatic changes
    (``set_entries``, ``select``) emit selection_changed once for the resulting selection."""

    selection_changed = Signal(Path, int)
    load_requested = Signal(Path, int)
    folder_chosen = Signal(Path)
    precision_changed = Signal(str)
    picker_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("PickerBar")
        self.setAccessibleName("Checkpoint picker")
        self.entries: list = []
        self._path: Path | None = None  # the checkpoint folder shown

        self.model_btn = QPushButton(CHOOSE)
        self.model_btn.setObjectName("ModelButton")
        self.model_btn.setAccessibleName("Checkpoint")
        self.model_btn.setToolTip("Pick a checkpoint from every one found (Ctrl+K)")
        self.model_btn.setIconSize(QSize(14, 14))
        self.model_btn.setLayoutDirection(Qt.LayoutDirection.RightToLeft)  # the chevron after the name
        self.model_btn.setMinimumWidth(90)
        self.model_btn.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.model_btn.clicked.connect(self.picker_requested)
        self.step = QComboBox()
        self.step.setAccessibleName("Step")
        self.step.setToolTip("Training step of the checkpoint (newest first)")
        self.step.setMinimumWidth(100)
        self.step.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.precision = QComboBox()
        self.precision.setAccessibleName("Precision")
        for label, value in PRECISIONS:
            self.precision.addItem(label, value)
        self.precision.setToolTip(
            "Exact: float32, the same tokens as nanochat's Engine.\n"
            "Fast: 16-bit weights: bfloat16 on GPUs; on CPUs float16 weights with float32\n"
            "activations (next-token KL ~1e-7). Close, not identical, numbers.\n"
            "Int8 (CPU): 8-bit weights: faster still, visibly lossy.\n"
            "On a CPU the fastest kernel for each is timed on first use and remembered.\n"
            "Auto: bfloat16 on recent NVIDIA GPUs, float32 elsewhere (as nanochat)."
        )
        self.load_btn = QPushButton("Load")
        self.load_btn.setObjectName("Primary")
        self.load_btn.setToolTip("Load the selected checkpoint")
        self.load_btn.setAccessibleName("Load checkpoint")
        self.open_btn = QPushButton("Open folder…")
        self.open_btn.setIconSize(QSize(16, 16))
        self.open_btn.setToolTip("Pick any folder holding model_<step>.pt and meta_<step>.json")
        self.open_btn.setAccessibleName("Open checkpoint folder")

        self.summary = common.ElidedLabel(LOOKING)
        self.summary.setObjectName("Summary")
        self.summary.setAccessibleName("Checkpoint summary")
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.progress_label = QLabel()
        self.progress_label.setObjectName("Muted")
        self.progress = QProgressBar()
        self.progress.setFixedWidth(140)
        self.progress.setTextVisible(False)
        self.progress.setAccessibleName("Load progress")
        self.progress.hide()

        icon_label = QLabel()
        icon_label.setPixmap(icons.avatar("assistant", theme.is_dark(), 22))
        self._icon_label = icon_label
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 8, 12, 8)
        row.setSpacing(6)
        for w in (icon_label, self.model_btn, self.step):
            row.addWidget(w)
        row.addSpacing(6)
        row.addWidget(self.precision)
        row.addWidget(self.load_btn)
        row.addSpacing(10)
        row.addWidget(self.summary, 1)
        row.addWidget(self.progress_label)
        row.addWidget(self.progress)
        row.addSpacing(6)
        row.addWidget(self.open_btn)

        self.step.currentIndexChanged.connect(self._emit_selection)
        self.load_btn.clicked.connect(self._load)
        self.precision.activated.connect(lambda _i: self.precision_changed.emit(self.precision.currentData()))
        self.open_btn.clicked.connect(self.open_folder_dialog)
        self._refresh_icons()
        self._update_enabled(scanned=False)

    # ----- entries and selection -------------------------------------------------------------

    def set_entries(self, entries: list) -> None:
        """Replace the list; the previous selection is kept when it still exists."""
        previous, follow = self.current(), self.following()
        self.entries = list(entries)
        if self._entry() is None:  # the folder shown is gone: show the first one
            self._path = Path(self.entries[0].path) if self.entries else None
        self._fill_steps(emit=False)
        if previous is None or not self.select(previous[0], FOLLOW if follow else previous[1]):
            self._emit_selection()
        self._update_enabled(scanned=True)

    def _entry(self):
        return next((e for e in self.entries if Path(e.path) == self._path), None)

    def _fill_steps(self, emit: bool = True) -> None:
        entry = self._entry()
        name = entry_name(entry) if entry else CHOOSE
        elide = Qt.TextElideMode.ElideMiddle  # a long run name keeps its start and its end
        self.model_btn.setText(self.model_btn.fontMetrics().elidedText(name, elide, MODEL_BUTTON_TEXT_PX))
        self.model_btn.setToolTip(
            f"{entry.path}\nPick another checkpoint (Ctrl+K)" if entry else "Pick a checkpoint (Ctrl+K)"
        )
        self.step.blockSignals(True)
        fill_steps(self.step, entry)
        self.step.blockSignals(False)
        if emit:
            self._emit_selection()

    def _emit_selection(self) -> None:
        cur = self.current()
        if cur is not None:
            self.selection_changed.emit(*cur)

    def current(self) -> tuple[Path, int] | None:
        """The folder and step chosen ("Latest": the newest saved step)."""
        entry, step = self._entry(), self.step.currentData()
        if entry is None or step is None or not entry.steps:
            return None
        return Path(entry.path), int(entry.steps[-1] if step == FOLLOW else step)

    def following(self) -> bool:
        """Whether "Latest · follows the run" is chosen."""
        return self.step.currentData() == FOLLOW

    def select(self, path: Path, step: int) -> bool:
        """Show ``path`` at ``step`` (FOLLOW: "Latest"); False when no entry has that path."""
        entry = next((e for e in self.entries if Path(e.path) == Path(path)), None)
        if entry is None:
            return False
        if Path(entry.path) != self._path:
            self._path = Path(entry.path)
            self._fill_steps(emit=False)
        index = self.step.findData(step)
        self.step.blockSignals(True)  # one selection_changed, for the step asked for
        if index >= 0:
            self.step.setCurrentIndex(index)
        self.step.blockSignals(False)
        self._emit_selection()
        return True

    def set_precision(self, dtype: str) -> None:
        self.precision.setCurrentIndex(max(0, self.precision.findData(dtype)))

    def open_popup(self) -> None:
        """Ctrl+K: ask for the full picker."""
        self.picker_requested.emit()

    # ----- summary and progress ----------------------------------------------------------------

    def set_summary(self, info: dict | None) -> None:
        """Keys: era, params, dtype (stored), sequence_len, memory_bytes, device; or error."""
        error = (info or {}).get("error")
        self.summary.setProperty("error", bool(error))
        theme.repolish(self.summary)
        if not info:
            self.summary.setText("No checkpoint selected")
        elif error:
            self.summary.setText(f"⚠ {error}")
        else:
            self.summary.setText(format_summary(info))
            self.summary.setToolTip(
                "Read from the checkpoint's meta and tensor shapes, before loading.\n"
                "Memory is an estimate of the weights plus a full-context KV cache."
            )

    def set_progress(self, percent: int, message: str) -> None:
        """1–99: loading (bar and step shown, Load disabled); 100: done; 0: idle or failed."""
        loading = 0 < percent < 100
        self.progress.setValue(percent)
        self.progress.setVisible(loading)
        self.progress_label.setText(message if percent < 100 else "")
        self.progress_label.setVisible(percent < 100 and bool(message))
        self.load_btn.setEnabled(not loading and bool(self.entries))
        self.load_btn.setText("Loading…" if loading else "Load")

    def _update_enabled(self, scanned: bool) -> None:
        has = bool(self.entries)
        for w in (self.model_btn, self.step, self.load_btn):
            w.setEnabled(has)
        if not has:
            self.summary.setText(NONE_FOUND if scanned else LOOKING)
        elif self.summary.text() in (LOOKING, NONE_FOUND):
            self.summary.setText("Reading the checkpoint…")  # until its summary arrives

    def _load(self) -> None:
        cur = self.current()
        if cur is not None:
            self.load_requested.emit(*cur)

    def open_folder_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a checkpoint folder")
        if folder:
            self.folder_chosen.emit(Path(folder))

    def _refresh_icons(self) -> None:
        self.open_btn.setIcon(icons.icon("folder", theme.colors().text))
        self.model_btn.setIcon(icons.icon("chevron-down", theme.colors().muted))
        self._icon_label.setPixmap(icons.avatar("assistant", theme.is_dark(), 22))

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._refresh_icons()
