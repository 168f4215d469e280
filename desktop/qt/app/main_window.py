"""The main window: builds the widgets and wires their signals. No state, no computation.

Left: history sidebar. Top: checkpoint picker. Centre: chat view + input. Right: sampling panel.
Bottom: status bar. Conversation state lives in ChatController; background work in Background.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QMainWindow,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop.config.keystore import keystore
from desktop.config.paths import is_demo, nanochat_base_dir
from desktop.config.servers import publish as publish_servers
from desktop.config.settings import Settings
from desktop.engine.backend import ModelInfo
from desktop.engine.params import FILTER_KEYS, SamplingParams
from desktop.qt.app.background import Background
from desktop.qt.app.hf_export_task import HFExportTask
from desktop.qt.app.log_folder import open_log_folder
from desktop.qt.app.shortcuts_dialog import ShortcutsDialog
from desktop.qt.chat.chat_view import ChatView
from desktop.qt.chat.controller import ChatController
from desktop.qt.chat.history_sidebar import HistorySidebar
from desktop.qt.chat.input_box import InputBox
from desktop.qt.compare.controller import CompareController
from desktop.qt.compare.view import CompareView
from desktop.qt.run.report_task import RunReportTask
from desktop.qt.run.sweep_task import BitsSweepTask, CoreSweepTask, GradedSweepTask, SampleSweepTask
from desktop.qt.run.view import CORE_LITE, RunView
from desktop.qt.widgets.checkpoint_picker import CheckpointPicker
from desktop.qt.widgets.error_banner import ErrorBanner
from desktop.qt.widgets.model_picker import ModelPicker
from desktop.qt.widgets.sampling_panel import SamplingPanel
from desktop.qt.widgets.servers_dialog import ServersDialog
from desktop.qt.widgets.status_bar import StatusBar
from desktop.qt.widgets.theme import apply_theme


def _qapp() -> QApplication:
    """The running application; instance() is typed QCoreApplication, but widgets need this one."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    return app


FOLD_PANEL_BELOW = 1100  # window width (px) below which the Parameters panel folds by itself
SIDEBAR_WIDTH, PANEL_WIDTH = 240, 300  # their widths when there is room
CHAT_ROOM = 360  # the conversation's width the side panels leave it when they can
MAX_OTHER_RUN_DRAFTS = 8  # other runs of a base dir the speed section offers as drafts


