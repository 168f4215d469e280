"""Render each chat-window widget, and a mock window built from them, to PNG (light and dark).

    QT_QPA_PLATFORM=offscreen python docs/screenshots/render_widgets.py [--out /tmp/ui_shots]

No model, worker or database: the widgets get sample data directly. Used to review the look
(alignment, clipping, contrast) without running the app; render.py shots the real window.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication, QMainWindow, QSplitter, QVBoxLayout, QWidget  # noqa: E402

from desktop.engine.discovery import CheckpointSummary  # noqa: E402
from desktop.engine.messages import (  # noqa: E402
    PYTHON,
    PYTHON_OUTPUT,
    TEXT,
    THOUGHT,
    TOOL_QUERY,
    TOOL_RESULT,
    Message,
    Part,
    TokenEvent,
)
from desktop.qt.app.shortcuts_dialog import ShortcutsDialog  # noqa: E402
from desktop.qt.chat.chat_view import ChatView  # noqa: E402
from desktop.qt.chat.history_sidebar import MARK_END, MARK_START, HistorySidebar  # noqa: E402
from desktop.qt.chat.input_box import InputBox  # noqa: E402
from desktop.qt.widgets.checkpoint_picker import CheckpointPicker  # noqa: E402
from desktop.qt.widgets.error_banner import ErrorBanner  # noqa: E402
from desktop.qt.widgets.model_picker import ModelPicker  # noqa: E402
from desktop.qt.widgets.sampling_panel import SamplingPanel  # noqa: E402
from desktop.qt.widgets.status_bar import StatusBar  # noqa: E402
from desktop.qt.widgets.theme import apply_theme  # noqa: E402

SAMPLING = {
    "temperature": 0.8,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "max_tokens": 512,
    "seed": 1234,
}
META = {
    "sampling": SAMPLING,
    "tag": "d20",
    "step": 21400,
    "era": "E7",
    "dtype": "bfloat16",
    "stats": {"new_tokens": 96, "decode_tok_s": 142.7, "ttft_ms": 38.0, "stopped": "stop_token"},
}


@dataclass
class Row:
    id: int
    title: str
    updated: float
    kind: str


@dataclass
class Hit:
    conversation_id: int
    title: str
    snippet: str


@dataclass
class Entry:
    source: str
    tag: str
    path: Path
    steps: list[int]


def conversation() -> list[Message]:
    reply = Message(
        "assistant",
        [
            Part(TEXT, "Let me work that out with the calculator.\n"),
            Part(PYTHON, "12*7"),
            Part(PYTHON_OUTPUT, "84"),
            Part(
                TEXT,
                "\nSo **12 × 7 = 84**. In Python:\n\n```python\ndef mul(a: int, b: int) -> int:\n"
                "    return a * b  # 84 for (12, 7)\n```\n",
            ),
        ],
        dict(META),
    )
    table = Message(
        "assistant",
        [
            Part(
                TEXT,
                "## Compared\n\n| model | params | `sequence_len` |\n|---|--:|:-:|\n| d20 | 561M | 2048 |\n"
                "| d32 | 1.9B | 2048 |\n\n- bullets *work*\n  - and nest\n1. numbers too\n2. with `code`\n\n"
                "> A quote, and a [link](https://github.com/karpathy/nanochat). Raw <b>html</b> stays text.",
            )
        ],
        dict(META),
    )
    fork = Message(
        "assistant",
        [
            Part(THOUGHT, "The user wants the weather. I should call the tool rather than guess."),
            Part(TOOL_QUERY, 'weather("Paris")'),
            Part(TOOL_RESULT, "18°C, light rain"),
            Part(TEXT, "It is 18 °C with light rain in Paris."),
        ],
        dict(META),
    )
    return [
        Message.of_text("user", "What is 12 times 7?"),
        reply,
        Message.of_text("user", "Compare d20 and d32 in a table.\nKeep it short <please>."),
        table,
        Message.of_text("user", "And the weather in Paris?"),
        fork,
    ]


def settle(app: QApplication) -> None:
    for _ in range(4):
        app.processEvents()


def shoot(widget: QWidget, path: Path, app: QApplication, size: tuple[int, int | None] | None = None) -> None:
    """Save ``widget`` as a PNG; a height of None means the widget's natural height at that width."""
    if size:
        width, height = size
        widget.resize(width, height or widget.sizeHint().height())
    widget.show()
    settle(app)
    widget.grab().save(str(path))
    print(path)


