"""Render the Inside view (issue #45) to PNG, offscreen, as a user reaches it.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/render_inside.py [--theme light|dark] [--out DIR]

The app starts on the bundled demo (a nanochat checkpoint) with the raw tokens shown, answers
"What is 12 times 7?" greedily, and a reply token is clicked: ``inside-popup-<theme>.png`` is
its popup, ``inside-<theme>.png`` the Inside view it opens (layer 1, head 1 picked). Then a
Hugging Face folder transformers wrote (tests/golden/transformers/llama-bf16) is opened in the
same window and its reply looked inside: ``inside-hf-<theme>.png``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import qasync
from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QFileDialog

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).resolve().parent)]
from render import _next, _settle, started  # noqa: E402

HF = ROOT / "tests" / "golden" / "transformers" / "llama-bf16"


async def look_inside(window, token: int, out: Path, name: str | None) -> None:
    """Click reply token ``token`` in the raw view (saving the popup as ``name`` when given),
    then Inside, and wait for the view."""
    widget = window.chat.widgets[-1]
    QTest.mouseClick(
        widget.raw_view.viewport(), Qt.MouseButton.LeftButton, pos=widget.raw_view.token_point(token)
    )
    await _settle()
    popup = widget.popup
    if name is not None:
        popup.grab().save(str(out / name))
    ready = _next(window.controller.inside.inside_ready)
    popup.inside_btn.click()
    await ready
    await _settle()


async def scenario(window, out: Path, theme: str) -> None:
    await started(window, theme)
    window.sampling.set_values({**window.sampling.values(), "temperature": 0.0, "max_tokens": 16})
    window.chat_page.toggle_raw()
    prepared = _next(window.controller.inside.inside_prepared)
    window.chat_page._send("What is 12 times 7?")
    await prepared
    await look_inside(window, 1, out, f"inside-popup-{theme}.png")
    view = window.chat_page.inside_view
    view.resize(900, 760)
    QTest.mouseClick(view.grid, Qt.MouseButton.LeftButton, pos=view.grid.cell(1, 1).center())
    await _settle()
    view.grab().save(str(out / f"inside-{theme}.png"))
    view.close()

    # File › Open folder…, the user choosing the folder in the system's dialog
    QFileDialog.getExistingDirectory = lambda *_args, **_kw: str(HF)  # type: ignore[method-assign]
    loaded = _next(window.controller.model_loaded)
    window.picker.open_btn.click()
    await loaded
    prepared = _next(window.controller.inside.inside_prepared)
    window.chat_page._send("Hello")
    await prepared
    await look_inside(window, 3, out, None)
    view = window.chat_page.inside_view
    view.resize(900, 900)
    last = len(view.inside.attention) - 1
    QTest.mouseClick(view.grid, Qt.MouseButton.LeftButton, pos=view.grid.cell(last, 0).center())
    QTest.mouseMove(view.tokens, view.tokens.chip(view.position - 1).center() + QPoint(0, 0))
    await _settle()
    view.grab().save(str(out / f"inside-hf-{theme}.png"))
    view.close()
    window.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--theme", default="light", choices=["light", "dark"])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    from desktop.config import paths

    paths.set_home(tempfile.mkdtemp(prefix="nanoscope-shots-"))
    _app = QApplication.instance() or QApplication(sys.argv[:1])  # kept alive while rendering
    from desktop.qt.app.app import build

    window = build()
    args.out.mkdir(parents=True, exist_ok=True)
    qasync.run(scenario(window, args.out, args.theme))
    return 0


if __name__ == "__main__":
    sys.exit(main())
