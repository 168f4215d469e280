"""The main window: a shell holding one page per screen (Chat, Compare, Run), the menus, the
notices (shown in the Chat page's banner) and the status bar, and the hand-offs between pages: a
Run step opened in Chat, Run steps or a flipped question raced in Compare, a Chat fork raced in
Compare. Each page wires its own widgets and jobs and shuts them down when the window asks.
"""

from __future__ import annotations

import base64
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog, QLabel, QMainWindow, QTabWidget

from desktop.config import paths
from desktop.config.keystore import keystore
from desktop.config.paths import nanochat_base_dir
from desktop.config.servers import publish as publish_servers
from desktop.config.settings import Settings
from desktop.engine.backend import ModelInfo
from desktop.qt.app.background import Background
from desktop.qt.app.hf_export_task import HFExportTask
from desktop.qt.app.log_folder import open_log_folder
from desktop.qt.app.remeasure_task import RemeasureTask
from desktop.qt.app.server_panel import ServerPanel
from desktop.qt.app.server_task import ServerTask
from desktop.qt.app.shortcuts_dialog import ShortcutsDialog
from desktop.qt.chat.controller import ChatController
from desktop.qt.chat.page import ChatPage
from desktop.qt.compare.controller import CompareController
from desktop.qt.compare.view import CompareView
from desktop.qt.run.page import RunPage
from desktop.qt.widgets.servers_dialog import ServersDialog
from desktop.qt.widgets.status_bar import StatusBar
from desktop.qt.widgets.theme import apply_theme
from desktop.session.serving import ServingSession


