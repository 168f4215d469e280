"""One round of Compare replies over the panes' model slots: how CPU panes share the cores, and
a Chat reply's fork raced on every pane (GUI thread only)."""

from __future__ import annotations

from typing import Any, Protocol

from PySide6.QtCore import QObject, QTimer, Slot

from desktop.engine.backend import StreamOptions
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.qt.compare.pane_slot import Pane
from desktop.qt.model.worker import TurnLock
from desktop.session.compare.analysis import LETTERS, cpu_cores, cpu_threads
from desktop.session.compare.pane_run import Fork, fork_of

Plan = dict[Pane, tuple[StreamOptions, TurnLock | None]]


def schedule(ready: list[Pane], mode: str, top: int) -> Plan:
    """Per pane: stream options (``top`` log-probabilities, CPU threads) and the shared turn lock
    of interleaved CPU panes. Each run starts from an empty cache, so every pane computes the
    same thing whatever it answered before."""
    plan: Plan = {p: (StreamOptions(logprobs=top, reuse_cache=False), None) for p in ready}
    cpu = [p for p in ready if p.info is not None and p.info.device.startswith("cpu")]
    lock = TurnLock() if mode == "interleaved" and len(cpu) > 1 else None
    for pane, threads in zip(cpu, cpu_threads(mode, len(cpu), cpu_cores()), strict=True):
        plan[pane] = (StreamOptions(logprobs=top, threads=threads, reuse_cache=False), lock)
    return plan


class Host(Protocol):
    """What a race needs of the Compare controller (which imports this module)."""

    panes: list[Pane]
    notice: Any

    @property
    def busy(self) -> bool: ...
    @property
    def prompt(self) -> str: ...
    @property
    def messages(self) -> list[Message]: ...
    def send(
        self,
        text: str,
        shared: SamplingParams,
        system_prompt: str = "",
        earlier: list[Message] | None = None,
        fork: Fork | None = None,
    ) -> bool: ...


class Races(QObject):
    """Forks raced on every pane: one from a pane's own reply, or Chat's, sent once the panes
    have loaded (a child of the controller)."""

    def __init__(self, controller: Host, parent: QObject) -> None:
        super().__init__(parent)
        self.c = controller
        # A race waiting for its panes to load: (question, sampling, system prompt, earlier, fork).
        self._pending: tuple[str, SamplingParams, str, list[Message], Fork] | None = None

    def fork_pane(
        self, index: int, position: int, shared: SamplingParams, system_prompt: str, token_id: int, text: str
    ) -> bool:
        c = self.c
        if c.busy or not 0 <= index < len(c.panes) or not c.prompt:
            return False
        pane = c.panes[index]
        if pane.info is None:
            return False
        fork = fork_of(pane.run.trace, position, token_id, text, pane.info.tokenizer)
        if isinstance(fork, str):
            if fork:
                c.notice.emit("info", "Cannot fork there", fork)
            return False
        earlier = [m for m in c.messages if m.role != "system"][:-1]
        return c.send(c.prompt, shared, system_prompt, earlier, fork)

    def ready_for(self, ready: list[Pane], fork: Fork) -> list[Pane]:
        """The panes a fork can race on: its ids mean the same only under the same tokenizer."""
        same = [p for p in ready if p.info is not None and p.info.tokenizer == fork.tokenizer]
        others = [LETTERS[self.c.panes.index(p)] for p in ready if p not in same]
        if others:
            self.c.notice.emit(
                "warning",
                "Not raced on every pane",
                f"pane {', '.join(others)}: another tokenizer; a fork's tokens mean nothing there",
            )
        return same

    def race(
        self,
        question: str,
        fork: Fork,
        shared: SamplingParams,
        system_prompt: str = "",
        earlier: list[Message] | None = None,
    ) -> None:
        self._pending = (question, shared, system_prompt, list(earlier or ()), fork)
        self.start_pending()

    def pane_settled(self) -> None:
        """A pane loaded or failed to: the race waiting for it may start, once the pane's own
        handlers have run."""
        QTimer.singleShot(0, self, self.start_pending)

    @Slot()
    def start_pending(self) -> None:
        c = self.c
        if self._pending is None or any(p.is_loading for p in c.panes) or c.busy:
            return
        question, shared, system_prompt, earlier, fork = self._pending
        self._pending = None
        c.send(question, shared, system_prompt, earlier, fork)
