"""The Run tab: one training run on a timeline, each saved step a point to open or compare.

The user picks a run (a nanochat tag, whose stages are chained, or a KempnerForge run); the view
asks for its timeline (read off the GUI thread, from metas only) and draws the chosen number
against the step or the tokens seen, a marker at every saved checkpoint and a line where each
stage starts. Hovering a marker shows what the step's files state (its numbers, what changed in
its config since the step before, its size); a click opens it in Chat; Shift+click marks steps,
and "Compare" sends the marked ones (two to four) to the Compare tab. "Sample prompts" asks
the marked steps (all, when none is marked) nanochat's base_train sample prompts and fills a
table, prompts by steps, as the sweep goes. "Multiple choice…" asks
them the questions of a JSONL the user picks (nanochat's categorical scoring): each step's share
right joins the timeline as a curve, the table of steps by tasks, and "what flipped" between the
first and last step lists the questions that changed, each a click from Compare. "Report…"
writes the run's report card (Markdown and a PNG per curve) into a folder the user picks.

"Evaluate new steps as they land" follows a run while it trains: each step that lands is
evaluated as the user last evaluated (or as they pick then), in the background, one at a time,
its row joining the table, its point the curve, and what flipped comparing it with the step
before. "Pause" stops after the item in hand and keeps the steps waiting; it waits while the
user chats unless "even while I chat" is checked.

The state (the run, its timeline, the marks, what was said and scored) is a Qt-free
:class:`~desktop.session.run.RunSession`: this view renders it and sends the user's intents to it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import pyqtgraph as pg
import pyqtgraph.exporters
from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHeaderView,
    QLabel,
    QMenu,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop.engine.discovery import CheckpointEntry
from desktop.engine.runs.timeline import Point, Timeline
from desktop.qt.run.evals import EvalResults
from desktop.qt.run.parts import PlainLogAxis, against_tokens, point_tip, run_targets
from desktop.qt.widgets import common, theme
from desktop.session.run import Evaluation, RunSession

# What each evaluation reads: the file dialog's title and name filter.
EVAL_FILES = {
    "mc": ("Questions to ask each step", "JSON Lines (*.jsonl *.json);;All files (*)"),
    "bpb": ("A text to measure bits per byte on", "Text (*.txt *.md *.jsonl);;All files (*)"),
}
PLOT_WIDTH = 1200  # pixels of a report's curve image
STEPS = "saved steps"  # the "metric" of a run whose metas state no numbers: markers on one line
CORE_LITE = 100  # examples per CORE task in the lite run (nanochat's --max-per-task)


class RunView(QWidget):
    """A view over ``session`` (the run chosen goes to it, and it asks for the timeline). Signals:
    open_step(Path, int) opens a step in Chat; compare_steps(list[(Path, int)]) sends the marked
    steps to Compare."""

    open_step = Signal(object, int)
    compare_steps = Signal(list)
    samples_wanted = Signal(list)  # the points to sample
    samples_stopped = Signal()
    report_wanted = Signal(object)  # the folder to write the report card into
    eval_wanted = Signal(str, list, object)  # "mc" | "bpb", the points to ask, the data file
    eval_stopped = Signal()
    compare_question = Signal(list, str)  # [(folder, step)] x 2 and the question they were asked

    def __init__(self, session: RunSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self._card = False  # drawing a report card's plots: no marks
        self.runs = QComboBox()
        self.runs.setMinimumContentsLength(18)
        self.runs.currentIndexChanged.connect(self._on_run)
        self.curve = QComboBox()
        self.curve.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.curve.setMinimumContentsLength(16)
        self.curve.currentIndexChanged.connect(self._draw)
        self.axis = QComboBox()
        self.axis.addItems(["step", "tokens"])
        self.axis.currentIndexChanged.connect(self._draw)
        self.compare_btn = QPushButton("Compare")
        self.compare_btn.setEnabled(False)
        self.compare_btn.clicked.connect(self._send_to_compare)
        self.sample_btn = QPushButton("Sample prompts")
        self.sample_btn.setToolTip(
            "Ask each marked step (every step when none is marked) nanochat's seven base_train "
            "prompts: greedy, 16 tokens, one checkpoint in memory at a time"
        )
        self.sample_btn.clicked.connect(self._on_sample_btn)
        self.report_btn = QPushButton("Report…")
        self.report_btn.setToolTip(
            "Write this run's report card into a folder: Markdown with its curves as PNG, every "
            "step's numbers and weights hash, the sampled prompts, the config"
        )
        self.report_btn.clicked.connect(self._on_report_btn)
        self.eval_btn = QPushButton()
        self.eval_btn.setToolTip(
            "Evaluate each marked step (every step when none is marked), one checkpoint in memory "
            "at a time: multiple choice from a JSONL, or bits per byte of a text (docs/EVALS.md)"
        )
        self.eval_menu = self._eval_choices(QMenu(self.eval_btn), self.evaluate)
        self.eval_btn.clicked.connect(self._on_eval_btn)
        self.follow_box = QCheckBox("Evaluate new steps as they land")
        self.follow_box.setToolTip(
            "While the run trains, evaluate each step it saves as you last evaluated (or as you "
            "pick now): in the background, one step at a time, at low priority"
        )
        self.follow_box.toggled.connect(self._on_follow_box)
        self.follow_menu = self._eval_choices(QMenu(self.follow_box), self._follow, samples=True)
        self.pause_btn = QPushButton("Pause")
        self.pause_btn.setToolTip("Stop after the item in hand; the steps that landed wait")
        self.pause_btn.clicked.connect(self._on_pause)
        self.chat_too = QCheckBox("even while I chat")
        self.chat_too.setToolTip(
            "Go on evaluating while a reply streams or you type (else it waits: both share the CPU)"
        )
        self.chat_too.toggled.connect(self.session.follow_while_chatting)
        self.evaluating = ""  # the running evaluation's kind, "" when none runs
        self._started = 0.0  # when it started (for its estimate)
        self._idle_eval_btn()
        self.evals = EvalResults(self.session)
        self.evals.flip_chosen.connect(self._on_flip)
        self.sweeping = False
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setWordWrap(True)
        self.results = QTabWidget()
        self.results.setDocumentMode(True)
        self.results.addTab(self.table, "Sample prompts")
        self.results.addTab(self.evals, "Evaluations")
        self.results.hide()
        self._rows: list[str] = []  # the table's prompts and step columns, in order
        self._columns: list[str] = []
        self.status = common.StatusLine("Pick a run: its saved steps and the numbers their metas state.")
        bar = QWidget()  # groups that wrap as a whole onto a second row on a narrow window
        flow = common.FlowLayout(bar, spacing=14)
        flow.setContentsMargins(0, 0, 0, 0)
        for label, widget in (("Run", self.runs), ("Curve", self.curve), ("Against", self.axis)):
            flow.addWidget(common.group(QLabel(label), widget))
        flow.addWidget(common.group(self.sample_btn, self.eval_btn, self.report_btn, self.compare_btn))
        flow.addWidget(common.group(self.follow_box, self.pause_btn, self.chat_too))
        self.plot = pg.PlotWidget(axisItems={"left": PlainLogAxis("left")})
        self.plot.showGrid(x=True, y=True, alpha=0.15)
        self.plot.setMenuEnabled(False)
        self.scatter = pg.ScatterPlotItem(hoverable=True, tip=self._tip, size=11, hoverSize=15)
        self.scatter.sigClicked.connect(self._on_click)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.addWidget(bar)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.plot)
        split.addWidget(self.results)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        layout.addWidget(split, 1)
        layout.addWidget(self.status)
        events = self.session.events
        events.timeline_changed.connect(self._on_timeline)
        events.marks_changed.connect(self._draw)
        events.samples_started.connect(self._clear_samples)
        events.sample_added.connect(self._show_sample)
        events.questions_changed.connect(self._show_evals)
        events.scores_changed.connect(self._on_scores)
        events.follow_changed.connect(self._on_follow)
        self._without_x = 0  # steps of the timeline drawn without a token count
        self._on_follow()
        self.apply_theme()

    @property
    def timeline(self) -> Timeline | None:
        return self.session.timeline

    # ----- inputs ----------------------------------------------------------------------------

    def set_entries(self, entries: list[CheckpointEntry]) -> None:
        """The runs among the scan's checkpoints (the chosen one stays chosen)."""
        current = self.runs.currentData()
        self.runs.blockSignals(True)
        self.runs.clear()
        for label, folder in run_targets(entries):
            self.runs.addItem(label, folder)
        index = self.runs.findData(current) if current is not None else -1
        self.runs.setCurrentIndex(max(index, 0) if self.runs.count() else -1)
        self.runs.blockSignals(False)
        if self.runs.currentData() != current:
            self._on_run()
        self.session.note_unsaved(entries)
        if self.timeline is not None and self.runs.currentData() == current:
            self._say(self.timeline, self._without_x)

    def choose_run(self, folder: Path) -> None:
        index = self.runs.findData(Path(folder))
        if index < 0:
            self.runs.addItem(Path(folder).name, Path(folder))
            index = self.runs.count() - 1
        self.runs.setCurrentIndex(index)

    def _on_timeline(self) -> None:
        if self.timeline is not None:
            self._list_curves(self.timeline)
        else:
            self.plot.clear()
            self.status.setText(self.session.problem)

    def _list_curves(self, timeline: Timeline) -> None:
        chosen = self.curve.currentText()
        self.curve.blockSignals(True)
        self.curve.clear()
        self.curve.addItems(timeline.metric_names() or [STEPS])
        self.curve.setCurrentIndex(max(self.curve.findText(chosen), 0))
        self.curve.blockSignals(False)
        self._draw()

    def _clear_samples(self) -> None:
        self.table.setRowCount(0)
        self.table.setColumnCount(0)
        self._rows, self._columns = [], []
        self.results.show()
        self.results.setCurrentWidget(self.table)

    def _show_sample(self, stage: str, step: int, prompt: str, text: str) -> None:
        """One step's continuation of one prompt, into its cell (prompts down, steps across)."""
        self.results.show()
        column = f"{stage} {step}"
        if column not in self._columns:
            self.table.insertColumn(len(self._columns))
            self.table.setHorizontalHeaderItem(len(self._columns), QTableWidgetItem(column))
            self._columns.append(column)
        if prompt not in self._rows:
            self.table.insertRow(len(self._rows))
            self.table.setVerticalHeaderItem(len(self._rows), QTableWidgetItem(prompt))
            self._rows.append(prompt)
        cell = QTableWidgetItem(text.strip() or "(nothing)")
        cell.setToolTip(f"{prompt}{text}")
        self.table.setItem(self._rows.index(prompt), self._columns.index(column), cell)
        self.table.resizeRowsToContents()

    def save_plots(self, folder: Path) -> list[tuple[str, str]]:
        """Each curve of the run drawn as the tab draws it, against the step, into
        ``folder/<metric>.png``; (metric, file name) for each. The user's choice is kept."""
        if self.timeline is None:
            return []
        chosen, axis = self.curve.currentIndex(), self.axis.currentIndex()
        self.axis.setCurrentIndex(0)
        self._card = True  # a card shows the run, not this session's marks
        written: list[tuple[str, str]] = []
        try:
            for index in range(self.curve.count()):
                metric = self.curve.itemText(index)
                if metric == STEPS:
                    continue
                self.curve.setCurrentIndex(index)
                name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in metric) + ".png"
                exporter = pyqtgraph.exporters.ImageExporter(self.plot.getPlotItem())
                exporter.parameters()["width"] = PLOT_WIDTH
                exporter.export(str(Path(folder) / name))
                written.append((metric, name))
        finally:
            self._card = False
            self.curve.setCurrentIndex(chosen)
            self.axis.setCurrentIndex(axis)
            self._draw()
        return written

    # ----- evaluations -----------------------------------------------------------------------

    def _idle_eval_btn(self) -> None:
        self.eval_btn.setText("Evaluate")
        self.eval_btn.setMenu(self.eval_menu)

    def _on_eval_btn(self) -> None:
        if self.evaluating:  # while one runs the button is its Stop
            self.eval_stopped.emit()

    def _eval_choices(
        self, menu: QMenu, then: Callable[[str, Path | None], None], samples: bool = False
    ) -> QMenu:
        """``menu`` filled with the evaluations, each calling ``then(kind, data)`` once chosen
        (its file picked first, for those that read one)."""
        if samples:
            menu.addAction("Sample prompts", lambda: then("samples", None))
        menu.addAction("Multiple choice…", lambda: self._pick_eval_file("mc", then))
        menu.addAction("Bits per byte…", lambda: self._pick_eval_file("bpb", then))
        menu.addAction("Arithmetic and spelling", lambda: then("answers", None))
        menu.addSeparator()
        menu.addAction(f"CORE, lite ({CORE_LITE} per task)", lambda: then("core-lite", None))
        menu.addAction("CORE, every example", lambda: then("core", None))
        menu.addAction("CORE from an eval_bundle folder…", lambda: self._pick_bundle(then))
        return menu

    def _pick_eval_file(self, kind: str, then: Callable[[str, Path | None], None]) -> None:
        title, pattern = EVAL_FILES[kind]
        path, _ = QFileDialog.getOpenFileName(self, title, "", pattern)
        if path:
            then(kind, Path(path))

    def _pick_bundle(self, then: Callable[[str, Path | None], None]) -> None:
        path = QFileDialog.getExistingDirectory(self, "nanochat's eval_bundle folder (core.yaml)")
        if path:
            then("core-lite", Path(path))

    def evaluate(self, kind: str, data: Path | None) -> None:
        """Evaluate the marked steps (every step when none is marked): ``kind`` "mc" asks the
        questions in ``data``, "bpb" measures the text in it, "answers" checks the replies to
        the bundled arithmetic and spelling problems (no file), "core" and "core-lite" score
        nanochat's CORE on the eval_bundle folder ``data`` (None: the base dir's)."""
        if self.timeline is None or not self.timeline.points or self.evaluating or self._following_now():
            return
        self.evaluating = kind
        self._started = time.monotonic()
        self.eval_btn.setMenu(None)  # type: ignore[arg-type]  # Qt takes None: no menu
        self.eval_btn.setText("Stop evaluating")
        if kind.startswith("core"):
            self.status.setText("Reading nanochat's eval_bundle…")
        else:
            self.status.setText(f"Reading {data.name}…" if data else "Asking the bundled problems…")
        self.eval_wanted.emit(kind, self.session.start_evaluation(kind, data), data)

    def say_problems(self, questions: list, problems: list) -> None:
        """The lines of the questions file that could not be read."""
        if problems:
            self.status.setText(f"{len(questions)} questions; {len(problems)} problems: {problems[0]}")

    def show_eval_progress(self, done: int, total: int) -> None:
        spent = time.monotonic() - self._started
        left = spent / done * (total - done) if done else 0.0
        self.status.setText(f"Evaluating: {done} of {total} done, about {left:.0f} s left")

    def _show_evals(self) -> None:
        self.results.show()
        self.results.setCurrentWidget(self.evals)

    def _on_scores(self, _task: str) -> None:
        """A task's scores: a column of the table and a curve on the timeline."""
        self._show_evals()
        if self.timeline is not None:
            self._list_curves(self.timeline)

    def eval_done(self, error: str) -> None:
        self.evaluating = ""
        self._idle_eval_btn()
        if error:
            self.status.setText(f"Evaluation stopped: {error}")
        elif self.timeline is not None:
            self._say(self.timeline, 0)
            read_back, steps = self.session.kept
            if read_back:
                self.status.setText(
                    f"{self.status.text()} · {read_back} of {steps} steps read from kept results"
                )

    # ----- following the run as it trains ------------------------------------------------------

    def _following_now(self) -> bool:
        """Whether a step that landed is being evaluated (the Evaluate and Sample buttons wait)."""
        follow = self.session.follow
        return follow is not None and follow.in_hand is not None

    def _on_follow_box(self, checked: bool) -> None:
        """Following on: the evaluation run last follows, or (none run yet) the one picked now;
        off: nothing follows (the step in hand stops after its item)."""
        if not checked:
            self.session.follow_run(None)
        elif self.session.asked is not None:
            self._follow(self.session.asked.kind, self.session.asked.data)
        else:
            self.follow_menu.exec(self.follow_box.mapToGlobal(self.follow_box.rect().bottomLeft()))
            if self.session.follow is None:  # nothing picked
                self._on_follow()

    def _follow(self, kind: str, data: Path | None) -> None:
        self.session.follow_run(Evaluation(kind, data))

    def _on_pause(self) -> None:
        follow = self.session.follow
        if follow is not None:
            self.session.pause_following(not follow.paused)

    def _on_follow(self) -> None:
        """Following changed: the controls and the status line say where it is."""
        follow = self.session.follow
        self.follow_box.blockSignals(True)
        self.follow_box.setChecked(follow is not None)
        self.follow_box.blockSignals(False)
        if follow is not None:
            self.follow_box.setToolTip(f"Following: {follow.evaluation.title()}")
        self.pause_btn.setEnabled(follow is not None)
        self.pause_btn.setText("Resume" if follow is not None and follow.paused else "Pause")
        self.chat_too.blockSignals(True)
        self.chat_too.setChecked(self.session.even_while_chatting)
        self.chat_too.blockSignals(False)
        busy = self._following_now()
        for button in (self.eval_btn, self.sample_btn):
            button.setEnabled(not busy)
            button.setStatusTip("Waits for the step being evaluated as it landed" if busy else "")
        if self.timeline is not None:
            self._say(self.timeline, self._without_x)

    def show_follow_progress(self, done: int, total: int) -> None:
        follow = self.session.follow
        if follow is None or follow.in_hand is None:
            return
        step = follow.in_hand.step
        self.status.setText(f"Evaluating step {step} as it landed: {done} of {total} done")

    def report_done(self, message: str) -> None:
        self.report_btn.setEnabled(True)
        self.status.setText(message)

    def show_sweep_progress(self, done: int, total: int) -> None:
        self.status.setText(f"Sampling: {done} of {total} prompts answered")

    def sweep_done(self, error: str) -> None:
        self.sweeping = False
        self.sample_btn.setText("Sample prompts")
        if error:
            self.status.setText(f"Sampling stopped: {error}")
        elif self.timeline is not None:
            self._say(self.timeline, 0)

    def apply_theme(self) -> None:
        c = theme.colors()
        self.plot.setBackground(c.surface)
        for name in ("left", "bottom"):
            axis = self.plot.getAxis(name)
            axis.enableAutoSIPrefix(False)  # "val_bpb (x0.001)" reads as another number
            axis.setPen(pg.mkPen(c.border))
            axis.setTextPen(pg.mkPen(c.muted))
        self._draw()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:  # the theme changed
            self.apply_theme()

    # ----- drawing ---------------------------------------------------------------------------

    def _x(self, point: Point) -> float | None:
        return float(point.x) if self.axis.currentText() == "step" else point.tokens

    def _line(self, timeline: Timeline, metric: str) -> list[tuple[float, float]]:
        """The metric's known values against the chosen axis."""
        line = timeline.line(metric)
        return line if self.axis.currentText() == "step" else against_tokens(timeline, line)

    def _draw(self) -> None:
        self.plot.clear()
        timeline = self.timeline
        if timeline is None:
            return
        c = theme.colors()
        marked = [] if self._card else self.session.marked
        metric = self.curve.currentText()
        placed = [(x, p) for p in timeline.points if (x := self._x(p)) is not None]
        line = self._line(timeline, metric)
        values = [y for _, y in line]
        # A loss that falls by orders of magnitude reads on a log scale.
        log = bool(values) and min(values) > 0 and max(values) / min(values) > 20
        self.plot.setLogMode(y=log)
        if len(line) > 1:
            self.plot.plot([x for x, _ in line], values, pen=pg.mkPen(c.accent, width=2))
        # Every saved step gets a marker: on its value, or (it has none) on the curve's floor.
        floor = min(values) if values else 0.0
        on_curve = [timeline.value_at(p, metric) for _, p in placed]
        ys = [floor if y is None else y for y in on_curve]
        brushes = [
            pg.mkBrush(c.warning if p in marked else c.accent if y is not None else c.muted)
            for (_, p), y in zip(placed, on_curve, strict=True)
        ]
        self.scatter.setData(
            x=[x for x, _ in placed],
            y=[math.log10(y) if log else y for y in ys],
            data=[p for _, p in placed],
            brush=brushes,
            pen=pg.mkPen(c.surface),
        )
        self.plot.addItem(self.scatter)
        if self.axis.currentText() == "step":
            for start, stage in timeline.stages[1:] if len(timeline.stages) > 1 else ():
                line = pg.InfiniteLine(pos=start, angle=90, pen=pg.mkPen(c.muted, style=Qt.PenStyle.DashLine))
                line.label = pg.InfLineLabel(line, text=stage, position=0.95, color=c.muted)
                self.plot.addItem(line)
        if placed:
            xs = [x for x, _ in placed]
            self.plot.setXRange(min(0.0, min(xs)), max(xs) or 1.0, padding=0.05)
        self.plot.setLabel("left", metric if metric != STEPS else "")
        self.plot.setLabel("bottom", self.axis.currentText())
        self._without_x = len(timeline.points) - len(placed)
        self._say(timeline, self._without_x)

    def _say(self, timeline: Timeline, without_x: int) -> None:
        parts = [f"{timeline.name}: {len(timeline.points)} saved steps"]
        if without_x:
            parts.append(f"{without_x} without a token count")
        if timeline.problems:
            parts.append(f"{len(timeline.problems)} values left out ({timeline.problems[0]})")
        if "bpb" in self.curve.currentText():
            parts += timeline.notes
        marked = self.session.marked
        if marked:
            parts.append(f"marked for Compare: {', '.join(str(p.step) for p in marked)}")
        if unsaved := self.session.unsaved_line():
            parts.append(unsaved)
        if following := self.session.follow_status():
            parts.append(following)
        self.status.setText(" · ".join(parts))
        self.compare_btn.setEnabled(self.session.can_compare())
        self.compare_btn.setText(f"Compare {len(marked)}" if marked else "Compare")

    def _tip(self, x: float, y: float, data: Point) -> str:
        return point_tip(data)

    # ----- actions -----------------------------------------------------------------------------

    def _on_run(self) -> None:
        folder = self.runs.currentData()
        if folder is not None:
            self.status.setText(f"Reading {Path(folder).name}…")
            self.session.choose_run(Path(folder))

    def _on_click(self, _item: object, spots: list, _event: object = None) -> None:
        if not spots:
            return
        self.click_point(spots[0].data(), QApplication.keyboardModifiers())

    def click_point(self, point: Point, modifiers: Qt.KeyboardModifier) -> None:
        """What a click on ``point`` does: open it, or with Shift mark or unmark it."""
        if modifiers & Qt.KeyboardModifier.ShiftModifier:
            self.session.toggle_mark(point)
        else:
            self.open_step.emit(point.path, point.step)

    def _on_sample_btn(self) -> None:
        if self.sweeping:
            self.samples_stopped.emit()
            return
        if self.timeline is None or not self.timeline.points or self._following_now():
            return
        points = self.session.start_samples()
        self.sweeping = True
        self.sample_btn.setText("Stop sampling")
        self.samples_wanted.emit(points)

    def _on_report_btn(self) -> None:
        if self.timeline is None:
            return
        folder = QFileDialog.getExistingDirectory(self, "Write the report card into")
        if folder:
            self.report_to(Path(folder))

    def report_to(self, folder: Path) -> None:
        self.report_btn.setEnabled(False)
        self.status.setText(f"Writing the report card into {folder}…")
        self.report_wanted.emit(Path(folder))

    def _send_to_compare(self) -> None:
        if steps := self.session.compare_steps():
            self.compare_steps.emit(steps)

    def _on_flip(self, line: int) -> None:
        """A flipped question clicked: both steps and the question go to Compare."""
        if (asked := self.session.flip_question(line)) is not None:
            self.compare_question.emit(*asked)