def _qapp() -> QApplication:
    """The running application; instance() is typed QCoreApplication, but widgets need this one."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    return app


class MainWindow(QMainWindow):
    """The pages in tabs (Chat first), the menus, and the hand-offs in ``_connect_signals``."""

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

        self.status = StatusBar()
        self.setStatusBar(self.status)
        self.chat_page = ChatPage(controller, background, settings)
        # The chat page's widgets by the names the menus, the hand-offs and the tests use.
        page = self.chat_page
        self.picker, self.model_picker, self.sidebar = page.picker, page.model_picker, page.sidebar
        self.chat, self.input, self.sampling = page.chat, page.input, page.sampling
        self.banner = page.banner  # the window's notices show above the conversation
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.chat_page, "Chat")
        self.compare = compare
        self.compare_view = CompareView(compare) if compare is not None else None
        if self.compare_view is not None:
            self.tabs.addTab(self.compare_view, "Compare")
        self.run_page = RunPage(background)
        self.tabs.addTab(self.run_page, "Run")
        self.setCentralWidget(self.tabs)
        # File › Serve over the OpenAI API…: the server's state, the task that runs it, its panel.
        self.serving = ServingSession()
        self.server_task = ServerTask(self.serving, settings, self)
        self.server_panel: ServerPanel | None = None
        self.serving_label = QLabel()
        self.serving_label.setObjectName("Muted")
        self.serving_label.hide()
        self.status.addPermanentWidget(self.serving_label)
        self.serving.events.changed.connect(self._on_serving)
        self.serving.events.request.connect(self._on_serving)

        geometry = self.settings.get("window_geometry")
        if geometry:
            self.restoreGeometry(QByteArray(base64.b64decode(geometry)))
        else:
            self.resize(1280, 800)
        self._build_actions()
        self._connect_signals()

    # ----- construction ------------------------------------------------------------------

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
        action("&File", "Serve over the OpenAI API…", None, self.open_server_panel)
        menus["&File"].addSeparator()
        action("&File", "Quit", "Ctrl+Q", self.close)
        action("&View", "Stop generating", "Esc", self.controller.stop)
        action("&View", "Regenerate last reply", "Ctrl+R", self.chat_page.regenerate_last)
        action("&View", "Copy last reply", "Ctrl+Shift+C", self.chat_page.copy_last)
        action("&View", "Raw tokens", "Ctrl+Shift+R", self.chat_page.toggle_raw)
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
        self.remeasure = RemeasureTask(self)
        self.remeasure.forgotten.connect(self._on_kernels_forgotten)
        self.remeasure.failed.connect(lambda title, message: self._on_notice("error", title, message))
        action("&Settings", "Re-measure kernels", None, self._remeasure_kernels)
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
        if self.compare_view is not None:
            bg.checkpoints_found.connect(self.compare_view.set_entries)
            bg.checkpoints_found.connect(self.compare_view.controller.runs_listed)
            self.tabs.currentChanged.connect(self._on_tab)
            compare = self.compare_view.controller
            compare.saved.connect(lambda _id: c.refresh_list())
            compare.saved.connect(self._sync_sidebar)
            compare.comparison_opened.connect(self._sync_sidebar)
            compare.busy_changed.connect(self._sync_sidebar)  # a new run is not the saved one
        # hand-offs between pages
        self.run_page.open_step.connect(self._open_from_run)
        self.run_page.compare_steps.connect(self._compare_from_run)
        self.run_page.compare_question.connect(self._compare_question)
        self.chat.fork_requested.connect(self._fork)
        self.sidebar.conversation_selected.connect(self._open_conversation)
        c.conversation_changed.connect(self._sync_sidebar)
        # the banner and the status bar
        self.chat_page.notice.connect(self._on_notice)
        c.notice.connect(self._on_notice)
        c.notice_withdrawn.connect(self.banner.withdraw)
        c.model_loaded.connect(self._on_model_loaded)
        c.context_changed.connect(self.status.set_context)
        c.reply_finished.connect(self._on_reply_finished)
        c.speed_changed.connect(self.status.set_speed)

    # ----- slots -------------------------------------------------------------------------

    def start(self) -> None:
        """Called once the event loop runs: list checkpoints and history, reopen the last model."""
        apply_theme(_qapp(), self.settings.get("theme"))
        self.controller.refresh_list()
        self.background.servers = publish_servers(self.settings)
        self.controller.looking_for_model()  # a message sent meanwhile waits for what it finds
        self.background.scan()
        for warning in self.settings.warnings:
            self.banner.show_warning("Settings reset", warning)

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
        """Entering Compare starts from the chat's sampling values (each pane can override them),
        unless it shows a comparison: then its row keeps the values that comparison ran with."""
        compare = self.compare
        if self.compare_view is not None and self.tabs.widget(index) is self.compare_view:
            if compare is None or not compare.session.has_result():
                self.compare_view.set_sampling(self.chat_page.sampling_state.values())
            self.compare_view.set_draft(self.sampling.speculative.value()[0])
        self._sync_sidebar()

    def _remeasure_kernels(self) -> None:
        """Time every product again: the kept choices go, and the chat's model reloads to re-time."""
        if not self.remeasure.start(paths.kernel_timings_file()):
            self.banner.show_warning("Re-measure kernels", "A re-measure is already running.")

    def _on_kernels_forgotten(self) -> None:
        info = self.controller.model_info
        if info is not None and info.step is not None:
            self.controller.load_checkpoint(Path(info.path), info.step)  # times its products again
        self.banner.show_info(
            "Re-measure kernels",
            "Each model times its products again when it loads; "
            "in the fast and int8 modes its next replies may differ from older ones.",
        )

    def _open_servers(self) -> None:
        """Settings › Servers; on OK the engine and the model lists learn the new servers."""
        dialog = ServersDialog(self.settings, keystore(), self)
        if dialog.exec():
            self.background.servers = publish_servers(self.settings)
            self.background.scan()
            if dialog.session_note:
                self.banner.show_warning("API key kept for this session only", dialog.session_note)

    def open_server_panel(self) -> ServerPanel:
        """File › Serve over the OpenAI API… (one panel, kept while the window lives)."""
        if self.server_panel is None:
            self.server_panel = ServerPanel(
                self.serving,
                self.server_task,
                lambda: self.picker.entries,
                lambda: self.controller.model_info,
                self,
            )
        elif not self.serving.on:
            self.server_panel.refresh_checkpoints()
        self.server_panel.show()
        self.server_panel.raise_()
        return self.server_panel

    def _on_serving(self, *_args) -> None:
        """The status bar says whether the window serves, and where (from the session)."""
        self.serving_label.setText(self.serving.status_line())
        self.serving_label.setVisible(self.serving.on)

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

    def _open_from_run(self, path: Path, step: int) -> None:
        """A point of the Run tab clicked: that step, in Chat."""
        self.tabs.setCurrentIndex(0)
        self.chat_page.load_step(Path(path), step)

    def _compare_question(self, steps: list, question: str) -> None:
        """A flipped question: both steps side by side in Compare, the question ready to send."""
        self._compare_from_run(steps)
        if self.compare_view is not None:
            self.compare_view.input.set_text(question)

    def _fork(self, index: int, position: int, token_id: int, text: str, race: bool) -> None:
        """A token popup's choice: fork the reply here, or race the fork in Compare."""
        if not race:
            self.controller.fork(index, position, *self.chat_page.request(), token_id=token_id, text=text)
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
            compare.load(0, Path(info.path), info.step or 0)
        compare.race(question, fork, *self.chat_page.request(), earlier=earlier)
        self.tabs.setCurrentWidget(self.compare_view)

    def _compare_from_run(self, steps: list) -> None:
        """Steps marked on the Run tab: one Compare pane each, holding exactly that step, loaded."""
        if self.compare_view is None:
            return
        self.compare_view.controller.open_checkpoints([(Path(path), step) for path, step in steps])
        self.tabs.setCurrentWidget(self.compare_view)

    def _on_model_loaded(self, info: ModelInfo) -> None:
        self.status.set_device_info(info.device_name, info.precision, info.attention, info.kernels)
        self.status.set_context(*self.controller.context_usage())

    def _on_reply_finished(self, stats: dict) -> None:
        if "decode_tok_s" in stats:
            self.status.set_speed(stats["decode_tok_s"], stats["ttft_ms"])

    def _on_notice(self, level: str, title: str, message: str) -> None:
        {"error": self.banner.show_error, "warning": self.banner.show_warning}.get(
            level, self.banner.show_info
        )(title, message)

    def _toggle_draft_colours(self) -> None:
        """Colour what speculative decoding drafted and kept, and what the model corrected (in
        Chat's raw token view and Compare's panes, instead of the probabilities)."""
        on = not self.chat.draft_colours
        self.chat.set_draft_colours(on)
        if self.compare_view is not None:
            self.compare_view.set_draft_colours(on)
        if on and not self.chat.raw_mode:
            self.chat.set_raw_mode(True)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.chat_page.fit_to_width(self.width())

    def closeEvent(self, event: QCloseEvent) -> None:
        """Save the layout, then shut the pages' jobs and the workers down in order (once,
        however often Qt asks)."""
        if not getattr(self, "_shut_down", False):
            self._shut_down = True
            self.settings.set("window_geometry", base64.b64encode(self.saveGeometry().data()).decode())
            self.chat_page.shutdown()
            if self.compare is not None:
                self.compare.shutdown()
            self.run_page.shutdown()
            self.hf_export.stop(wait=30.0)  # it ends at its next stage and removes its folder
            self.remeasure.stop(wait=30.0)  # it ends once the tuner's lock is free
            self.server_task.stop(wait=30.0)  # its requests end, its model closes
            self.controller.shutdown()
        super().closeEvent(event)