def stream_into(view: ChatView, app: QApplication) -> None:
    reply = Message("assistant", [], dict(META, stats={}))
    view.begin_assistant(reply)
    events = [
        TokenEvent(1, "Sure", False, TEXT),
        TokenEvent(2, ", computing", False, TEXT),
        TokenEvent(3, "", False, PYTHON, "<|python_start|>"),
        TokenEvent(4, "3", False, PYTHON),
        TokenEvent(5, "*", False, PYTHON),
        TokenEvent(6, "14", False, PYTHON),
        TokenEvent(7, "", False, PYTHON, "<|python_end|>"),
        TokenEvent(8, "", True, PYTHON_OUTPUT, "<|output_start|>"),
        TokenEvent(9, "42", True, PYTHON_OUTPUT),
        TokenEvent(10, "", True, PYTHON_OUTPUT, "<|output_end|>"),
        TokenEvent(11, "\n```py\nprint(3 * 14", False, TEXT),
    ]
    for ev in events:
        reply.add_event(ev)
        view.append_event(ev)
    view.streaming.flush()
    settle(app)


def main_window(app: QApplication, dark: bool) -> QMainWindow:
    win = QMainWindow()
    picker = CheckpointPicker()
    picker.set_entries(
        [
            Entry("sft", "d20", Path("/data/chatsft_checkpoints/d20"), [700, 1400, 21400]),
            Entry("base", "d32", Path("/data/base_checkpoints/d32"), [71680]),
        ]
    )
    picker.set_summary(
        {
            "era": "E7",
            "params": 561_000_000,
            "dtype": "bfloat16",
            "sequence_len": 2048,
            "memory_bytes": 1_350_000_000,
            "device": "cuda",
        }
    )
    sidebar = HistorySidebar()
    now = time.time()
    sidebar.set_conversations(
        [
            Row(1, "What is 12 times 7?", now - 30, "chat"),
            Row(2, "Compare d20 and d32", now - 3 * 3600, "chat"),
            Row(3, "Once upon a time", now - 86400 * 1.5, "completion"),
            Row(4, "A very long conversation title that needs eliding", now - 86400 * 20, "chat"),
        ]
    )
    sidebar.select(1)
    chat = ChatView()
    msgs = conversation()
    chat.set_messages(msgs, [(0, 1), (1, 3), (0, 1), (0, 1), (0, 1), (0, 1)])
    banner = ErrorBanner()
    banner.show_warning(
        "Checkpoint warning",
        "softcap is ambiguous for E5 checkpoints: using 15 (nanochat's value at the time)",
        details="meta_021400.json has no 'softcap' field",
    )
    entry = InputBox()
    entry.set_hint("412 / 2048 tokens")
    sampling = SamplingPanel()
    status = StatusBar()
    status.set_device_info("CUDA: NVIDIA H100 80GB HBM3", "bfloat16", "flash (SDPA)")
    status.set_speed(142.7, 38)
    status.set_context(1720, 2048)
    centre = QWidget()
    col = QVBoxLayout(centre)
    col.setContentsMargins(0, 0, 0, 0)
    col.setSpacing(0)
    for w, stretch in ((banner, 0), (chat, 1), (entry, 0)):
        col.addWidget(w, stretch)
    splitter = QSplitter(Qt.Orientation.Horizontal)
    for w in (sidebar, centre, sampling):
        splitter.addWidget(w)
    splitter.setStretchFactor(1, 1)
    splitter.setSizes([250, 800, 300])
    body = QWidget()
    lay = QVBoxLayout(body)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(0)
    lay.addWidget(picker)
    lay.addWidget(splitter, 1)
    win.setCentralWidget(body)
    win.setStatusBar(status)
    win.resize(1440, 900)
    win.show()
    settle(app)
    stream_into(chat, app)
    return win


def model_picker() -> ModelPicker:
    """Ctrl+K with a few runs, an opened folder, their shapes and when each was last used."""
    sft, base, mine = (
        Path(p) for p in ("/data/chatsft_checkpoints/d20", "/data/base_checkpoints/d32", "/home/me/my-run")
    )
    dialog = ModelPicker()
    dialog.set_entries(
        [
            Entry("base", "d32", base, [71680]),
            Entry("sft", "d20", sft, [700, 1400, 21400]),
            Entry("folder", "my-run", mine, [300]),
        ]
    )
    shapes = {sft: ("E7", 561_000_000, 2048, "bfloat16"), base: ("E7", 1_880_000_000, 2048, "bfloat16")}
    shapes[mine] = ("E2", 85_000_000, 1024, "float32")
    for path, steps in ((base, [71680]), (sft, [700, 1400, 21400]), (mine, [300])):
        era, params, ctx, dtype = shapes[path]
        for step in steps:
            dialog.set_summary(
                CheckpointSummary(path, step, era, params, ctx, 65536, 20, 1280, dtype, params * 2, 40960)
            )
    now = time.time()
    dialog.set_recent([{"dir": str(sft), "step": 1400, "used": now - 3 * 86400}])
    dialog.set_loaded((sft, 21400))
    dialog.highlight(sft, 21400)
    return dialog


