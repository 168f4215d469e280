"""``nanoscope --smoke-test``: load the bundled demo, ask one question, check the tool call, exit.

Used by packaging/smoke_test.py against the frozen app (and the source tree): it proves the
window, the worker thread, the engine, the tokenizer and the calculator all work together.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from desktop.engine.messages import PYTHON, PYTHON_OUTPUT
from desktop.engine.params import SamplingParams
from desktop.engine.text_lines import one_line

QUESTION = "What is 12 times 7?"
EXPECTED = "84"
TIMEOUT_MS = 180_000


def attach(window) -> None:
    from desktop.config.paths import demo_checkpoint

    controller = window.controller
    demo = demo_checkpoint()

    def finish(ok: bool, text: str) -> None:
        print(one_line(f"SMOKE {'OK' if ok else 'FAIL'} {text}"), flush=True)
        window.exit_code = 0 if ok else 1
        QApplication.quit()

    def on_loaded(_info: object) -> None:
        controller.send(QUESTION, SamplingParams(temperature=0.0, top_k=0, max_tokens=64, seed=42))

    def on_finished(stats: dict) -> None:
        if "error" in stats:
            return finish(False, stats["error"])
        reply = controller.path[-1][1]
        calls = [p.text for p in reply.parts if p.kind == PYTHON]
        outputs = [p.text.strip() for p in reply.parts if p.kind == PYTHON_OUTPUT]
        text = " | ".join(f"{p.kind}:{p.text.strip()}" for p in reply.parts)
        return finish(bool(calls) and EXPECTED in outputs, text)

    if demo is None:
        QTimer.singleShot(0, lambda: finish(False, "the bundled demo model is missing"))
        return
    controller.model_loaded.connect(on_loaded)
    controller.model_load_failed.connect(lambda path, reason: finish(False, f"{path}: {reason}"))
    controller.reply_finished.connect(on_finished)
    QTimer.singleShot(TIMEOUT_MS, lambda: finish(False, "timed out"))
    QTimer.singleShot(0, lambda: controller.load_checkpoint(demo, _latest_step(demo)))
    print(one_line(f"smoke test: loading {demo}"), file=sys.stderr)


def _latest_step(path) -> int:
    from desktop.engine.nanochat.checkpoint import model_steps

    steps = model_steps(path)
    return steps[-1] if steps else 0
