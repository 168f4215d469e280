"""Write the settings to disk shortly after they change, not only at quit (a crash keeps them).

Debounced: a burst of changes (dragging a slider, typing a system prompt) is one write,
``DELAY_MS`` after the last of them. ``Settings.save`` itself writes atomically.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, QTimer

from desktop.config.settings import Settings

logger = logging.getLogger(__name__)

DELAY_MS = 500


class SettingsAutosave(QObject):
    """Saves ``settings`` ``DELAY_MS`` after its last change; lives as long as ``parent``."""

    def __init__(self, settings: Settings, parent: QObject | None = None, delay_ms: int = DELAY_MS) -> None:
        super().__init__(parent)
        self.settings = settings
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(delay_ms)
        self._timer.timeout.connect(self.save_now)
        settings.on_change(lambda _key: self._timer.start())

    @property
    def pending(self) -> bool:
        return self._timer.isActive()

    def save_now(self) -> None:
        """Write now; a failure (disk full, read-only folder) is logged and retried on the next change."""
        self._timer.stop()
        try:
            self.settings.save()
        except OSError as exc:
            logger.warning("Settings not saved to %s: %s", self.settings.path, exc.strerror or exc)
