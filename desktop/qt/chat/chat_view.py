"""The conversation: a centred column of message widgets, the streaming reply, and auto-scroll.

Long chats stay fast because only the newest ``BATCH`` messages get widgets at first; older ones
are built a batch at a time when the user scrolls near the top, keeping the view still. A
conversation that is shown again (the controller re-sends it after every turn) reuses the
widgets of unchanged messages instead of rebuilding them.

Auto-scroll follows the reply while the view is at the bottom; scrolling up stops it and shows
a "jump to bottom" button, and scrolling back down (or the button) resumes it.
"""

from __future__ import annotations

import shiboken6
from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QScrollArea,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from superqt.utils import qdebounced

from desktop.engine.messages import Message, TokenEvent
from desktop.qt.chat.message_widget import MessageWidget
from desktop.qt.chat.waiting_block import WaitingBlock
from desktop.qt.widgets import icons, theme
from desktop.qt.widgets.fork_popup import ForkPopup
from desktop.qt.widgets.token_records import TokenRecord, records_of

BATCH = 40  # message widgets built at once
COLUMN_MAX_WIDTH = 860
FOLLOW_SLACK_PX = 32  # this close to the bottom counts as "at the bottom"
LOAD_OLDER_PX = 400  # this close to the top builds the previous batch
PLACEHOLDER = "Pick a checkpoint and say hello"
READY = "Say hello to {name}"  # the placeholder once a model is loaded


