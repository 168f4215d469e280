"""Re-rendering a long conversation: set 200 messages (with tool calls and code) into the chat view.

QT_QPA_PLATFORM=offscreen python benchmarks/bench_render.py [--messages 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from support import REPO

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = REPO
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from perf_report import write_section  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, Part  # noqa: E402
from desktop.qt.chat.chat_view import ChatView  # noqa: E402


def conversation(n: int) -> list[Message]:
    out = []
    for i in range(n // 2):
        out.append(Message.of_text("user", f"Question {i}: what is {i} times 7? Also show me some code."))
        out.append(
            Message(
                "assistant",
                [
                    Part(PYTHON, f"{i}*7"),
                    Part(PYTHON_OUTPUT, str(i * 7)),
                    Part(
                        TEXT,
                        f"{i} times 7 is **{i * 7}**.\n\n```python\ndef f(x):\n    return x * 7\n```\n"
                        "- a list item\n- another one\n",
                    ),
                ],
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    app = QApplication.instance() or QApplication([])
    view = ChatView()
    view.resize(900, 800)
    view.show()
    messages = conversation(args.messages)
    first, again = [], []
    for _ in range(3):
        view.clear()
        app.processEvents()
        t0 = time.perf_counter()
        view.set_messages(messages)
        app.processEvents()
        first.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        view.set_messages(messages)
        app.processEvents()
        again.append((time.perf_counter() - t0) * 1000)
    result = {
        "messages": args.messages,
        "first_ms": statistics.median(first),
        "again_ms": statistics.median(again),
    }
    write_section(
        args.out,
        "render",
        f"Showing a {args.messages}-message conversation (tool calls, code, lists): "
        f"{result['first_ms']:.0f} ms from an empty view, {result['again_ms']:.0f} ms when shown again "
        "(median of 3; the view builds the newest messages first and the rest as you scroll up).",
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
