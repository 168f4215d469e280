"""The Compare page: 2–4 panes side by side answering one prompt with the same seed and sampling.

Top: a toolbar (add pane, step sweep, same checkpoint × temperatures, probability overlay with
its legend, token diff between two panes, cross-scoring, save and export). Then a memory warning
banner, a notice banner, the pane row, a status line (where the replies diverge), the shared
sampling row and the prompt box.

The page wires itself to its :class:`CompareController` in ``_connect_signals``; what it shows
comes from the controller's Qt-free ``session`` (each pane redraws from its PaneState on
``pane_changed``). Everything here runs on the GUI thread.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QLabel,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from desktop.engine.backend import ModelInfo
from desktop.engine.messages import TokenEvent
from desktop.engine.params import SamplingParams
from desktop.qt.chat.input_box import InputBox
from desktop.qt.compare.agreement_table import AgreementDialog
from desktop.qt.compare.bars import CompareToolbar, SharedSampling, diff_marks
from desktop.qt.compare.controller import CompareController
from desktop.qt.compare.pane_view import ComparePane
from desktop.qt.widgets import theme
from desktop.qt.widgets.checkpoint_picker import entry_name
from desktop.qt.widgets.error_banner import ErrorBanner
from desktop.qt.widgets.inside_compare import InsideCompareWindow
from desktop.session.compare.analysis import LETTERS, MAX_PANES, MIN_PANES, DiffSpan
from desktop.session.compare.inside import CompareInside

PANE_MIN_WIDTH = 270  # two panes fit an 800 px window; more scroll sideways there


class CompareView(QWidget):
    """The whole Compare page. ``set_entries`` takes the checkpoint list (Background's scan);
    ``set_sampling`` fills the shared sampling row (Chat's values, or those a round ran with)."""

    _styled_for: theme.Colors | None = None  # the palette the style sheet was built for

    def __init__(self, controller: CompareController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.agreement: AgreementDialog | None = None
        self.setObjectName("CompareView")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.controller = controller
        self.panes: list[ComparePane] = []
        self.inside_window: InsideCompareWindow | None = None  # the Inside view across steps (#45)
        self.entries: list = []
        self._scanned = False  # until the first scan answers, panes say they are looking
        self._system_prompt = ""
        self.draft_colours = False  # the panes colour drafts, not probabilities

        self.toolbar = bar = CompareToolbar()
        # The toolbar's parts, by the names the page's code and its tests use.
        self.add_btn, self.sweep_btn, self.sweep_menu = bar.add_btn, bar.sweep_btn, bar.sweep_menu
        self.temps_btn, self.overlay_box, self.legend = bar.temps_btn, bar.overlay_box, bar.legend
        self.diff_box, self.diff_a, self.diff_b = bar.diff_box, bar.diff_a, bar.diff_b
        self.same_btn, self.score_btn, self.score_menu = bar.same_btn, bar.score_btn, bar.score_menu
        self.save_btn, self.export_btn = bar.save_btn, bar.export_btn
        self.memory_banner = ErrorBanner()
        self.memory_banner.setAccessibleName("Memory warning")
        self.banner = ErrorBanner()
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setObjectName("PaneRow")
        self.splitter.setHandleWidth(10)
        self.status = QLabel()
        self.status.setObjectName("Muted")
        self.status.setAccessibleName("Comparison status")
        self.sampling_row = shared = SharedSampling()
        self.temperature, self.top_k, self.max_tokens = shared.temperature, shared.top_k, shared.max_tokens
        self.seed, self.speed = shared.seed, shared.speed
        self.input = InputBox()
        self.input.editor.setPlaceholderText("One prompt for every pane…")

        body = QVBoxLayout(self)
        body.setContentsMargins(0, 0, 0, 0)
        body.setSpacing(0)
        body.addWidget(self.toolbar)
        body.addWidget(self.memory_banner)
        body.addWidget(self.banner)
        # The panes keep a readable width; more than fit side by side scroll sideways.
        self.pane_scroll = QScrollArea()
        self.pane_scroll.setObjectName("PaneScroll")
        self.pane_scroll.setWidgetResizable(True)
        self.pane_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.pane_scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.pane_scroll.setWidget(self.splitter)
        row = QWidget()
        row_lay = QVBoxLayout(row)
        row_lay.setContentsMargins(12, 10, 12, 4)
        row_lay.setSpacing(6)
        row_lay.addWidget(self.pane_scroll, 1)
        row_lay.addWidget(self.status)
        body.addWidget(row, 1)
        body.addWidget(self.sampling_row)
        body.addWidget(self.input)

        for i in range(len(controller.panes)):
            self._add_pane_widget(i)
        self._connect_signals()
        self._restyle()
        self._update_actions()
        session = controller.session
        for i in range(len(self.panes)):  # a session restored from the last run shows at once
            self._on_pane_refreshed(i)
        if session.prompt:
            self._on_opened(session.prompt, session.shared)

    # ----- construction ----------------------------------------------------------------------

    def _connect_signals(self) -> None:
        # Bound methods, not lambdas: Qt keeps a lambda (and what it captures) alive for as
        # long as the sender lives, while a bound method's receiver may go away first.
        c = self.controller
        c.pane_added.connect(self._add_pane_widget)
        c.pane_removed.connect(self._remove_pane_widget)
        c.pane_changed.connect(self._on_pane_changed)
        c.pane_loaded.connect(self._on_pane_loaded)
        c.pane_unloaded.connect(self._on_pane_unloaded)
        c.pane_started.connect(self._on_pane_started)
        c.pane_token.connect(self._on_pane_token)
        c.pane_finished.connect(self._on_pane_finished)
        c.pane_refreshed.connect(self._on_pane_refreshed)
        c.busy_changed.connect(self._on_busy)
        c.divergence_changed.connect(self._on_divergence)
        c.diff_changed.connect(self._on_diff)
        c.cross_scored.connect(self._on_cross_scored)
        c.memory_checked.connect(self._on_memory)
        c.comparison_opened.connect(self._on_opened)
        c.notice.connect(self._on_notice)
        c.saved.connect(self._on_saved)
        c.same_model_reported.connect(self._on_same_model)
        c.inside_changed.connect(self._on_inside)
        self.same_btn.clicked.connect(self.check_same_model)
        self.speed.currentIndexChanged.connect(self._on_speed)

        self.add_btn.clicked.connect(c.add_pane)
        self.temps_btn.clicked.connect(c.temperature_sweep)
        self.overlay_box.toggled.connect(self._on_overlay)
        self.diff_box.toggled.connect(self._on_diff_choice)
        self.diff_a.activated.connect(self._on_diff_choice)
        self.diff_b.activated.connect(self._on_diff_choice)
        self.sweep_menu.aboutToShow.connect(self._fill_sweep_menu)
        self.score_menu.aboutToShow.connect(self._fill_score_menu)
        self.save_btn.clicked.connect(self._save)
        self.toolbar.export_md.triggered.connect(self._export_markdown)
        self.toolbar.export_json.triggered.connect(self._export_json)
        self.input.send_requested.connect(self._send)
        self.input.stop_requested.connect(c.stop)
        self.sampling_row.dice.clicked.connect(self.sampling_row.new_seed)

    # ----- API -------------------------------------------------------------------------------

    def set_entries(self, entries: list) -> None:
        """The checkpoint list from a folder scan, for every pane's picker and the step sweep."""
        self.entries = list(entries)
        self._scanned = True
        for index, pane in enumerate(self.panes):
            pane.set_entries(self.entries)
            self._pick_shown(index)

    def set_sampling(self, values: dict) -> None:
        """Pre-fill the shared sampling row (keys as in settings' sampling, plus system_prompt)."""
        self.sampling_row.set_values(values)
        if "system_prompt" in values:
            self._system_prompt = str(values["system_prompt"] or "")

    def set_draft(self, draft: str) -> None:
        """Pre-fill the speculative choice with Chat's (one naming a checkpoint starts plain)."""
        self.speed.setCurrentIndex(max(0, self.speed.findData(draft)))

    def _on_speed(self) -> None:
        # A pane's entry holds its index (an int), the others their draft name.
        chosen = self.speed.currentData()
        if isinstance(chosen, int):
            self.controller.choose_draft(pane=chosen)
        else:
            self.controller.choose_draft(str(chosen or ""))

    def _fill_speed(self) -> None:
        """The choice stays with its pane; when that pane's checkpoint goes (unloaded, removed),
        it falls back to Off."""
        c = self.controller
        want: int | str = c.panes.index(c.drafter) if c.drafter in c.panes else c.draft
        self.sampling_row.fill_speed(c.drafters(), want)
        self._on_speed()

    def set_draft_colours(self, on: bool) -> None:
        """Colour every pane's kept drafts and corrections instead of probabilities."""
        self.draft_colours = on
        for pane in self.panes:
            pane.set_draft_colours(on)

    def shared_params(self) -> SamplingParams:
        """The shared sampling values every pane starts from."""
        return self.sampling_row.params()

    # ----- panes -----------------------------------------------------------------------------

    def _add_pane_widget(self, index: int) -> None:
        pane = ComparePane(LETTERS[index])
        pane.setMinimumWidth(PANE_MIN_WIDTH)
        if self._scanned:
            pane.set_entries(self.entries)
        pane.view.set_overlay(self.overlay_box.isChecked())
        pane.set_draft_colours(self.draft_colours)
        self.panes.insert(index, pane)
        self.splitter.insertWidget(index, pane)
        pane.selection_changed.connect(self._pane_selection_changed)
        pane.load_requested.connect(self._pane_load_requested)
        pane.unload_requested.connect(self._pane_unload_requested)
        pane.remove_requested.connect(self._pane_remove_requested)
        pane.overrides_changed.connect(self._pane_overrides_changed)
        pane.fork_requested.connect(self._pane_fork_requested)
        pane.inside_requested.connect(self._pane_inside_requested)
        pane.show_state(self.controller.session.panes[index])
        self._pick_shown(index)
        self._relabel()

    def _pick_shown(self, index: int) -> None:
        """A pane with no pick yet picks what its lists show first (the newest step of the first
        checkpoint), so Load loads what the user sees."""
        if self.controller.session.panes[index].picked is None and (shown := self.panes[index].current()):
            self.controller.select(index, *shown)

    def _remove_pane_widget(self, index: int) -> None:
        pane = self.panes.pop(index)
        pane.hide()
        pane.setParent(None)
        pane.deleteLater()
        self._relabel()
        self._fill_speed()

    def _sender_index(self) -> int:
        """Which pane widget sent the signal being handled."""
        sender = self.sender()
        assert isinstance(sender, ComparePane)  # these slots are connected only to panes' signals
        return self.panes.index(sender)

    def _pane_fork_requested(self, position: int, token_id: int, text: str) -> None:
        index = self._sender_index()
        shared = self.shared_params()
        self.controller.fork_pane(index, position, shared, self._system_prompt, token_id, text)

    def _pane_inside_requested(self, position: int) -> None:
        self.controller.inside_at(position)

    def _on_inside(self, state: CompareInside) -> None:
        """The Inside view across steps, in its own window (one at a time)."""
        for pane in self.panes:
            if pane.popup is not None:
                pane.popup.close()
        if self.inside_window is None:
            self.inside_window = InsideCompareWindow()
            self.inside_window.setParent(self, Qt.WindowType.Window)
        self.inside_window.show_state(state)
        self.inside_window.show()

    def _pane_selection_changed(self, path: Path, step: int) -> None:
        index = self._sender_index()
        self.controller.follow(index, self.panes[index].following())
        self.controller.select(index, path, step)

    def _pane_load_requested(self, path: Path, step: int) -> None:
        self.controller.load(self._sender_index(), path, step)

    def _pane_unload_requested(self) -> None:
        self.controller.unload(self._sender_index())

    def _pane_remove_requested(self) -> None:
        self.controller.remove_pane(self._sender_index())

    def _pane_overrides_changed(self, overrides: dict) -> None:
        self.controller.set_overrides(self._sender_index(), overrides)

    def _relabel(self) -> None:
        for i, pane in enumerate(self.panes):
            pane.set_letter(LETTERS[i])
        for combo, default in ((self.diff_a, 0), (self.diff_b, 1)):
            keep = combo.currentIndex()
            combo.clear()
            combo.addItems([LETTERS[i] for i in range(len(self.panes))])
            combo.setCurrentIndex(keep if 0 <= keep < len(self.panes) else default)
        self.splitter.setSizes([1000] * len(self.panes))  # equal widths
        self._update_actions()

    # ----- controller → panes ----------------------------------------------------------------

    def _on_pane_changed(self, index: int) -> None:
        if index < len(self.panes):
            self.panes[index].show_state(self.controller.session.panes[index])

    def _on_pane_unloaded(self, _index: int) -> None:
        self._fill_speed()

    def _on_pane_started(self, index: int, _params: SamplingParams) -> None:
        # A raced fork's reply already holds what the fork said: it shows before the rest streams.
        self.panes[index].begin(self.controller.panes[index].run.trace)

    def _on_pane_token(self, index: int, token_index: int, ev: TokenEvent) -> None:
        self.panes[index].append(token_index, ev)

    def _on_pane_finished(self, index: int, stats: dict) -> None:
        self.panes[index].finish(stats)

    def _on_cross_scored(self, source: int, index: int, result: dict) -> None:
        self.panes[index].set_score(LETTERS[source], result)

    def _on_pane_loaded(self, _index: int, _info: ModelInfo) -> None:
        self._update_actions()
        self._fill_speed()

    def _on_pane_refreshed(self, index: int) -> None:
        pane, run = self.panes[index], self.controller.panes[index].run
        pane.show_run(run)
        pane.view.set_divergence(self.controller.divergence if run.tokens else None)
        self._show_scores()  # a reopened comparison restores the runs one pane at a time

    def _show_scores(self) -> None:
        """Every pane's cross-score lines, from every run's scores (keyed by the scoring pane)."""
        for index, pane in enumerate(self.panes):
            pane.set_scores(
                {
                    LETTERS[source]: result
                    for source, other in enumerate(self.controller.panes)
                    for letter, result in other.run.cross_scores.items()
                    if letter == LETTERS[index]
                }
            )

    # ----- actions ---------------------------------------------------------------------------

    def _send(self, text: str) -> None:
        self.banner.hide()
        self.controller.send(text, self.shared_params(), self._system_prompt)

    def _on_busy(self, busy: bool) -> None:
        self.input.set_generating(busy)
        for pane in self.panes:
            pane.busy = busy
        self._update_actions()
        if busy:  # a round began: the shared row shows what it runs with (a race from Chat too)
            self.set_sampling(self.controller.session.shared.to_dict())
        else:
            self._show_divergence_status()

    def _update_actions(self) -> None:
        busy = self.controller.busy
        has_result = self.controller.session.has_result()
        self.add_btn.setEnabled(not busy and len(self.panes) < MAX_PANES)
        for w in (self.sweep_btn, self.temps_btn):
            w.setEnabled(not busy)
        for w in (self.score_btn, self.save_btn, self.export_btn):
            w.setEnabled(not busy and has_result)
        for pane in self.panes:
            pane.remove_btn.setVisible(len(self.panes) > MIN_PANES)
            pane.remove_btn.setEnabled(not busy)

    def _fill_sweep_menu(self) -> None:
        self.sweep_menu.clear()
        candidates = [e for e in self.entries if len(e.steps) > 1]
        for entry in candidates:
            label = f"{entry_name(entry)}  ({len(entry.steps)} steps)"
            action = self.sweep_menu.addAction(label)
            action.triggered.connect(lambda _checked=False, e=entry: self.controller.step_sweep(e))
        if not candidates:
            self.sweep_menu.addAction("No checkpoint has more than one step").setEnabled(False)

    def _fill_score_menu(self) -> None:
        self.score_menu.clear()
        for i, pane in enumerate(self.controller.panes):
            action = self.score_menu.addAction(f"Score {LETTERS[i]}'s reply under every pane")
            action.setEnabled(bool(pane.run.tokens))
            action.triggered.connect(lambda _checked=False, i=i: self.controller.cross_score(i))
        self.score_menu.addSeparator()
        matrix = self.score_menu.addAction("Agreement matrix: every reply under every pane")
        matrix.setEnabled(sum(bool(p.run.tokens) for p in self.controller.panes) >= 2)
        matrix.triggered.connect(self.show_agreement)

    def show_agreement(self) -> None:
        """Score every reply under every pane and show how often each pane's top token agrees."""
        if not self.controller.cross_score_all():
            return
        if self.agreement is None:
            self.agreement = AgreementDialog(self)
            self.controller.cross_scored.connect(lambda *_: self._update_agreement())
        self._update_agreement()
        self.agreement.show()

    def _update_agreement(self) -> None:
        if self.agreement is not None:
            labels = [
                f"{LETTERS[i]} · step {p.info.step:,}"
                if p.info is not None and p.info.step is not None
                else LETTERS[i]
                for i, p in enumerate(self.controller.panes)
            ]
            self.agreement.set_matrix(labels, self.controller.agreement())

    def check_same_model(self) -> bool:
        """Pick the first local and the first served pane that are loaded and run them greedy."""
        ready = [(i, p.info) for i, p in enumerate(self.controller.panes) if p.ready and p.info is not None]
        local = next((i for i, info in ready if info.family != "remote"), None)
        served = next((i for i, info in ready if info.family == "remote"), None)
        if local is None or served is None:
            self.banner.show_info(
                "Same model?", "Load a local checkpoint in one pane and a served model in another."
            )
            return False
        text = self.input.editor.toPlainText().strip() or self.controller.prompt or "Hello"
        self.banner.hide()
        return self.controller.same_model(local, served, text, self.shared_params())

    def _on_same_model(self, a: int, b: int, report) -> None:
        line = report.summary(LETTERS[a], LETTERS[b])
        self.status.setText(line)
        self.banner.show_info(f"Same model? {LETTERS[a]} vs {LETTERS[b]}", line)

    def _on_overlay(self, on: bool) -> None:
        self.legend.setVisible(on)
        missing = [
            f"{LETTERS[i]}: {p.info.capabilities.why_not('logprobs') or 'no token probabilities'}"
            for i, p in enumerate(self.controller.panes)
            if on and p.info is not None and not p.info.capabilities.logprobs
        ]
        if missing:
            self.banner.show_info("No probabilities from some panes", "; ".join(missing))
        for pane in self.panes:
            pane.view.set_overlay(on)
        self.controller.set_overlay(on)

    def _on_diff_choice(self, *_args) -> None:
        on = self.diff_box.isChecked()
        self.diff_a.setEnabled(on)
        self.diff_b.setEnabled(on)
        if on:
            self.controller.session.set_diff_pair(self.diff_a.currentIndex(), self.diff_b.currentIndex())
        else:
            self.controller.session.set_diff_pair(None)

    def _on_diff(self, diff: tuple[int, int, list[DiffSpan]] | None) -> None:
        marks: list[dict[int, str]] = [{} for _ in self.panes]
        if diff is not None:
            a, b, spans = diff
            marks[a], marks[b] = diff_marks(spans)
        for pane, m in zip(self.panes, marks, strict=True):
            pane.view.set_diff(m)

    def _on_divergence(self, index: int | None) -> None:
        for pane, state in zip(self.panes, self.controller.panes, strict=True):
            pane.view.set_divergence(index if state.run.tokens or state.run.running else None)
        self._show_divergence_status()

    def _show_divergence_status(self) -> None:
        self.status.setText(self.controller.session.divergence_status())

    def _on_memory(self, ok: bool, message: str) -> None:
        if ok:
            self.memory_banner.hide()
        else:
            self.memory_banner.show_warning("Not enough memory", message)

    def _on_opened(self, prompt: str, shared: SamplingParams) -> None:
        self.input.set_text(prompt)
        self.set_sampling(shared.to_dict())
        self._update_actions()
        self._show_divergence_status()

    def _on_notice(self, level: str, title: str, message: str) -> None:
        {"error": self.banner.show_error, "warning": self.banner.show_warning}.get(
            level, self.banner.show_info
        )(title, message)

    def _save(self) -> None:
        self.controller.save()

    def _on_saved(self, _conv_id: int) -> None:
        self.banner.show_info("Saved", "the comparison is in your history")

    def _export_markdown(self) -> None:
        self._export("md")

    def _export_json(self) -> None:
        self._export("json")

    def _export(self, fmt: str) -> None:
        suffix = {"md": "Markdown (*.md)", "json": "JSON (*.json)"}[fmt]
        target, _ = QFileDialog.getSaveFileName(self, "Export comparison", f"comparison.{fmt}", suffix)
        if target:
            self.controller.export(fmt, Path(target))

    # ----- theme -----------------------------------------------------------------------------

    def _restyle(self) -> None:
        c = self._styled_for = theme.colors()
        self.setStyleSheet(
            f"QWidget#CompareView {{ background: {c.window}; }}"
            f"QFrame#CompareToolbar {{ background: {c.surface}; border-bottom: 1px solid {c.border}; }}"
            f"QFrame#CompareSampling {{ background: {c.window}; }}"
            "QSplitter#PaneRow::handle { background: transparent; }"
            "QScrollArea#PaneScroll, QSplitter#PaneRow { background: transparent; }"
        )

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        # Our own setStyleSheet also sends PaletteChange: restyle only when the theme really changed.
        if event.type() == QEvent.Type.PaletteChange and self._styled_for is not theme.colors():
            self._restyle()
