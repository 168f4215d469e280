"""The Chat page: the checkpoint picker on top, the history sidebar, the conversation and its input
in the centre, the Parameters panel on the right (folding on a narrow window), the model picker
(Ctrl+K) and the drafts the speed section offers.

It wires these widgets to the chat controller and to the background scans, and takes each reply's
request from the sampling state. What crosses screens (a saved comparison reopened, a fork raced
in Compare, a step sent from Run) goes through the window.
"""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QApplication, QFileDialog, QSplitter, QVBoxLayout, QWidget

from desktop.config.paths import is_demo
from desktop.config.settings import Settings
from desktop.engine.backend import ModelInfo
from desktop.engine.foreground import set_foreground_busy
from desktop.engine.params import FILTER_KEYS, SamplingParams
from desktop.qt.app.background import Background
from desktop.qt.chat.chat_view import ChatView
from desktop.qt.chat.controller import ONE_WAITS, ChatController
from desktop.qt.chat.history_sidebar import HistorySidebar
from desktop.qt.chat.input_box import STOP_TIP, STOP_WAITING_TIP, InputBox
from desktop.qt.widgets.checkpoint_picker import FOLLOW, CheckpointPicker
from desktop.qt.widgets.error_banner import ErrorBanner
from desktop.qt.widgets.inside_view import InsideView
from desktop.qt.widgets.model_picker import ModelPicker
from desktop.qt.widgets.sampling_panel import SamplingPanel
from desktop.session.sampling import SamplingState

# A background compile waits while the user types, and this long after the last keystroke.
TYPING_HOLD_MS = 1500

FOLD_PANEL_BELOW = 1100  # window width (px) below which the Parameters panel folds by itself
SIDEBAR_WIDTH, PANEL_WIDTH = 240, 300  # their widths when there is room
CHAT_ROOM = 360  # the conversation's width the side panels leave it when they can
MAX_OTHER_RUN_DRAFTS = 8  # other runs of a base dir the speed section offers as drafts


