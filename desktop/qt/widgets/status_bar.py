"""The status bar: device, dtype, attention kernel, speed, TTFT and how full the context is."""

from __future__ import annotations

import html
from collections.abc import Sequence

from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from desktop.qt.widgets import theme

WARN_ABOVE = 0.8  # the context bar turns amber past this fraction, red when full


PRECISION_TIP = "Precision of the weights and compute"


def context_level(used: int, total: int) -> str:
    """ "ok", "warn" (more than 80 % used) or "full"."""
    if total <= 0:
        return "ok"
    ratio = used / total
    return "full" if ratio >= 1 else "warn" if ratio > WARN_ABOVE else "ok"


class StatusBar(QStatusBar):
    """Permanent labels: device · dtype · attention | tok/s · TTFT | context used / sequence_len."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setSizeGripEnabled(False)
        self.device = QLabel("No model loaded")
        self.device.setToolTip("Where the model runs")
        self.dtype = QLabel()
        self.dtype.setToolTip(PRECISION_TIP)
        self.attention = QLabel()
        self.attention.setToolTip("Attention kernel")
        self.speed = QLabel("— tok/s")
        self.speed.setToolTip("Decode speed of the reply streaming, else of the last reply")
        self.ttft = QLabel("TTFT —")
        self.ttft.setToolTip("Time to first token of the reply streaming, else of the last reply")
        self.context = QLabel("0 / 0")
        self.context.setToolTip("Tokens the conversation uses (its reply too) / the model's sequence_len")
        self.context_bar = QProgressBar()
        self.context_bar.setObjectName("ContextBar")
        self.context_bar.setFixedWidth(90)
        self.context_bar.setTextVisible(False)
        self.context_bar.setRange(0, 1)
        self.context_bar.setValue(0)
        self.context_bar.setAccessibleName("Context used")
        self.context_bar.setProperty("level", "ok")
        for w in (self.device, self.dtype, self.attention, self.speed, self.ttft, self.context):
            w.setAccessibleName(w.toolTip())
        for widget in (
            self.device,
            self.dtype,
            self.attention,
            self.speed,
            self.ttft,
            self.context,
            self.context_bar,
        ):
            self.addPermanentWidget(widget)
        self.dtype.hide()
        self.attention.hide()

    def set_device_info(
        self, device: str, precision: str = "", attention: str = "", kernels: Sequence[str] = ()
    ) -> None:
        """What runs the model: "CPU · 8 threads", "float32", "sdpa" (empty ones are hidden), and
        in the precision's tooltip which kernel computes each matrix shape, as timed on this CPU."""
        self.device.setText(device or "No model loaded")
        for label, text in ((self.dtype, precision), (self.attention, attention)):
            label.setText(text)
            label.setVisible(bool(text))
        tip = PRECISION_TIP
        if kernels:
            # Rich text with pre-wrapped lines: Qt would break a long plain-text line mid-list.
            lines = "<br>".join(f"• {html.escape(line)}" for line in kernels)
            tip = (
                f"<p>{PRECISION_TIP}</p><p>Matrix products, each by the fastest kernel timed on this"
                f" machine (µs per product):</p><p style='white-space:pre'>{lines}</p>"
            )
        self.dtype.setToolTip(tip)

    def set_speed(self, tok_s: float | None, ttft_ms: float | None) -> None:
        self.speed.setText(f"{tok_s:.1f} tok/s" if tok_s else "— tok/s")
        self.ttft.setText(f"TTFT {ttft_ms:.0f} ms" if ttft_ms else "TTFT —")

    def set_context(self, used: int, total: int) -> None:
        level = context_level(used, total)
        self.context.setText(f"{used} / {total}")
        self.context_bar.setRange(0, max(1, total))
        self.context_bar.setValue(min(used, max(1, total)))
        pct = 100 * used / total if total else 0
        tip = f"Context: {used} of {total} tokens used ({pct:.0f} %)"
        if level != "ok":
            tip += "\nThe oldest turns are left out when the conversation no longer fits."
        self.context_bar.setToolTip(tip)
        self.context.setToolTip(tip)
        if self.context_bar.property("level") != level:
            self.context_bar.setProperty("level", level)
            theme.repolish(self.context_bar)
