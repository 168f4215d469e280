"""The Compare page's two bars: the toolbar above the panes (add pane, sweeps, probabilities,
diff, scoring, save and export) and the shared sampling row under them."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFrame,
    QLabel,
    QMenu,
    QPushButton,
    QSpinBox,
    QWidget,
)

from desktop.engine.params import CHAT_DEFAULTS, SamplingParams
from desktop.qt.chat.message_widget import draft_label
from desktop.qt.widgets import common
from desktop.qt.widgets.sampling_panel import SEED_MAX
from desktop.qt.widgets.speculative_box import SELF_DRAFTS
from desktop.qt.widgets.token_view import ProbabilityLegend
from desktop.session.compare.analysis import LETTERS, MAX_PANES, DiffSpan
from desktop.session.sampling import draw_seed

SPEED_TIP = (
    "Speculative decoding in every pane that can: a draft proposes tokens, each pane's model checks\n"
    "them in one pass. Each reply keeps its model's distribution, but a seed repeats Nanoscope's own\n"
    "stream. The draft length is Chat's (Parameters › Speed).\n"
    "Own copy: each pane's int8 or 16-bit copy drafts for it.\n"
    "Pane X's checkpoint: that pane's checkpoint drafts for every other pane (it answers plainly).\n"
    "Each other pane's footer then says how much of the draft it kept: a live measure of how alike\n"
    "the two checkpoints are (they must share a tokenizer)."
)
PANE_DRAFT_TIP = (
    "Pane {letter}'s checkpoint drafts for every other pane; each footer's kept share is how often\n"
    "their model agrees with it"
)


def diff_marks(spans: list[DiffSpan]) -> tuple[dict[int, str], dict[int, str]]:
    """Per-token marks for pane A (its tokens B lacks: "delete") and pane B (A lacks: "insert")."""
    a_marks: dict[int, str] = {}
    b_marks: dict[int, str] = {}
    for span in spans:
        if span.tag in ("delete", "replace"):
            a_marks.update(dict.fromkeys(range(span.a_start, span.a_end), "delete"))
        if span.tag in ("insert", "replace"):
            b_marks.update(dict.fromkeys(range(span.b_start, span.b_end), "insert"))
    return a_marks, b_marks


class CompareToolbar(QFrame):
    """The buttons and menus above the panes; the page connects them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("CompareToolbar")
        self.add_btn = QPushButton("Add pane")
        self.add_btn.setToolTip(f"Add a pane (up to {MAX_PANES})")
        self.sweep_btn = QPushButton("Step sweep…")
        self.sweep_btn.setToolTip(
            "Panes for up to four evenly spaced steps of one checkpoint, the latest included"
        )
        self.sweep_menu = QMenu(self.sweep_btn)
        self.sweep_btn.setMenu(self.sweep_menu)
        self.temps_btn = QPushButton("Same checkpoint × temperatures")
        self.temps_btn.setToolTip(
            "Every pane on the first pane's checkpoint, at temperatures 0, 0.6, 1.0 and 1.4, same seed"
        )
        self.overlay_box = QCheckBox("Probabilities")
        self.overlay_box.setToolTip(
            "Colour each token by its probability; hover a token for the five most likely alternatives"
        )
        self.legend = ProbabilityLegend()
        self.legend.hide()
        self.diff_box = QCheckBox("Diff")
        self.diff_box.setToolTip("Mark the tokens that differ between two panes' replies")
        self.diff_a = QComboBox()
        self.diff_b = QComboBox()
        for combo, name in ((self.diff_a, "Diff from pane"), (self.diff_b, "Diff to pane")):
            combo.setAccessibleName(name)
            combo.setEnabled(False)
        self.vs_label = QLabel("vs")
        self.vs_label.setObjectName("Muted")
        self.same_btn = QPushButton("Same model?")
        self.same_btn.setToolTip(
            "Run a local checkpoint and a served model greedy on the prompt, same seed: where do\n"
            "they first differ, and how far apart are their probabilities until then?"
        )
        self.score_btn = QPushButton("Cross-score…")
        self.score_btn.setToolTip("Score one pane's reply under every pane's checkpoint (bits per byte)")
        self.score_menu = QMenu(self.score_btn)
        self.score_btn.setMenu(self.score_menu)
        self.save_btn = QPushButton("Save")
        self.save_btn.setToolTip("Save this comparison to history")
        self.export_btn = QPushButton("Export…")
        export_menu = QMenu(self.export_btn)
        self.export_md = QAction("Markdown…", self)
        self.export_json = QAction("JSON…", self)
        export_menu.addAction(self.export_md)
        export_menu.addAction(self.export_json)
        self.export_btn.setMenu(export_menu)

        # Groups that wrap as a whole onto a second row when the window is narrow.
        lay = common.FlowLayout(self, spacing=14)
        lay.setContentsMargins(12, 7, 12, 7)
        for group in (
            (self.add_btn, self.sweep_btn, self.temps_btn),
            (self.overlay_box, self.legend),
            (self.diff_box, self.diff_a, self.vs_label, self.diff_b),
            (self.score_btn, self.same_btn),
            (self.save_btn, self.export_btn),
        ):
            lay.addWidget(common.group(*group))