class _Column(QWidget):
    """The scrolled content: keeps messages in a readable, centred column on wide windows."""

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("ChatColumn")
        self.box = QVBoxLayout(self)
        self.box.setSpacing(10)
        self.box.addStretch(1)

    def resizeEvent(self, event) -> None:
        side = max(20, (event.size().width() - COLUMN_MAX_WIDTH) // 2)
        self.box.setContentsMargins(side, 18, side, 24)
        super().resizeEvent(event)


class ChatView(QWidget):
    """Shows one conversation branch and streams the reply into it.

    Signals (indices are positions in the list given to ``set_messages``):
        regenerate_requested(int), edit_requested(int, str), branch_requested(int, int direction),
        copy_requested(str), continue_requested(int), and fork_requested(int message, int token
        position, int alternative id or -1, str text written, bool race in Compare).

    ``begin_assistant(meta)`` takes the reply's meta (``sampling``, ``tag``, ``step`` … as the
    controller stores it); ``end_assistant(stats)`` its stats (``new_tokens``, ``decode_tok_s``,
    ``ttft_ms``, ``stopped`` or ``error``). ``widgets`` lists the message widgets built so far,
    oldest first (with a long chat, only the newest ones until the user scrolls up).
    """

    regenerate_requested = Signal(int)
    edit_requested = Signal(int, str)
    branch_requested = Signal(int, int)
    fork_requested = Signal(int, int, int, str, bool)
    inside_requested = Signal(int, int)  # message index, token index (issue #45)
    continue_requested = Signal(int)
    copy_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Conversation")
        self.messages: list[Message] = []
        self.siblings: list[tuple[int, int]] = []
        self.widgets: list[MessageWidget] = []
        self.streaming: MessageWidget | None = None
        self._inside_popup: ForkPopup | None = None  # the token popup that last asked for Inside
        self.raw_mode = False
        self.draft_colours = False  # the raw views colour drafts, not probabilities
        self._first = 0  # index of the oldest message that has a widget
        self._follow = True
        self._anchor: tuple[MessageWidget, int] | None = None  # keeps the view still while prepending
        self._adjusting = False
        # Once, after the event that asked for it: widgets are not built inside a scroll signal.
        self._load_older_soon = qdebounced(self._load_older, timeout=0, parent=self)

        self.notice = QLabel()
        self.notice.setObjectName("ModeNotice")
        self.notice.setWordWrap(True)
        self.notice.setAccessibleName("Mode notice")
        self.notice.hide()

        self.column = _Column()
        self.waiting = WaitingBlock()  # a message sent before the model was ready, last
        self.waiting.hide()
        self.column.box.addWidget(self.waiting)
        self.scroll_area = QScrollArea()
        self.scroll_area.setObjectName("ChatScroll")
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll_area.setWidget(self.column)

        self.placeholder = self._build_placeholder()
        self.stack = QStackedWidget()
        self.stack.addWidget(self.placeholder)
        self.stack.addWidget(self.scroll_area)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(self.notice)
        lay.addWidget(self.stack, 1)

        self.jump_btn = QToolButton(self)
        self.jump_btn.setObjectName("JumpToBottom")
        self.jump_btn.setIcon(icons.icon("arrow-down", theme.colors().text, 18))
        self.jump_btn.setIconSize(QSize(18, 18))
        self.jump_btn.setFixedSize(34, 34)
        self.jump_btn.setToolTip("Jump to the latest message")
        self.jump_btn.setAccessibleName("Jump to the latest message")
        self.jump_btn.clicked.connect(self.scroll_to_bottom)
        self.jump_btn.hide()

        bar = self.scroll_area.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range_changed)

    def _build_placeholder(self) -> QWidget:
        page = QWidget()
        page.setObjectName("ChatPlaceholder")
        lay = QVBoxLayout(page)
        lay.addStretch(1)
        self.placeholder_icon = QLabel()
        self.placeholder_icon.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder_icon.setPixmap(icons.avatar("assistant", theme.is_dark(), 44))
        title = self.placeholder_title = QLabel(PLACEHOLDER)
        title.setObjectName("PlaceholderTitle")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        title.setWordWrap(True)
        hint = QLabel("Ctrl+K chooses a checkpoint  ·  F1 lists the keyboard shortcuts")
        hint.setObjectName("Muted")
        hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        hint.setWordWrap(True)  # a narrow window folds it instead of growing for it
        for w in (self.placeholder_icon, title, hint):
            lay.addWidget(w)
        lay.addStretch(2)
        return page

    # ----- content ---------------------------------------------------------------------------

    def set_model_name(self, name: str | None) -> None:
        """The model loaded (None: none), so an empty chat invites the right next step."""
        self.placeholder_title.setText(READY.format(name=name) if name else PLACEHOLDER)

    def set_mode_notice(self, text: str | None) -> None:
        """A strip above the conversation (e.g. completion mode); None hides it."""
        self.notice.setText(text or "")
        self.notice.setVisible(bool(text))

    def set_waiting(self, text: str, line: str, percent: int) -> None:
        """Show ``text`` (the user's message, "" for none) after the conversation, waiting for the
        model, with ``line`` saying for what and the load's ``percent``."""
        appears = bool(text) and self.waiting.isHidden()
        if text:
            self.waiting.show_waiting(text, line, percent)
        if appears:
            self.column.box.removeWidget(self.waiting)  # right after the messages
            self.column.box.insertWidget(len(self.widgets), self.waiting)
        self.waiting.setVisible(bool(text))
        self._update_page()
        if appears:  # once: reading back up while it waits is not interrupted by its progress
            self.scroll_to_bottom()

    def clear(self) -> None:
        for w in self.widgets:
            self._drop(w)
        self.widgets = []
        self.messages, self.siblings = [], []
        self.streaming = None
        self._first = 0
        self._anchor = None
        self._follow = True
        self._update_page()

    def set_messages(self, messages: list[Message], siblings: list | None = None) -> None:
        """Show ``messages``; ``siblings[i]`` is (0-based index among versions, version count)."""
        same_chat = bool(self.messages and messages) and _same(self.messages[0], messages[0])
        self.messages = list(messages)
        self.siblings = [
            tuple(siblings[i]) if siblings and i < len(siblings) else (0, 1) for i in range(len(messages))
        ]
        self.streaming = None
        first = max(0, len(messages) - BATCH)
        keep: dict[int, MessageWidget] = {}
        for w in self.widgets:
            if first <= w.index < len(messages) and _same(w.message, messages[w.index]):
                keep[w.index] = w
            else:
                self._drop(w)
        for w in keep.values():
            self.column.box.removeWidget(w)
        self.widgets = []
        for i in range(first, len(messages)):
            if i in keep:
                w = keep[i]
                w.set_message(messages[i])
                w.set_sibling(*self.siblings[i])
            else:
                w = self._create(i)
            self.column.box.insertWidget(i - first, w)
            self.widgets.append(w)
        self._first = first
        self._anchor = None
        self._pin_last()
        self._update_page()
        if not same_chat or self._follow:
            self.scroll_to_bottom()

    def _drop(self, w: MessageWidget) -> None:
        """Take a message widget off the column now. Its deletion waits for the event loop, which
        a nested loop (a context menu's, a dialog's) does not run: left in the column until then,
        it would show under the messages of the conversation opened meanwhile."""
        w.hide()
        self.column.box.removeWidget(w)
        w.deleteLater()

    def begin_assistant(self, message: Message, siblings: tuple[int, int] = (0, 1)) -> None:
        """Add the reply that is about to stream (shown as "Generating…" until tokens arrive).

        ``message`` is the controller's own reply object: it grows as tokens arrive, and the
        view only re-renders it. ``siblings`` is its (index, count) among regenerated replies.
        """
        self.messages.append(message)
        index, count = siblings
        self.siblings.append((index, count))
        w = self._create(len(self.messages) - 1, streaming=True)
        self.column.box.insertWidget(len(self.widgets), w)
        self.widgets.append(w)
        self.streaming = w
        if self.raw_mode:  # a fork or a continuation shows the start it kept, then grows
            w.set_raw_tokens(self._raw_of(message) or [])
        self._pin_last()
        self._update_page()
        self.scroll_to_bottom()

    def append_event(self, ev: TokenEvent) -> None:
        if self.streaming is not None:
            self.streaming.append_event(ev)

    def end_assistant(self, stats: dict) -> None:
        if self.streaming is None:
            return
        self.streaming.finish(stats)
        if self.raw_mode:
            self.streaming.set_raw_tokens(self._raw_of(self.streaming.message))
        self.streaming = None

    def _create(self, index: int, streaming: bool = False) -> MessageWidget:
        w = MessageWidget(self.messages[index], self.siblings[index], streaming=streaming)
        w.index = index
        w.copy_requested.connect(self.copy_requested)
        w.regenerate_requested.connect(self._on_regenerate)
        w.edit_submitted.connect(self._on_edit)
        w.branch_requested.connect(self._on_branch)
        w.fork_requested.connect(self._on_fork)
        w.continue_requested.connect(self._on_continue)
        w.inside_requested.connect(lambda token, w=w: self._ask_inside(w, token))
        if self.raw_mode and not streaming:
            w.set_raw_tokens(self._raw_of(w.message))
        w.set_draft_colours(self.draft_colours)
        return w

    def _sender_index(self) -> int:
        sender = self.sender()
        assert isinstance(sender, MessageWidget)  # these slots are connected only in _create
        return sender.index

    def _on_regenerate(self) -> None:
        self.regenerate_requested.emit(self._sender_index())

    def _on_edit(self, text: str) -> None:
        self.edit_requested.emit(self._sender_index(), text)

    def _on_branch(self, direction: int) -> None:
        self.branch_requested.emit(self._sender_index(), direction)

    def _on_fork(self, position: int, token_id: int, text: str, race: bool) -> None:
        self.fork_requested.emit(self._sender_index(), position, token_id, text, race)

    def _ask_inside(self, w: MessageWidget, token: int) -> None:
        self._inside_popup = w.popup
        self.inside_requested.emit(w.index, token)

    def open_popup(self) -> ForkPopup | None:
        """The token popup that last asked for an Inside view, if it is still there."""
        popup = self._inside_popup
        return popup if popup is not None and shiboken6.isValid(popup) else None

    def say_inside(self, line: str) -> None:
        """One line about the Inside view in the token popup that asked (why there is none)."""
        popup = self.open_popup()
        if popup is not None:
            popup.say_inside(line)

    def _on_continue(self) -> None:
        self.continue_requested.emit(self._sender_index())

    def _pin_last(self) -> None:
        for w in self.widgets:
            w.set_actions_pinned(w is self.widgets[-1])

    def _update_page(self) -> None:
        shown = self.messages or not self.waiting.isHidden()
        self.stack.setCurrentWidget(self.scroll_area if shown else self.placeholder)
        self._place_jump_button()

    # ----- raw tokens ------------------------------------------------------------------------

    def set_draft_colours(self, on: bool) -> None:
        """Raw token views colour drafted-and-kept and corrected tokens instead of probabilities."""
        self.draft_colours = on
        for w in self.widgets:
            w.set_draft_colours(on)

    def set_raw_mode(self, on: bool) -> None:
        """Show every message as its raw tokens (what each token read as, special ones by name)."""
        self.raw_mode = on
        for w in self.widgets:
            # A reply still streaming shows what it has so far, then grows.
            shown = (self._raw_of(w.message) or ([] if w is self.streaming else None)) if on else None
            w.set_raw_tokens(shown)

    def _raw_of(self, message: Message) -> list[TokenRecord] | None:
        trace = message.tokens
        if not trace.ids:
            return None
        records = records_of(trace)
        for record, token_id in zip(records, trace.ids, strict=True):
            if not record.text and not record.special:
                record.text = f"#{token_id}"  # replies saved before per-token text was kept
        return records

    # ----- scrolling -------------------------------------------------------------------------

    def scroll_to_bottom(self) -> None:
        self._follow = True
        self._anchor = None
        bar = self.scroll_area.verticalScrollBar()
        self._set_value(bar.maximum())
        self._place_jump_button()

    def is_following(self) -> bool:
        return self._follow

    def _set_value(self, value: int) -> None:
        self._adjusting = True
        self.scroll_area.verticalScrollBar().setValue(value)
        self._adjusting = False

    def _on_scrolled(self, value: int) -> None:
        if self._adjusting:
            return
        bar = self.scroll_area.verticalScrollBar()
        self._follow = value >= bar.maximum() - FOLLOW_SLACK_PX
        self._anchor = None
        self._place_jump_button()
        self._maybe_load_older()

    def _on_range_changed(self, _lo: int, hi: int) -> None:
        if self._follow:
            self._set_value(hi)
        elif self._anchor is not None:
            widget, offset = self._anchor
            self._set_value(widget.y() - offset)
        self._place_jump_button()
        self._maybe_load_older()

    def _maybe_load_older(self) -> None:
        near_top = self.scroll_area.verticalScrollBar().value() <= LOAD_OLDER_PX
        if self._first > 0 and near_top:
            self._load_older_soon()

    def _load_older(self) -> None:
        """Build the previous batch above the current first widget without moving the view."""
        if self._first == 0 or not self.widgets:
            return
        top = self.widgets[0]
        if not self._follow:
            self._anchor = (top, top.y() - self.scroll_area.verticalScrollBar().value())
        start = max(0, self._first - BATCH)
        older = [self._create(i) for i in range(start, self._first)]
        for k, w in enumerate(older):
            self.column.box.insertWidget(k, w)
        self.widgets[:0] = older
        self._first = start

    def _place_jump_button(self) -> None:
        bar = self.scroll_area.verticalScrollBar()
        show = not self._follow and bar.maximum() > 0 and self.stack.currentWidget() is self.scroll_area
        self.jump_btn.setVisible(show)
        if show:
            self.jump_btn.move((self.width() - self.jump_btn.width()) // 2, self.height() - 52)
            self.jump_btn.raise_()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._place_jump_button()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.placeholder_icon.setPixmap(icons.avatar("assistant", theme.is_dark(), 44))
            self.jump_btn.setIcon(icons.icon("arrow-down", theme.colors().text, 18))


def _same(a: Message, b: Message) -> bool:
    return a.role == b.role and a.parts == b.parts
