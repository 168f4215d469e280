"""Render the main window's states to PNG (offscreen) for the docs and for review.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/render.py [--theme light|dark] [--out DIR]

Uses the bundled demo model (or a tiny generated checkpoint when the demo is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import qasync
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


async def scenario(window, out: Path, theme: str) -> None:
    from desktop.paths import demo_checkpoint
    from desktop.ui.theme import apply_theme

    app = QApplication.instance()
    apply_theme(app, theme)
    window.resize(1360, 860)
    window.show()
    c = window.controller
    c.refresh_list()
    window.background.scan()
    loaded = asyncio.get_running_loop().create_future()
    c.model_loaded.connect(lambda info: loaded.done() or loaded.set_result(info))
    c.model_load_failed.connect(lambda p, r: loaded.done() or loaded.set_exception(RuntimeError(r)))
    demo = demo_checkpoint()
    from desktop.engine.checkpoint import model_steps

    await asyncio.sleep(0.5)
    c.load_checkpoint(demo, model_steps(demo)[-1])
    await loaded
    window.grab().save(str(out / f"empty-{theme}.png"))

    async def ask(text: str) -> None:
        done = asyncio.get_running_loop().create_future()
        slot = lambda stats: done.done() or done.set_result(stats)  # noqa: E731
        c.reply_finished.connect(slot)
        window.input.editor.setPlainText(text)
        window.input._submit()
        await done
        c.reply_finished.disconnect(slot)
        await asyncio.sleep(0.2)

    window.sampling.apply_preset("Greedy")
    await ask("What is 12 times 7?")
    await ask("How many r are in strawberry?")
    await ask("Who are you?")
    window.grab().save(str(out / f"chat-{theme}.png"))
    window.banner.show_error(
        "Could not load /data/ckpt/d20",
        "model_000500.pt: file is truncated or corrupt (PytorchStreamReader failed reading zip archive)",
    )
    await asyncio.sleep(0.1)
    window.grab().save(str(out / f"error-{theme}.png"))
    window.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--theme", default="light", choices=["light", "dark"])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    from desktop import paths

    paths.set_home(tempfile.mkdtemp(prefix="nanoscope-shots-"))
    _app = QApplication.instance() or QApplication(sys.argv[:1])  # kept alive while rendering
    from desktop.app import build

    window = build()
    args.out.mkdir(parents=True, exist_ok=True)
    qasync.run(scenario(window, args.out, args.theme))
    return 0


if __name__ == "__main__":
    sys.exit(main())