class SharedSampling(QFrame):
    """The sampling values every pane starts from, and the speculative decoding choice."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("CompareSampling")
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setDecimals(2)
        self.temperature.setToolTip("Temperature for every pane (0 = greedy)")
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setSpecialValueText("off")
        self.top_k.setToolTip("Top-k for every pane (0 = off)")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 8192)
        self.max_tokens.setToolTip("Longest reply, in tokens")
        self.seed = QSpinBox()
        self.seed.setRange(0, SEED_MAX)
        self.seed.setToolTip("Seed shared by every pane: same seed, same random draws")
        self.dice = common.flat_button("dice", "New random seed")
        self.speed = QComboBox()
        self.speed.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        for name, spec in SELF_DRAFTS:
            self.speed.addItem(name, spec)
        self.speed.setToolTip(SPEED_TIP)
        title = QLabel("Shared sampling")
        title.setObjectName("SectionTitle")
        lay = common.FlowLayout(self, spacing=12)
        lay.setContentsMargins(20, 6, 20, 0)
        lay.addWidget(title)
        for text, box in (
            ("Temperature", self.temperature),
            ("Top-k", self.top_k),
            ("Max tokens", self.max_tokens),
            ("Seed", self.seed),
            ("Speculative", self.speed),
        ):
            label = QLabel(text)
            label.setObjectName("Muted")
            label.setBuddy(box)
            box.setAccessibleName(f"Shared {text.lower()}")
            lay.addWidget(common.group(label, box, *((self.dice,) if box is self.seed else ())))
        self.set_values(CHAT_DEFAULTS.with_values(max_tokens=256).to_dict())

    def set_values(self, values: dict) -> None:
        """Pre-fill the row (keys as in settings' sampling)."""
        for key, box in (
            ("temperature", self.temperature),
            ("top_k", self.top_k),
            ("max_tokens", self.max_tokens),
            ("seed", self.seed),
        ):
            if values.get(key) is not None:
                box.setValue(values[key])

    def params(self) -> SamplingParams:
        """The shared sampling values every pane starts from."""
        return SamplingParams(
            temperature=round(self.temperature.value(), 2),
            top_k=self.top_k.value(),
            max_tokens=self.max_tokens.value(),
            seed=self.seed.value(),
        )

    def new_seed(self) -> None:
        self.seed.setValue(draw_seed())

    def fill_speed(self, drafters: list[tuple[int, str]], want: int | str) -> None:
        """The Speculative choices: the panes' own copies, then each pane whose loaded checkpoint
        can draft for the others (``drafters``: pane, draft); ``want`` stays chosen if offered,
        else Off. Quietly: the page reads the choice afterwards."""
        self.speed.blockSignals(True)
        self.speed.clear()
        for name, spec in SELF_DRAFTS:
            self.speed.addItem(name, spec)
        for index, draft in drafters:
            letter = LETTERS[index]
            self.speed.addItem(f"Pane {letter}'s checkpoint ({draft_label(draft)})", index)
            tip = PANE_DRAFT_TIP.format(letter=letter)
            self.speed.setItemData(self.speed.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
        # Compared by Python's ==, not Qt's: a pane's index is never taken for a draft name.
        rows = (i for i in range(self.speed.count()) if self.speed.itemData(i) == want)
        self.speed.setCurrentIndex(next(rows, 0))
        self.speed.blockSignals(False)