class MainWindow(QMainWindow):
    """Composes the window and connects signals in ``_connect_signals``."""

    def __init__(
        self,
        controller: ChatController,
        background: Background,
        settings: Settings,
        compare: CompareController | None = None,
    ) -> None:
        super().__init__()
        self.controller = controller
        self.background = background
        self.settings = settings
        self.setWindowTitle("Nanoscope")
        self.setObjectName("MainWindow")

        self.picker = CheckpointPicker()
        self.model_picker = ModelPicker(self)  # Ctrl+K
        self._open_after_scan: Path | None = None  # a folder just opened, to load once listed
        self.banner = ErrorBanner()
        self.chat = ChatView()
        self.input = InputBox()
        self.sidebar = HistorySidebar()
        self.sampling = SamplingPanel()
        self.status = StatusBar()
        self.setStatusBar(self.status)

        centre = QWidget()
        col = QVBoxLayout(centre)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(0)
        col.addWidget(self.banner)
        col.addWidget(self.chat, 1)
        col.addWidget(self.input)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(centre)
        self.splitter.addWidget(self.sampling)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([SIDEBAR_WIDTH, 720, PANEL_WIDTH])
        self._folded_for_width = False  # the Parameters panel was folded because the window is narrow
        self._kept_open = False  # the user unfolded it on a narrow window: leave it open
        self.splitter.setChildrenCollapsible(True)
        self.sampling.collapsed_changed.connect(self._give_room_to_chat)

        chat_page = QWidget()
        layout = QVBoxLayout(chat_page)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.picker)
        layout.addWidget(self.splitter, 1)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(chat_page, "Chat")
        self.compare = compare
        self.compare_view = CompareView(compare) if compare is not None else None
        if self.compare_view is not None:
            self.tabs.addTab(self.compare_view, "Compare")
        self.run_view = RunView()
        self.sample_sweep = SampleSweepTask(self)
        self.graded_sweep = GradedSweepTask(self)
        self.bits_sweep = BitsSweepTask(self)
        self.core_sweep = CoreSweepTask(self)
        self.run_report = RunReportTask(self.run_view.save_plots, self)
        self.tabs.addTab(self.run_view, "Run")
        self.setCentralWidget(self.tabs)

        self._restore_settings()
        self._build_actions()
        self._connect_signals()

    # ----- construction ------------------------------------------------------------------

    def _restore_settings(self) -> None:
        geometry = self.settings.get("window_geometry")
        if geometry:
            self.restoreGeometry(QByteArray(base64.b64decode(geometry)))
        else:
            self.resize(1280, 800)
        self.sampling.set_values(
            {**self.settings.get("sampling"), "system_prompt": self.settings.get("system_prompt")}
        )
        self.sampling.set_user_presets(self.settings.get("sampling_presets"))
        self.sampling.speculative.set_value(self.settings.get("draft"), self.settings.get("draft_k"))
        self.sampling.speculative.changed.connect(self._on_draft)
        self.sampling.setVisible(self.settings.get("sampling_panel_visible"))
        self.input.set_enter_sends(self.settings.get("enter_sends"))
        self.picker.set_precision(self.settings.get("dtype"))
        for folder in self.settings.get("checkpoint_folders"):  # opened in an earlier session
            if Path(folder) not in self.background.extra_dirs:
                self.background.extra_dirs.append(Path(folder))

    def _build_actions(self) -> None:
        """Menus and shortcuts. Every action is also a window-wide shortcut."""
        bar = self.menuBar()
        menus = {name: bar.addMenu(name) for name in ("&File", "&View", "&Settings", "&Help")}

        def action(menu: str, text: str, shortcut: str | None, slot, checked: bool | None = None) -> QAction:
            act = QAction(text, self)
            if shortcut:
                act.setShortcut(QKeySequence(shortcut))
                act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            if checked is not None:
                act.setCheckable(True)
                act.setChecked(checked)
                act.toggled.connect(slot)
            else:
                act.triggered.connect(slot)
            menus[menu].addAction(act)
            self.addAction(act)
            return act

        action("&File", "New chat", "Ctrl+N", self.controller.new_chat)
        action("&File", "Open checkpoint folder…", "Ctrl+O", self.picker.open_folder_dialog)
        action("&File", "Pick checkpoint", "Ctrl+K", self.picker.open_popup)
        action("&File", "Search history", "Ctrl+F", self.sidebar.focus_search)
        self.hf_export = HFExportTask(self)
        self.hf_export.done.connect(self._on_notice)
        action("&File", "Export to Hugging Face…", None, self._export_to_hf)
        menus["&File"].addSeparator()
        action("&File", "Quit", "Ctrl+Q", self.close)
        action("&View", "Stop generating", "Esc", self.controller.stop)
        action("&View", "Regenerate last reply", "Ctrl+R", self._regenerate_last)
        action("&View", "Copy last reply", "Ctrl+Shift+C", self._copy_last)
        action("&View", "Raw tokens", "Ctrl+Shift+R", self._toggle_raw)
        action("&View", "Draft colours", "Ctrl+Shift+D", self._toggle_draft_colours)
        action(
            "&View",
            "Sampling panel",
            "Ctrl+Shift+S",
            lambda: self.sampling.setVisible(self.sampling.isHidden()),
        )
        theme_menu = menus["&View"].addMenu("Theme")
        group = QActionGroup(self)
        for mode, label in (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark")):
            act = theme_menu.addAction(label)
            act.setCheckable(True)
            act.setChecked(self.settings.get("theme") == mode)
            act.triggered.connect(lambda _on=False, m=mode: self._set_theme(m))
            group.addAction(act)
        action(
            "&Settings",
            "Enter sends (Shift+Enter for a new line)",
            None,
            self._set_enter_sends,
            checked=self.settings.get("enter_sends"),
        )
        action("&Settings", "Servers…", None, self._open_servers)
        action("&Help", "Keyboard shortcuts", "F1", lambda: ShortcutsDialog(self).exec())
        action("&Help", "Open log folder", None, open_log_folder)

    def _set_theme(self, mode: str) -> None:
        self.settings.set("theme", mode)
        apply_theme(_qapp(), mode)

    def _set_enter_sends(self, on: bool) -> None:
        self.settings.set("enter_sends", on)
        self.input.set_enter_sends(on)

    def _connect_signals(self) -> None:
        c, bg = self.controller, self.background
        # checkpoints
        bg.checkpoints_found.connect(self.picker.set_entries)
        if self.compare_view is not None:
            bg.checkpoints_found.connect(self.compare_view.set_entries)
            self.tabs.currentChanged.connect(self._on_tab)
            compare = self.compare_view.controller
            compare.saved.connect(lambda _id: c.refresh_list())
            compare.saved.connect(self._sync_sidebar)
            compare.comparison_opened.connect(self._sync_sidebar)
            compare.busy_changed.connect(self._sync_sidebar)  # a new run is not the saved one
        bg.checkpoints_found.connect(self._autoload_once)
        # the run timeline
        bg.checkpoints_found.connect(self.run_view.set_entries)
        self.run_view.run_chosen.connect(bg.read_timeline)
        bg.timeline_ready.connect(self.run_view.show_timeline)
        bg.timeline_failed.connect(self.run_view.show_problem)
        self.run_view.open_step.connect(self._open_from_run)
        self.run_view.compare_steps.connect(self._compare_from_run)
        sweep = self.sample_sweep
        self.run_view.samples_wanted.connect(sweep.start)
        self.run_view.samples_stopped.connect(sweep.stop)
        sweep.sample.connect(self.run_view.add_sample)
        sweep.progress.connect(self.run_view.show_sweep_progress)
        sweep.finished.connect(self.run_view.sweep_done)
        self.run_view.report_wanted.connect(self._write_run_report)
        view = self.run_view
        view.eval_wanted.connect(self._evaluate)
        for task in (self.graded_sweep, self.bits_sweep, self.core_sweep):
            view.eval_stopped.connect(task.stop)
            task.progress.connect(view.show_eval_progress)
            task.scored.connect(view.show_scores)
            task.kept.connect(view.note_kept)
            task.finished.connect(view.eval_done)
        self.graded_sweep.questions.connect(view.choices_read)
        self.graded_sweep.flipped.connect(view.choices_flipped)
        view.compare_question.connect(self._compare_question)
        self.run_report.finished.connect(self.run_view.report_done)
        bg.summary_ready.connect(self._on_summary)
        self.picker.selection_changed.connect(bg.summarize)
        self.picker.load_requested.connect(c.load_checkpoint)
        self.picker.folder_chosen.connect(self._on_folder)
        self.picker.picker_requested.connect(self._open_model_picker)
        self.model_picker.load_requested.connect(self._load_picked)
        self.model_picker.summaries_wanted.connect(bg.summarize_many)
        self.model_picker.open_folder_requested.connect(self.picker.open_folder_dialog)
        bg.summary_listed.connect(self.model_picker.set_summary)
        bg.checkpoints_found.connect(self.model_picker.set_entries)
        bg.checkpoints_found.connect(self._load_opened_folder)
        bg.folder_opened.connect(self._on_folder_opened)
        self.picker.precision_changed.connect(self._on_precision)
        c.model_loading.connect(self.picker.set_progress)
        c.model_loaded.connect(self._on_model_loaded)
        c.model_load_failed.connect(self._on_load_failed)
        c.slot.config_needed.connect(self._ask_for_config)
        # chat
        self.input.send_requested.connect(self._send)
        self.input.stop_requested.connect(c.stop)
        self.chat.regenerate_requested.connect(lambda i: c.regenerate(i, *self._request()))
        self.chat.edit_requested.connect(lambda i, text: c.edit_and_resend(i, text, *self._request()))
        self.chat.branch_requested.connect(c.switch_branch)
        self.chat.fork_requested.connect(self._fork)
        self.chat.continue_requested.connect(lambda i: c.continue_reply(i, *self._request()))
        self.chat.copy_requested.connect(lambda text: QApplication.clipboard().setText(text))
        c.conversation_changed.connect(self.chat.set_messages)
        c.conversation_changed.connect(self._sync_sidebar)
        c.reply_started.connect(self.chat.begin_assistant)
        c.reply_event.connect(self.chat.append_event)
        c.reply_finished.connect(self._on_reply_finished)
        c.speed_changed.connect(self.status.set_speed)
        c.busy_changed.connect(self.input.set_generating)
        c.context_changed.connect(self._show_context)
        c.notice.connect(self._on_notice)
        c.notice_withdrawn.connect(self.banner.withdraw)
        # history
        c.conversations_listed.connect(self.sidebar.set_conversations)
        self.sidebar.conversation_selected.connect(self._open_conversation)
        self.sidebar.new_requested.connect(c.new_chat)
        self.sidebar.rename_requested.connect(c.rename)
        self.sidebar.delete_requested.connect(c.delete)
        self.sidebar.undo_delete_requested.connect(c.undelete)
        self.sidebar.export_requested.connect(self._on_export)
        self.sidebar.search_changed.connect(bg.search)
        bg.search_results.connect(self.sidebar.set_search_results)
        # settings
        self.sampling.values_changed.connect(self._on_sampling_changed)
        self.sampling.collapse_btn.clicked.connect(self._on_panel_folded)
        self.sampling.presets_changed.connect(lambda p: self.settings.set("sampling_presets", p))

    # ----- slots -------------------------------------------------------------------------

    def start(self) -> None:
        """Called once the event loop runs: list checkpoints and history, reopen the last model."""
        apply_theme(_qapp(), self.settings.get("theme"))
        self.controller.refresh_list()
        self.background.servers = publish_servers(self.settings)
        self.background.scan()
        for warning in self.settings.warnings:
            self.banner.show_warning("Settings reset", warning)

    def _autoload_once(self, entries: list) -> None:
        """On the first scan: reopen the last checkpoint, else the newest chat one, else the demo."""
        self.background.checkpoints_found.disconnect(self._autoload_once)
        from desktop.config.paths import demo_checkpoint

        last = self.settings.get("last_checkpoint")
        if last.get("dir") and Path(last["dir"]).is_dir():
            target = (Path(last["dir"]), last.get("step"))
        elif entries := [e for e in entries if e.source != "demo"]:
            ranked = sorted(entries, key=lambda e: ({"rl": 0, "sft": 1, "mid": 2}.get(e.source, 3), e.tag))
            target = (ranked[0].path, ranked[0].steps[-1])
        elif (demo := demo_checkpoint()) is not None:
            target = (demo, None)
        else:
            self.banner.show_info(
                "No checkpoints yet", "Train one with nanochat, or use Open folder… to pick one."
            )
            return
        path, step = target
        if step is None:
            from desktop.engine.discovery import latest_step

            step = latest_step(path)
        self.picker.select(path, step)
        self.controller.load_checkpoint(path, step)

    def _open_conversation(self, conv_id: int) -> None:
        """Chats open in the chat view; saved comparisons reopen in the Compare tab. The one on
        screen is only brought to the front (a reply streaming into it goes on)."""
        if self.compare_view is not None and self.sidebar.kind_of(conv_id) == "compare":
            compare = self.compare_view.controller
            shown = compare.conv_id == conv_id and self.tabs.currentWidget() is self.compare_view
            self.tabs.setCurrentWidget(self.compare_view)
            if not shown:
                compare.open_comparison(conv_id)
        else:
            shown = self.controller.conv_id == conv_id and self.tabs.currentIndex() == 0
            self.tabs.setCurrentIndex(0)
            if not shown:
                self.controller.open_conversation(conv_id)
        self._sync_sidebar()

    def _sync_sidebar(self, *_args) -> None:
        """Highlight what the current tab shows: the chat, or the saved comparison (if any)."""
        view = self.compare_view
        if view is not None and self.tabs.currentWidget() is view:
            self.sidebar.select(view.controller.conv_id)
        else:
            self.sidebar.select(self.controller.conv_id)

    def _on_tab(self, index: int) -> None:
        """Entering Compare starts from the chat's sampling values (each pane can override them)."""
        if self.compare_view is not None and self.tabs.widget(index) is self.compare_view:
            self.compare_view.set_sampling(self.sampling.values())
            self.compare_view.set_draft(self.sampling.speculative.value()[0])
        self._sync_sidebar()

    def _on_summary(self, summary) -> None:
        info = {
            "era": summary.era,
            "params": summary.params,
            "dtype": summary.stored_dtype,
            "memory_bytes": summary.memory_estimate(),
            "sequence_len": summary.sequence_len,
            "error": summary.error,
        }
        self.picker.set_summary(info)

    def _open_servers(self) -> None:
        """Settings › Servers; on OK the engine and the model lists learn the new servers."""
        dialog = ServersDialog(self.settings, keystore(), self)
        if dialog.exec():
            self.background.servers = publish_servers(self.settings)
            self.background.scan()
            if dialog.session_note:
                self.banner.show_warning("API key kept for this session only", dialog.session_note)

    def _export_to_hf(self) -> None:
        """File › Export to Hugging Face…: the picked checkpoint into a new folder, off the GUI thread."""
        chosen = self.picker.current()
        if chosen is None:
            self.banner.show_warning("Export to Hugging Face", "Pick a nanochat checkpoint first.")
            return
        out = QFileDialog.getExistingDirectory(self, "Export to Hugging Face: choose a new, empty folder")
        if out and not self.hf_export.start(chosen[0], chosen[1], Path(out), nanochat_base_dir()):
            self.banner.show_warning("Export to Hugging Face", "An export is already running.")
        elif out:
            self.banner.show_info("Export to Hugging Face", f"Exporting {chosen[0].name} to {out}…")

    def _ask_for_config(self, run: str, step: int) -> None:
        """A KempnerForge run keeps its model config in the training TOML, not in the checkpoint:
        let the user point at it (remembered for the run once it loads)."""
        toml, _ = QFileDialog.getOpenFileName(
            self, f"Choose the training TOML of {Path(run).name}", run, "Training config (*.toml)"
        )
        if toml:
            self.controller.load_checkpoint(Path(run), step if step >= 0 else None, Path(toml))

    def _on_folder(self, folder: Path) -> None:
        """Open folder…: look into it first (off the GUI thread); _on_folder_opened reports."""
        self.background.open_folder(folder)

    def _on_folder_opened(self, report) -> None:
        """Say at once what an opened folder holds; remember it, and load it when it can load."""
        if not report.dirs:
            self.banner.show_warning(
                f"Nothing to open in {report.folder.name or report.folder}", report.problem
            )
            return
        folders = self.settings.get("checkpoint_folders")
        self.settings.set(
            "checkpoint_folders", folders + [str(d) for d in report.dirs if str(d) not in folders]
        )
        self.background.extra_dirs.extend(d for d in report.dirs if d not in self.background.extra_dirs)
        if report.problem:
            self.banner.show_error(f"Cannot load {report.dirs[0].name}", report.problem)
        else:
            self._open_after_scan = report.dirs[0]
        self.background.scan()

    def _load_opened_folder(self, entries: list) -> None:
        target, self._open_after_scan = self._open_after_scan, None
        entry = next((e for e in entries if Path(e.path) == target), None) if target else None
        if entry is not None and entry.steps:
            self._load_picked(Path(entry.path), entry.steps[-1])

    def _open_from_run(self, path: Path, step: int) -> None:
        """A point of the Run tab clicked: that step, in Chat."""
        self.tabs.setCurrentIndex(0)
        self.picker.select(Path(path), step)
        self.controller.load_checkpoint(Path(path), step)

    def _write_run_report(self, folder: Path) -> None:
        view = self.run_view
        started = view.timeline is not None and self.run_report.start(
            folder, view.timeline, view.said, view.evals.scores
        )
        if not started:
            view.report_done("A report card is being written; wait for it to finish.")

    def _evaluate(self, kind: str, points: list, data: Path | None) -> None:
        if kind.startswith("core"):
            started = self.core_sweep.start(points, data, CORE_LITE if kind == "core-lite" else None)
        elif kind == "bpb" and data is not None:
            started = self.bits_sweep.start(points, data)
        else:
            started = self.graded_sweep.start(points, data, kind)
        if not started:
            self.run_view.eval_done("another evaluation is running")

    def _compare_question(self, steps: list, question: str) -> None:
        """A flipped question: both steps side by side in Compare, the question ready to send."""
        self._compare_from_run(steps)
        if self.compare_view is not None:
            self.compare_view.input.set_text(question)

    def _fork(self, index: int, position: int, token_id: int, text: str, race: bool) -> None:
        """A token popup's choice: fork the reply here, or race the fork in Compare."""
        if not race:
            self.controller.fork(index, position, *self._request(), token_id=token_id, text=text)
            return
        c = self.controller
        fork = c.fork_at(index, position, token_id, text)
        info = c.slot.info
        if fork is None or info is None or self.compare_view is None or index < 1:
            return
        earlier = [m for _, m in c.path[: index - 1]]
        question = c.path[index - 1][1].plain_text()
        compare = self.compare_view.controller
        # The run's steps (the step sweep) when the picker knows the run, else this checkpoint.
        entry = next((e for e in self.model_picker.entries if Path(e.path) == Path(info.path)), None)
        if not (entry is not None and compare.step_sweep(entry)):
            compare.select(0, Path(info.path), info.step or 0)
            compare.load(0, Path(info.path), info.step or 0)
        compare.race(question, fork, *self._request(), earlier=earlier)
        self.tabs.setCurrentWidget(self.compare_view)

    def _compare_from_run(self, steps: list) -> None:
        """Steps marked on the Run tab: one Compare pane each, loaded."""
        if self.compare_view is None:
            return
        compare = self.compare_view.controller
        while len(compare.panes) < len(steps) and compare.add_pane():
            pass
        for index, (path, step) in enumerate(steps[: len(compare.panes)]):
            compare.select(index, Path(path), step)
            compare.load(index, Path(path), step)
        self.tabs.setCurrentWidget(self.compare_view)

    def _open_model_picker(self) -> None:
        info = self.controller.model_info
        loaded = (Path(info.path), info.step) if info is not None and info.step is not None else None
        self.model_picker.set_loaded(loaded)
        self.model_picker.set_recent(self.settings.get("recent_checkpoints"))
        self.model_picker.open_picker()

    def _load_picked(self, path: Path, step: int) -> None:
        self.picker.select(path, step)
        self.controller.load_checkpoint(path, step)

    def _on_load_failed(self, _target: str, _reason: str) -> None:
        """The banner says why; the picker goes back to the model the replies still come from."""
        self.picker.set_progress(0, "load failed")
        info = self.controller.model_info
        if info is not None and info.step is not None:
            self.picker.select(Path(info.path), info.step)

    def _remember_use(self, info: ModelInfo) -> None:
        """For the picker's "last used" column."""
        if info.step is None:
            return
        recent = self.settings.get("recent_checkpoints")
        recent = [r for r in recent if (r["dir"], r["step"]) != (info.path, info.step)]
        self.settings.set(
            "recent_checkpoints", [{"dir": info.path, "step": info.step, "used": time.time()}, *recent]
        )

    def _on_precision(self, dtype: str) -> None:
        """A new precision applies at once: reload the loaded checkpoint with it."""
        info = self.controller.model_info
        if self.settings.set("dtype", dtype) and info is not None:
            self.controller.load_checkpoint(Path(info.path), info.step)

    def _on_model_loaded(self, info: ModelInfo) -> None:
        self.picker.set_progress(100, "loaded")
        self._remember_use(info)
        self.status.set_device_info(info.device_name, info.precision, info.attention, info.kernels)
        self._show_context(*self.controller.context_usage())
        self.chat.set_model_name(info.name)
        caps = info.capabilities
        self.sampling.set_ignored(set(FILTER_KEYS) - caps.sampling, caps.why_not("sampling"))
        self.chat.set_mode_notice(
            None
            if info.capabilities.chat
            else "Completion mode: this checkpoint has no chat format, so your text is continued."
        )
        self._offer_drafts(info)
        if is_demo(Path(info.path)):
            self.banner.show_info(
                "Demo model",
                "This is a tiny demo model bundled with Nanoscope. "
                "Train your own with nanochat and it will show up here.",
            )

    def _on_draft(self, draft: str, k: int) -> None:
        self.settings.set("draft", draft)
        self.settings.set("draft_k", k)

    def _offer_drafts(self, info: ModelInfo) -> None:
        """The drafts the speed section offers: the model's own copies and MTP head (where it has
        one), its run's other steps, and the latest step of the other runs in its base dir (a
        miniseries' smaller depths share its tokenizer; whether one does is checked by content
        when it is picked)."""
        box = self.sampling.speculative
        box.set_unavailable(info.capabilities.why_not("draft"))
        box.set_head(info.capabilities.draft_head)
        here = Path(info.path)
        entry = next((e for e in self.model_picker.entries if Path(e.path) == here), None)
        steps = [s for s in (entry.steps if entry is not None else []) if s != info.step]
        offered = [(f"Step {s:,} of this run", f"{info.path}@{s}") for s in sorted(steps)]
        if entry is not None and entry.source != "folder":
            base = here.parent.parent  # $NANOCHAT_BASE_DIR/<phase>_checkpoints/<tag>
            same_base = (e for e in self.model_picker.entries if Path(e.path).parent.parent == base)
            others = [e for e in same_base if e.steps and e.source != "folder" and Path(e.path) != here]
            offered += [
                (f"{e.source}/{e.tag}, step {e.steps[-1]:,}", f"{e.path}@{e.steps[-1]}")
                for e in others[:MAX_OTHER_RUN_DRAFTS]
            ]
        box.set_steps(offered)

    def _show_context(self, used: int, total: int) -> None:
        self.status.set_context(used, total)
        self.input.set_hint(f"{used} / {total} context tokens")

    def _on_reply_finished(self, stats: dict) -> None:
        self.chat.end_assistant(stats)
        if "decode_tok_s" in stats:
            self.status.set_speed(stats["decode_tok_s"], stats["ttft_ms"])

    def _on_notice(self, level: str, title: str, message: str) -> None:
        {"error": self.banner.show_error, "warning": self.banner.show_warning}.get(
            level, self.banner.show_info
        )(title, message)

    def _on_sampling_changed(self, values: dict) -> None:
        values = dict(values)
        self.settings.set("system_prompt", values.pop("system_prompt", ""))
        self.settings.set("sampling", values)

    def _on_export(self, conv_id: int, fmt: str) -> None:
        suffix = {"md": "Markdown (*.md)", "json": "JSON (*.json)"}[fmt]
        target, _ = QFileDialog.getSaveFileName(self, "Export conversation", f"conversation.{fmt}", suffix)
        if target:
            self.controller.export(conv_id, fmt, Path(target))

    def _request(self) -> tuple[SamplingParams, str]:
        """The sampling values for the next reply (a fresh seed when the seed is unlocked) and the
        system prompt."""
        values = self.sampling.values()
        values["seed"] = self.sampling.next_seed()
        return SamplingParams.from_dict(values), str(values.get("system_prompt") or "")

    def _send(self, text: str) -> None:
        if self.controller.send(text, *self._request(), prefill=self.input.prefill()):
            self.input.clear()

    def _toggle_raw(self) -> None:
        self.chat.set_raw_mode(not self.chat.raw_mode)

    def _toggle_draft_colours(self) -> None:
        """Colour what speculative decoding drafted and kept, and what the model corrected (in
        Chat's raw token view and Compare's panes, instead of the probabilities)."""
        on = not self.chat.draft_colours
        self.chat.set_draft_colours(on)
        if self.compare_view is not None:
            self.compare_view.set_draft_colours(on)
        if on and not self.chat.raw_mode:
            self.chat.set_raw_mode(True)

    def _regenerate_last(self) -> None:
        last = len(self.controller.path) - 1
        if last >= 0:
            self.controller.regenerate(last, *self._request())

    def _copy_last(self) -> None:
        for _, message in reversed(self.controller.path):
            if message.role == "assistant":
                QApplication.clipboard().setText(message.plain_text())
                return

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_panels()

    def _fit_panels(self) -> None:
        """On a narrow window the Parameters panel folds to its strip (the chat keeps a readable
        width) and unfolds again when there is room, unless the user decided otherwise."""
        narrow = self.width() < FOLD_PANEL_BELOW
        panel = self.sampling
        if not narrow:
            self._kept_open = False
        if narrow and not panel.is_collapsed() and not self._kept_open:
            self._folded_for_width = True
            panel.set_collapsed(True)
        elif not narrow and self._folded_for_width:
            self._folded_for_width = False
            panel.set_collapsed(False)

    def _give_room_to_chat(self, collapsed: bool) -> None:
        """Share the width when the panel folds or unfolds: the conversation keeps CHAT_ROOM px
        where it can (the history list narrows first), and gets what the folded panel gives up."""
        total = sum(self.splitter.sizes())
        sidebar = self.splitter.sizes()[0]
        side_min, panel_min = self.sidebar.minimumWidth(), self.sampling.minimumWidth()
        panel = panel_min if collapsed else max(panel_min, min(PANEL_WIDTH, total - side_min - CHAT_ROOM))
        sidebar = max(side_min, min(max(sidebar, SIDEBAR_WIDTH), total - panel - CHAT_ROOM))
        self.splitter.setSizes([sidebar, max(0, total - sidebar - panel), panel])

    def _on_panel_folded(self) -> None:
        """The user folded or unfolded the panel with its button: that choice stands."""
        self._kept_open = not self.sampling.is_collapsed() and self.width() < FOLD_PANEL_BELOW
        self._folded_for_width = False

    def closeEvent(self, event: QCloseEvent) -> None:
        """Save the layout, then shut the workers down in order (once, however often Qt asks)."""
        if not getattr(self, "_shut_down", False):
            self._shut_down = True
            self.settings.set("window_geometry", base64.b64encode(self.saveGeometry().data()).decode())
            # isHidden, not isVisible: on the Compare tab the panel is shown but its tab is not.
            self.settings.set("sampling_panel_visible", not self.sampling.isHidden())
            if self.compare is not None:
                self.compare.shutdown()
            self.sample_sweep.stop(wait=30.0)  # it ends after the prompt being written
            self.graded_sweep.stop(wait=30.0)  # it ends after the question in hand
            self.bits_sweep.stop(wait=30.0)  # it ends after the window in hand
            self.core_sweep.stop(wait=30.0)  # it ends after the example in hand
            self.run_report.stop(wait=30.0)  # it ends between two chunks of a file
            self.hf_export.stop(wait=30.0)  # it ends at its next stage and removes its folder
            self.controller.shutdown()
        super().closeEvent(event)
