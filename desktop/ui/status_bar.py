"""The status bar: device, dtype, attention backend, speed, TTFT and context use."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar

from . import theme

AMBER_AT = 0.8


class StatusBar(QStatusBar):
    def __init__(self) -> None:
        super().__init__()
        self.device = QLabel("No model loaded")
        self.dtype = QLabel()
        self.attention = QLabel()
        self.speed = QLabel()
        self.ttft = QLabel()
        self.context = QLabel()
        self.context_bar = QProgressBar()
        self.context_bar.setMaximumWidth(120)
        self.context_bar.setMaximumHeight(12)
        self.context_bar.setTextVisible(False)
        self.context_bar.setAccessibleName("Context used")
        for w in (
            self.device,
            self.dtype,
            self.attention,
            self.speed,
            self.ttft,
            self.context,
            self.context_bar,
        ):
            self.addPermanentWidget(w)
        self.device.setToolTip("Where the model runs")
        self.attention.setToolTip("Attention kernel")
        self.context.setToolTip("Prompt tokens used / the model's sequence_len")

    def set_device_info(self, info: dict) -> None:
        self.device.setText(info.get("device_name", info.get("device", "")))
        self.dtype.setText(info.get("dtype", ""))
        self.attention.setText(info.get("attention", ""))

    def set_speed(self, tok_s: float, ttft_ms: float) -> None:
        self.speed.setText(f"{tok_s:.1f} tok/s")
        self.ttft.setText(f"TTFT {ttft_ms:.0f} ms")

    def set_context(self, used: int, total: int) -> None:
        self.context.setText(f"{used} / {total}")
        self.context_bar.setMaximum(max(1, total))
        self.context_bar.setValue(min(used, total))
        amber = total > 0 and used / total > AMBER_AT
        color = theme.colors().warning if amber else theme.colors().accent
        self.context_bar.setStyleSheet(f"QProgressBar::chunk {{ background: {color}; }}")
        self.context_bar.setProperty("amber", amber)
