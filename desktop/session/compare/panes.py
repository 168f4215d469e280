"""One Compare pane's state, without Qt: the checkpoint picked, the model loaded (or loading, or
the reason it failed), the pane's own sampling values and its reply to the current prompt.

What the pane shows is decided here, from these fields alone: the view never reads its own
widgets to know which step a pane holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from desktop.engine.backend import ModelInfo
from desktop.session.compare.pane_run import PaneRun
from desktop.session.following import Following

Key = tuple[Path, int]  # a checkpoint folder and its step
NOT_LOADED = "Not loaded"


def key_of(path: Path | str, step: int) -> Key:
    return Path(path), int(step)


def step_text(step: int) -> str:
    return f"step {step:,}"


@dataclass(eq=False)  # identity: a pane is the same pane however its fields change
class PaneState:
    picked: Key | None = None  # what the user (or Run, or a sweep) chose for this pane
    info: ModelInfo | None = None  # the model loaded, which answers
    loading: Key | None = None  # the checkpoint being loaded, until it is or fails
    progress: tuple[int, str] = (0, "")
    failed: str = ""  # why the last load failed ("" when it did not)
    overrides: dict[str, Any] = field(default_factory=dict)
    run: PaneRun = field(default_factory=PaneRun)
    following: Following = field(default_factory=Following)  # "Latest": the run's newest step

    @property
    def loaded_key(self) -> Key | None:
        info = self.info
        return key_of(info.path, info.step or 0) if info is not None else None

    @property
    def ready(self) -> bool:
        return self.info is not None and self.loading is None

    @property
    def pick_is_loaded(self) -> bool:
        """The picked checkpoint is the one loaded: the pane's button frees it."""
        return self.ready and self.picked == self.loaded_key

    @property
    def status(self) -> str:
        """ "loading", "loaded" (the pick answers), "switch" (another step is loaded than the
        one picked), "failed", "picked" (not loaded) or "empty"."""
        if self.loading is not None:
            return "loading"
        if self.info is not None:
            return "loaded" if self.picked in (None, self.loaded_key) else "switch"
        if self.failed:
            return "failed"
        return "picked" if self.picked is not None else "empty"

    def headline(self) -> str:
        """Which step answers in this pane, in words ("" for an empty pane): the view adds the
        loaded model's details after a lone step."""
        status, loaded = self.status, self.loaded_key
        if status == "loading" and self.loading is not None:
            return f"Loading {step_text(self.loading[1])}… {self.progress[1]}".rstrip()
        if status == "loaded" and loaded is not None:
            return step_text(loaded[1])
        if status == "switch" and loaded is not None and self.picked is not None:
            return f"{step_text(loaded[1])} answers · {step_text(self.picked[1])} picked: Load to switch"
        if status == "failed":
            return f"⚠ {self.failed}"
        return NOT_LOADED if status == "picked" else ""

    def persisted(self) -> dict[str, Any] | None:
        """The pick as the settings keep it across a restart (None: nothing picked)."""
        key = self.picked or self.loaded_key
        if key is None:
            return None
        return {"dir": str(key[0]), "step": key[1], "overrides": dict(self.overrides)}