class ChatPage(QWidget):
    """Signals: notice(level, title, message) for the window's banner."""

    notice = Signal(str, str, str)

    def __init__(
        self,
        controller: ChatController,
        background: Background,
        settings: Settings,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.controller = controller
        self.background = background
        self.settings = settings
        self.picker = CheckpointPicker()
        self.model_picker = ModelPicker(self)  # Ctrl+K
        self._open_after_scan: Path | None = None  # a folder just opened, to load once listed
        self.inside_view: InsideView | None = None  # the Inside view open (issue #45)
        self.chat = ChatView()
        self.input = InputBox()
        self.sidebar = HistorySidebar()
        self.sampling_state = SamplingState()
        self.sampling = SamplingPanel(self.sampling_state)

        self.banner = ErrorBanner()  # the window's notices, above the conversation
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
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.picker)
        layout.addWidget(self.splitter, 1)

        # Typing holds background compiles (desktop.engine.foreground) until a pause in it.
        self._typing = QTimer(self, singleShot=True, interval=TYPING_HOLD_MS)
        self._typing.timeout.connect(lambda: set_foreground_busy("typing", False))
        self.input.text_changed.connect(self._on_typing)
        self.destroyed.connect(lambda: set_foreground_busy("typing", False))

        self._restore_settings()
        self._connect_signals()

    def _on_typing(self) -> None:
        set_foreground_busy("typing", True)
        self._typing.start()

    def _restore_settings(self) -> None:
        self.sampling_state.update(
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

    def _connect_signals(self) -> None:
        c, bg = self.controller, self.background
        # checkpoints
        bg.checkpoints_found.connect(self.picker.set_entries)
        bg.checkpoints_found.connect(self._autoload_once)
        bg.summary_ready.connect(self._on_summary)
        self.picker.selection_changed.connect(bg.summarize)
        self.picker.load_requested.connect(self._load_picked)
        bg.checkpoints_found.connect(c.runs_listed)
        self.picker.folder_chosen.connect(bg.open_folder)  # looked into off the GUI thread
        self.picker.picker_requested.connect(self._open_model_picker)
        self.model_picker.load_requested.connect(self.load_step)
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
        self.chat.regenerate_requested.connect(lambda i: c.regenerate(i, *self.request()))
        self.chat.edit_requested.connect(lambda i, text: c.edit_and_resend(i, text, *self.request()))
        self.chat.branch_requested.connect(c.switch_branch)
        self.chat.continue_requested.connect(lambda i: c.continue_reply(i, *self.request()))
        self.chat.copy_requested.connect(lambda text: QApplication.clipboard().setText(text))
        self.chat.inside_requested.connect(c.inside.at)
        c.inside.inside_ready.connect(self._show_inside)
        c.inside.inside_failed.connect(self.chat.say_inside)
        c.conversation_changed.connect(self.chat.set_messages)
        c.reply_started.connect(self.chat.begin_assistant)
        c.reply_event.connect(self.chat.append_event)
        c.reply_finished.connect(self.chat.end_assistant)
        c.busy_changed.connect(self.input.set_generating)
        c.waiting_changed.connect(self._on_waiting)
        c.message_returned.connect(self._give_back)
        self.input.refused.connect(self._on_refused)
        c.context_changed.connect(self._show_context)
        # history
        c.conversations_listed.connect(self.sidebar.set_conversations)
        self.sidebar.new_requested.connect(c.new_chat)
        self.sidebar.rename_requested.connect(c.rename)
        self.sidebar.delete_requested.connect(c.delete)
        self.sidebar.undo_delete_requested.connect(c.undelete)
        self.sidebar.export_requested.connect(self._on_export)
        self.sidebar.search_changed.connect(bg.search)
        bg.search_results.connect(self.sidebar.set_search_results)
        # settings
        self.sampling_state.events.changed.connect(self._on_sampling_changed)
        self.sampling.collapse_btn.clicked.connect(self._on_panel_folded)
        self.sampling.presets_changed.connect(lambda p: self.settings.set("sampling_presets", p))

    # ----- models ------------------------------------------------------------------------

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
            self.notice.emit(
                "info", "No checkpoints yet", "Train one with nanochat, or use Open folder… to pick one."
            )
            self.controller.no_model()
            return
        path, step = target
        followed = next((e for e in entries if Path(e.path) == Path(path) and e.steps), None)
        if last.get("follow") and followed is not None:  # it followed the run: its newest step now
            self.picker.select(Path(path), FOLLOW)
            self.controller.follow(True)
            self.controller.load_checkpoint(Path(path), followed.steps[-1])
            return
        if step is None:
            from desktop.engine.discovery import latest_step

            step = latest_step(path)
        self.load_step(path, step)

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

    def _ask_for_config(self, run: str, step: int) -> None:
        """A KempnerForge run keeps its model config in the training TOML, not in the checkpoint:
        let the user point at it (remembered for the run once it loads)."""
        toml, _ = QFileDialog.getOpenFileName(
            self, f"Choose the training TOML of {Path(run).name}", run, "Training config (*.toml)"
        )
        if toml:
            self.controller.load_checkpoint(Path(run), step if step >= 0 else None, Path(toml))

    def _on_folder_opened(self, report) -> None:
        """Say at once what an opened folder holds; remember it, and load it when it can load."""
        if not report.dirs:
            self.notice.emit(
                "warning", f"Nothing to open in {report.folder.name or report.folder}", report.problem
            )
            return
        folders = self.settings.get("checkpoint_folders")
        self.settings.set(
            "checkpoint_folders", folders + [str(d) for d in report.dirs if str(d) not in folders]
        )
        self.background.extra_dirs.extend(d for d in report.dirs if d not in self.background.extra_dirs)
        if report.problem:
            self.notice.emit("error", f"Cannot load {report.dirs[0].name}", report.problem)
        else:
            self._open_after_scan = report.dirs[0]
        self.background.scan()

    def _load_opened_folder(self, entries: list) -> None:
        target, self._open_after_scan = self._open_after_scan, None
        entry = next((e for e in entries if Path(e.path) == target), None) if target else None
        if entry is not None and entry.steps:
            self.load_step(Path(entry.path), entry.steps[-1])

    def _open_model_picker(self) -> None:
        info = self.controller.model_info
        loaded = (Path(info.path), info.step) if info is not None and info.step is not None else None
        self.model_picker.set_loaded(loaded)
        self.model_picker.set_recent(self.settings.get("recent_checkpoints"))
        self.model_picker.open_picker()

    def load_step(self, path: Path, step: int) -> None:
        """Chat with ``path`` at ``step``: the picker shows it while it loads (also Run's hand-off)."""
        self.picker.select(Path(path), step)
        self.controller.follow(False)
        self.controller.load_checkpoint(Path(path), step)

    def _load_picked(self, path: Path, step: int) -> None:
        """The picker's Load: that step, or with "Latest" the newest one, followed as the run trains."""
        self.controller.follow(self.picker.following())
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
            self.notice.emit(
                "info",
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

    # ----- chat --------------------------------------------------------------------------

    def _show_context(self, used: int, total: int) -> None:
        self.input.set_hint(f"{used} / {total} context tokens")

    def _on_sampling_changed(self, values: dict) -> None:
        values = dict(values)
        self.settings.set("system_prompt", values.pop("system_prompt", ""))
        self.settings.set("sampling", values)

    def _on_export(self, conv_id: int, fmt: str) -> None:
        suffix = {"md": "Markdown (*.md)", "json": "JSON (*.json)"}[fmt]
        target, _ = QFileDialog.getSaveFileName(self, "Export conversation", f"conversation.{fmt}", suffix)
        if target:
            self.controller.export(conv_id, fmt, Path(target))

    def request(self) -> tuple[SamplingParams, str]:
        """The sampling values for the next reply (a fresh seed when the seed is unlocked) and the
        system prompt."""
        return self.sampling_state.next_request()

    def _send(self, text: str) -> None:
        if self.controller.send(text, *self.request(), prefill=self.input.prefill()):
            self.input.clear()

    def _on_waiting(self, text: str, line: str, percent: int) -> None:
        """A message waits for the model: shown in the chat; Stop (and Esc) gives it back."""
        self.chat.set_waiting(text, line, percent)
        self.input.set_generating(bool(text) or self.controller.busy)
        self.input.stop_btn.setToolTip(STOP_WAITING_TIP if text else STOP_TIP)

    def _give_back(self, text: str, prefill: str) -> None:
        """A message that waited in vain goes back to the box, before anything typed since."""
        typed = self.input.text()
        self.input.set_text(f"{text}\n\n{typed}" if typed.strip() else text)
        if prefill:
            self.input.prefill_btn.setChecked(True)
            self.input.prefill_edit.setText(prefill)

    def _on_refused(self) -> None:
        """Enter while a reply comes or a message waits: the text stays, and the banner says why."""
        if self.controller.waiting.held is not None:
            self.notice.emit("info", "Not sent yet", ONE_WAITS)
        else:
            self.notice.emit(
                "info", "Not sent yet", "the reply is still coming; your message stays in the box"
            )

    def _show_inside(self, source, position: int) -> None:
        """A reply's Inside view at ``position``, in its own window (one at a time)."""
        popup = self.chat.open_popup()
        if popup is not None:
            popup.close()
        if self.inside_view is not None:
            self.inside_view.close()
            self.inside_view.deleteLater()
        view = InsideView(source, position)
        view.setParent(self, Qt.WindowType.Window)
        reply_id = self.controller.inside.reply_id_of(source)
        if reply_id is not None:
            view.position_changed.connect(lambda _p: self.controller.inside.save(reply_id))
        self.inside_view = view
        view.show()

    def toggle_raw(self) -> None:
        self.chat.set_raw_mode(not self.chat.raw_mode)
        # the raw tokens hold the Inside buttons: prepare replies' passes while they are shown
        self.controller.inside.set_preparing(self.chat.raw_mode)

    def regenerate_last(self) -> None:
        last = len(self.controller.path) - 1
        if last >= 0:
            self.controller.regenerate(last, *self.request())

    def copy_last(self) -> None:
        for _, message in reversed(self.controller.path):
            if message.role == "assistant":
                QApplication.clipboard().setText(message.plain_text())
                return

    # ----- layout ------------------------------------------------------------------------

    def fit_to_width(self, width: int) -> None:
        """On a narrow window the Parameters panel folds to its strip (the chat keeps a readable
        width) and unfolds again when there is room, unless the user decided otherwise."""
        narrow = width < FOLD_PANEL_BELOW
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
        self._kept_open = not self.sampling.is_collapsed() and self.window().width() < FOLD_PANEL_BELOW
        self._folded_for_width = False

    def shutdown(self) -> None:
        """Remember whether the Parameters panel was shown."""
        # isHidden, not isVisible: on the Compare tab the panel is shown but its tab is not.
        self.settings.set("sampling_panel_visible", not self.sampling.isHidden())