def render(app: QApplication, out: Path, mode: str) -> None:
    apply_theme(app, mode)
    dark = mode == "dark"
    window = main_window(app, dark)
    shoot(window, out / f"window-{mode}.png", app)
    shoot(window, out / f"window-narrow-{mode}.png", app, (1000, 680))

    shoot(model_picker(), out / f"model-picker-{mode}.png", app, (900, 330))

    chat = ChatView()
    shoot(chat, out / f"chat-empty-{mode}.png", app, (760, 420))
    chat.set_mode_notice("Completion mode: this checkpoint has no chat format, so your text is continued.")
    chat.set_messages(conversation())
    shoot(chat, out / f"chat-{mode}.png", app, (860, 1500))

    raw = ChatView()
    raw.set_messages(conversation()[:2])
    raw.widgets[-1].set_raw_tokens(
        [
            ("<|assistant_start|>", False),
            ("Let", False),
            (" me", False),
            (" work", False),
            ("\n", False),
            ("<|python_start|>", False),
            ("12", False),
            ("*", False),
            ("7", False),
            ("<|python_end|>", False),
            ("<|output_start|>", True),
            ("84", True),
            ("<|output_end|>", True),
            ("So", False),
            ("<|assistant_end|>", False),
        ]
    )
    shoot(raw, out / f"raw-tokens-{mode}.png", app, (760, 420))

    panel = SamplingPanel()
    shoot(panel, out / f"sampling-{mode}.png", app, (300, 900))
    panel.set_collapsed(True)
    shoot(panel, out / f"sampling-collapsed-{mode}.png", app, (300, 300))

    side = HistorySidebar()
    now = time.time()
    side.set_conversations([Row(i, f"Conversation {i}", now - i * 5000, "chat") for i in range(1, 6)])
    side.delete(3)
    shoot(side, out / f"sidebar-{mode}.png", app, (260, 480))
    side.search.setText("paris")
    side.set_search_results([Hit(5, "Weather", f"… the weather in {MARK_START}Paris{MARK_END} today …")])
    shoot(side, out / f"sidebar-search-{mode}.png", app, (260, 200))

    box = InputBox()
    box.set_text("A first line\nand a second one")
    box.set_hint("412 / 2048 tokens")
    shoot(box, out / f"input-{mode}.png", app, (760, None))
    box.set_generating(True)
    shoot(box, out / f"input-generating-{mode}.png", app, (760, None))

    for level in ("error", "warning", "info"):
        banner = ErrorBanner()
        getattr(banner, f"show_{level}")(
            f"A {level} title",
            "One readable line explaining what happened and why "
            "it matters, long enough that it must be elided at this width",
            details="Traceback (most recent call last):\n  File …" if level == "error" else None,
        )
        if level == "error":
            banner.more.setChecked(True)
        shoot(banner, out / f"banner-{level}-{mode}.png", app, (760, None))

    bar = StatusBar()
    bar.set_device_info("CPU · 8 threads", "float32", "sdpa")
    bar.set_speed(21.4, 310)
    bar.set_context(1900, 2048)
    shoot(bar, out / f"status-{mode}.png", app, (900, 30))

    picker = CheckpointPicker()
    shoot(picker, out / f"picker-empty-{mode}.png", app, (1200, 50))
    picker.set_entries([Entry("sft", "d20", Path("/data/d20"), [700, 21400])])
    picker.set_summary(
        {"error": "meta_021400.json: unknown architecture 'moe' (nanochat MoE is not supported)"}
    )
    picker.set_progress(40, "checking values")
    shoot(picker, out / f"picker-loading-{mode}.png", app, (1200, 50))

    shoot(ShortcutsDialog(), out / f"shortcuts-{mode}.png", app)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("/tmp/ui_shots"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    for mode in ("light", "dark"):
        render(app, args.out, mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
