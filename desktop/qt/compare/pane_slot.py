"""One Compare pane's model slot (GUI thread): the slot and its thread are Qt's; what the pane
holds (its pick, overrides and reply) is its Qt-free session state."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject

from desktop.config.settings import Settings
from desktop.qt.model.slot import ModelSlot
from desktop.session.compare.pane_run import PaneRun
from desktop.session.compare.panes import Key, PaneState, key_of


class Pane(ModelSlot):
    def __init__(self, settings: Settings, parent: QObject, state: PaneState) -> None:
        super().__init__(settings, parent, thread_name="nanoscope-compare-pane")
        self.state = state

    @property
    def run(self) -> PaneRun:
        return self.state.run

    @run.setter
    def run(self, run: PaneRun) -> None:
        self.state.run = run

    @property
    def overrides(self) -> dict[str, Any]:
        return self.state.overrides

    @property
    def selection(self) -> Key | None:
        return self.state.picked

    @property
    def loaded_key(self) -> Key | None:
        info = self.info
        return key_of(info.path, info.step or 0) if info is not None else None

    @property
    def ready(self) -> bool:
        return self.info is not None and not self.is_loading
