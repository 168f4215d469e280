"""Render the main window's states to PNG (offscreen) for the README and for review.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/render.py [--theme light|dark] [--out DIR]
        [--size 1360x860]

Runs the real app on the bundled demo model: the empty chat, a chat, a load error, and Compare
with three steps of the demo run (probabilities on, diff A vs C), with its first and last
steps side by side, and with an earlier step drafting for the latest (speculative decoding, draft
colours on). ``--size 800x600`` shows the narrow layout.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import qasync
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _next(signal, accept=lambda *args: True) -> asyncio.Future:
    """A future for the next emission of ``signal`` whose arguments ``accept`` takes."""
    future = asyncio.get_running_loop().create_future()

    def on_signal(*args) -> None:
        if not future.done() and accept(*args):
            future.set_result(args)
            signal.disconnect(on_signal)

    signal.connect(on_signal)
    return future


async def _settle() -> None:
    """Let the window lay itself out and paint before a grab."""
    for _ in range(3):
        QApplication.processEvents()
        await asyncio.sleep(0)


async def started(window, theme: str, size: tuple[int, int] = (1360, 860)) -> None:
    """Show the window in ``theme`` at ``size`` and start it as the app does: the first scan
    lists the checkpoints and the newest one loads."""
    from desktop.qt.widgets.theme import apply_theme

    window.settings.set("theme", theme)  # start() applies the theme of the settings
    apply_theme(QApplication.instance(), theme)
    window.resize(*size)
    window.show()
    loaded = _next(window.controller.model_loaded)
    window.start()
    await loaded


async def scenario(window, out: Path, theme: str, size: tuple[int, int]) -> None:
    from desktop.config.paths import demo_checkpoint
    from desktop.engine.nanochat.checkpoint import model_steps
    from desktop.session.compare.analysis import sweep_steps

    await started(window, theme, size)  # the newest demo step
    c = window.controller
    await _settle()
    window.grab().save(str(out / f"empty-{theme}.png"))

    async def ask(text: str) -> None:
        done = _next(c.reply_finished)
        window.input.editor.setPlainText(text)
        window.input._submit()
        await done
        await _settle()

    window.sampling.apply_preset("Greedy")
    await ask("What is 12 times 7?")
    await ask("How many r are in strawberry?")
    await ask("Who are you?")
    window.grab().save(str(out / f"chat-{theme}.png"))
    window.banner.show_error(
        "Could not load /data/ckpt/d20",
        "model_000500.pt: not a PyTorch checkpoint, or the file is truncated or corrupt",
    )
    await _settle()
    window.grab().save(str(out / f"error-{theme}.png"))
    window.banner.hide()

    demo = demo_checkpoint()
    steps = model_steps(demo)
    view, compare = window.compare_view, window.compare
    window.tabs.setCurrentWidget(view)

    async def compare_steps(chosen: list[int], prompt: str, temperature: float = 0.0) -> None:
        while len(compare.panes) < len(chosen):
            compare.add_pane()
        while len(compare.panes) > len(chosen):
            compare.remove_pane(len(compare.panes) - 1)
        for i, step in enumerate(chosen):
            if compare.panes[i].loaded_key != (demo, step):
                done = _next(compare.pane_loaded, lambda index, _info, i=i: index == i)
                compare.load(i, demo, step)
                await done
        view.temperature.setValue(temperature)
        view.seed.setValue(7)  # one seed for every pane: where they part is the checkpoints' doing
        view.max_tokens.setValue(48)
        finished = _next(compare.busy_changed, lambda busy: not busy)
        view.input.editor.setPlainText(prompt)
        view.input._submit()
        await finished
        await _settle()

    view.overlay_box.setChecked(True)
    await compare_steps(sweep_steps(steps, 3), "How many e are in elephant?")
    view.diff_box.setChecked(True)
    view.diff_b.setCurrentIndex(2)
    view.diff_b.activated.emit(2)
    await _settle()
    window.grab().save(str(out / f"compare-3-panes-{theme}.png"))
    view.diff_box.setChecked(False)
    await compare_steps([steps[0], steps[-1]], "What is 1234 plus 5678?")
    window.grab().save(str(out / f"compare-2-panes-{theme}.png"))

    # Pane A's checkpoint drafts for pane B: B's footer says how much of A's draft it kept.
    view.overlay_box.setChecked(False)
    window.sampling.speculative.k.setValue(3)  # Compare's draft length is Chat's
    await compare_steps([steps[0], steps[-1]], "What is 12 times 7?")  # loads the panes
    view.speed.setCurrentIndex(view.speed.findData(0))  # the first pane's checkpoint
    next(a for a in window.findChildren(QAction) if a.text() == "Draft colours").trigger()
    await compare_steps(
        [steps[0], steps[-1]], "How many r are in strawberry? Tell me about the sea.", temperature=0.8
    )
    window.grab().save(str(out / f"compare-pane-draft-{theme}.png"))
    window.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--theme", default="light", choices=["light", "dark"])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--size", default="1360x860", help="window size, WIDTHxHEIGHT")
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.lower().split("x"))
    from desktop.config import paths

    paths.set_home(tempfile.mkdtemp(prefix="nanoscope-shots-"))
    _app = QApplication.instance() or QApplication(sys.argv[:1])  # kept alive while rendering
    from desktop.qt.app.app import build

    window = build()
    args.out.mkdir(parents=True, exist_ok=True)
    qasync.run(scenario(window, args.out, args.theme, (width, height)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
