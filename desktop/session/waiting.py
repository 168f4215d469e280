"""A message the user sent before the chat's model could answer it, without Qt.

The app starts by scanning for checkpoints and loading one on the model thread (the first load on
a new machine also times kernels); a message sent meanwhile must not be refused or lost. The
:class:`ModelWait` holds it, together with what the model is doing (looked for, loading at some
percent and step), so the chat can show the message at once with a line saying what it waits for;
the Qt adapter (``desktop.qt.chat.controller.ChatController``) answers it once the model is loaded
and gives it back (to the input box, with the reason) when the load fails or the user cancels.

    changed()   the held message, or what the model is doing, changed: render ``line()`` again
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from desktop.engine.discovery import run_tag, source_of
from desktop.engine.params import SamplingParams
from desktop.session.observable import Events

LOOKING = "looking for checkpoints…"


def target_name(path: Path, step: int | None) -> str:
    """What loads, as the picker names it: "sft/d20 step 2,400" (a folder of another kind by its
    name)."""
    source = source_of(path)
    name = f"{source}/{run_tag(path)}" if source else path.name
    return name if step is None else f"{name} step {step:,}"


@dataclass(frozen=True)
class HeldMessage:
    """What the user sent, with the reply's request as it was when they sent it."""

    text: str
    params: SamplingParams
    system_prompt: str = ""
    prefill: str = ""


class ModelWait:
    """The chat's model on its way (looked for or loading) and the one message waiting for it.

    ``clock`` (seconds, monotonic) times the wait; a test passes its own.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.events = Events("changed")
        self.coming = False  # a model is being looked for or loaded
        self.target = ""  # what loads ("d4 step 20"); "" while checkpoints are looked for
        self.percent = 0
        self.step = ""  # what the load is doing now ("Tuning for this CPU…")
        self.held: HeldMessage | None = None
        self._clock = clock
        self._since = 0.0  # when the held message was sent

    # ----- the model -------------------------------------------------------------------------

    def looking(self) -> None:
        """The first scan is under way: a model will be picked (or none found) when it ends."""
        self.coming, self.target, self.percent, self.step = True, "", 0, LOOKING
        self.events.changed.emit()

    def loading(self, target: str) -> None:
        """``target`` (a name for people) started loading."""
        self.coming, self.target, self.percent, self.step = True, target, 0, ""
        self.events.changed.emit()

    def progress(self, percent: int, step: str) -> None:
        """The load's own report (ignored when nothing loads: a late report)."""
        if not self.coming:
            return
        self.percent, self.step = max(0, min(100, percent)), step
        self.events.changed.emit()

    def arrived(self) -> HeldMessage | None:
        """The model is loaded: the message to answer now, if one waited."""
        return self._end()

    def failed(self) -> HeldMessage | None:
        """No model comes (the load failed, or there is none to load): the message that waited,
        to give back to the user with the reason."""
        return self._end()

    def _end(self) -> HeldMessage | None:
        held, self.held = self.held, None
        self.coming, self.target, self.percent, self.step = False, "", 0, ""
        self.events.changed.emit()
        return held

    # ----- the message -----------------------------------------------------------------------

    def hold(self, message: HeldMessage) -> bool:
        """Keep ``message`` until the model comes; False (nothing changed) when none is coming or
        one message already waits (the user sees it in the chat, and its Stop)."""
        if not self.coming or self.held is not None:
            return False
        self.held, self._since = message, self._clock()
        self.events.changed.emit()
        return True

    def cancel(self) -> HeldMessage | None:
        """The user stopped the wait: the message back (the model goes on loading)."""
        held, self.held = self.held, None
        if held is not None:
            self.events.changed.emit()
        return held

    def line(self) -> str:
        """What the held message waits for, with the load's progress and the time waited:
        "Waiting for d4 step 20 to load · Tuning for this CPU… (74%) · 9 s so far"."""
        if self.held is None:
            return ""
        waited = int(self._clock() - self._since)
        parts = [f"Waiting for {self.target} to load" if self.target else "Waiting for a model"]
        # The slot's first report only repeats what loads.
        step = "" if self.step.startswith("loading ") else self.step.rstrip(".")
        if self.target:
            parts.append(f"{step} ({self.percent}%)" if step else f"{self.percent}%")
        elif step:
            parts.append(step)
        if waited >= 1:
            parts.append(f"{waited} s so far")
        return " · ".join(parts)
