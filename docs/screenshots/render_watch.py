"""Render the window while a run trains beside it (issue #44) to PNG, offscreen.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/render_watch.py [--theme light|dark] [--out DIR]

nanochat's own base_train (tests/upstream/, run by tests/support/live_training.py) saves step 10;
the app starts on its base dir, the chat chooses "Latest (follows)", step 20 lands and the chat
moves to it and answers; the writer dies part-way through saving step 30, which shows as
incomplete. Writes ``watch-chat-<theme>.png`` and ``watch-run-<theme>.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

import qasync
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).resolve().parent)]
from render import _next, _settle, started  # noqa: E402
from support.live_training import LiveTraining, nanochat_checkpoints, start_nanochat_training  # noqa: E402

LOOKS = 40  # looks a quarter second apart while waiting for the window to show what landed


async def scenario(window, run: LiveTraining, out: Path, theme: str) -> None:
    from desktop.qt.widgets.checkpoint_picker import FOLLOW

    await started(window, theme)
    folder = nanochat_checkpoints(run.folder)
    window.picker.select(folder, FOLLOW)
    loaded = _next(window.controller.model_loaded)
    window.picker.load_btn.click()
    await loaded
    loaded = _next(window.controller.model_loaded, lambda info: info.step == 20)
    run.allow(20)
    await loaded
    window.sampling.set_values({"max_tokens": 24})
    done = _next(window.controller.reply_finished)
    window.chat_page._send("the small cat")
    await done
    await asyncio.get_running_loop().run_in_executor(None, run.wait_killed)  # step 30, cut short
    window.background.saves.give_up_s = 1.0  # do not wait two minutes to call it incomplete
    step = window.picker.step
    for _ in range(LOOKS):
        window.background.look_again()
        await asyncio.sleep(0.25)
        if any("incomplete" in step.itemText(i) for i in range(step.count())):
            break
    await _settle()
    window.grab().save(str(out / f"watch-chat-{theme}.png"))
    window.tabs.setCurrentWidget(window.run_page)
    view = window.run_page.run_view
    view.choose_run(folder)
    for _ in range(LOOKS):
        await asyncio.sleep(0.25)
        if window.run_page.session.timeline and not view.status.text().startswith("Reading"):
            break
    await _settle()
    window.grab().save(str(out / f"watch-run-{theme}.png"))
    window.close()  # the models' threads stop and are waited for, as when the user quits


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--theme", default="light", choices=["light", "dark"])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="nanoscope-watch-")) / "base"
    run = start_nanochat_training(base, steps=(10, 20, 30), hold=True, kill_mid_save_at=30)
    try:
        run.allow(10)
        run.wait_saved(10)
        run.allow(30)  # it dies there once step 20 is allowed and saved
        os.environ["NANOCHAT_BASE_DIR"] = str(base)
        from desktop.config import paths

        paths.set_home(tempfile.mkdtemp(prefix="nanoscope-shots-"))
        _app = QApplication.instance() or QApplication(sys.argv[:1])  # kept alive while rendering
        from desktop.qt.app.app import build

        window = build()
        args.out.mkdir(parents=True, exist_ok=True)
        qasync.run(scenario(window, run, args.out, args.theme))
    finally:
        run.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
