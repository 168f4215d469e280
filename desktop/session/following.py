"""Following the latest step of a run that is still training (Qt-free): a chat's, or a Compare
pane's, "latest of this run".

When a run saves a new step, whoever talks to that run is told, once per step. Only one that asked
to follow moves to it, and never in the middle of a reply: a reply streaming goes on with the
step it began with, and the new step loads when it ends, so the *next* reply is the new step's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from desktop.session.waiting import target_name


@dataclass(frozen=True)
class Landing:
    """A newer saved step than the one answering: ``load_now`` when it should load at once (the
    talker follows and no reply is streaming); a follower mid-reply loads it when the reply ends."""

    folder: Path
    step: int
    following: bool
    load_now: bool

    def notice(self, who: str, where: str) -> tuple[str, str]:
        """What the window says (title, message): ``who`` follows ("This chat"), ``where`` the
        step is chosen otherwise ("the Step list")."""
        title = f"{target_name(self.folder, self.step)} saved"
        if not self.following:
            return title, f"Choose it in {where}, or Latest to follow the run as it trains."
        then = "it answers from now on" if self.load_now else "the next reply uses it"
        return title, f"{who} follows the latest step: {then}."


class Following:
    """Which run a talker has loaded (``folder``, ``step``), whether it follows it (``on``), and a
    newer step waiting for the reply in flight to end."""

    def __init__(self) -> None:
        self.on = False
        self.folder: Path | None = None
        self.step: int | None = None
        self.waiting: int | None = None  # a newer step that loads when the reply ends
        self._told: set[tuple[Path, int]] = set()  # steps already announced

    def follow(self, on: bool) -> None:
        self.on = on
        if not on:
            self.waiting = None

    def loaded(self, folder: Path, step: int | None) -> None:
        """What answers now (a step the user picked, or the one following loaded)."""
        self.folder, self.step = Path(folder), step
        if step is not None:
            self._told.add((self.folder, step))  # its own step is not news
            if self.waiting is not None and self.waiting <= step:
                self.waiting = None

    def listed(self, saved: Iterable[tuple[Path, list[int]]], replying: bool) -> Landing | None:
        """The saved steps of every run as a scan lists them ((folder, steps ascending)): a
        Landing when the run loaded here has a newer step not yet announced; None otherwise."""
        if self.folder is None or self.step is None:
            return None
        steps = next((s for f, s in saved if Path(f) == self.folder), [])
        newest = steps[-1] if steps else None
        if newest is None or newest <= self.step or (self.folder, newest) in self._told:
            return None
        self._told.add((self.folder, newest))
        if self.on and replying:
            self.waiting = newest
        return Landing(self.folder, newest, self.on, self.on and not replying)

    def reply_ended(self) -> int | None:
        """A reply ended: the newer step a follower waited for (to load now), if any."""
        step, self.waiting = self.waiting, None
        return step if self.on else None
