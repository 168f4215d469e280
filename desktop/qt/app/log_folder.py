"""Help › Open log folder: the log folder in the system's file manager."""

from __future__ import annotations

import logging

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices

from desktop.config import paths

logger = logging.getLogger(__name__)


def open_log_folder() -> bool:
    """Show the folder in the system's file manager; False if it could not."""
    folder = paths.log_dir()
    opened = QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))
    if not opened:
        logger.warning("Could not open the log folder %s", folder)
    return opened
