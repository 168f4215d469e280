"""The chat's sampling state, Qt-free: the knob values, the system prompt, whether the seed is
locked, and the seed the next reply uses. The Parameters panel renders it and sends the user's
changes to it; the window asks it for each reply's request.

An unlocked seed is drawn for every reply from the operating system's randomness
(``random.SystemRandom``): nothing else in the process can reseed it, whereas the global
``random`` module is reseeded by any library that calls ``random.seed``, and every reply after
that would repeat the same "random" seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from desktop.config.settings import DEFAULT_SAMPLING
from desktop.engine.params import KNOB, SamplingParams
from desktop.session.observable import Events

SEED_MAX = int(KNOB["seed"].ui_hi)  # what the panel's 32-bit spin box can show
DEFAULTS: dict[str, Any] = {**DEFAULT_SAMPLING, "system_prompt": ""}


class SeedSource:
    """Seeds from the OS, none handed out twice: two unlocked replies to one prompt with the same
    seed would be the same reply, which reads as Regenerate not working."""

    def __init__(self) -> None:
        self._random = random.SystemRandom()
        self._given: set[int] = set()

    def draw(self) -> int:
        while (seed := self._random.randint(0, SEED_MAX)) in self._given:
            pass
        self._given.add(seed)
        return seed


_SEEDS = SeedSource()


def draw_seed() -> int:
    """A fresh seed from the process's one seed source (the dice buttons, Compare's too)."""
    return _SEEDS.draw()


def _checked(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` if every one is valid, else ValueError naming the first that is not."""
    unknown = set(values) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown sampling values {sorted(unknown)}")
    SamplingParams.from_dict(values)  # the engine's ranges; raises ValueError
    if "seed_locked" in values and not isinstance(values["seed_locked"], bool):
        raise ValueError(f"seed_locked must be true or false, got {values['seed_locked']!r}")
    if "system_prompt" in values and not isinstance(values["system_prompt"], str):
        raise ValueError(f"system_prompt must be text, got {values['system_prompt']!r}")
    return dict(values)


class SamplingState:
    """Events: ``changed(values)`` after any value changed, with all of them (as ``values()``)."""

    def __init__(self, seeds: SeedSource | None = None) -> None:
        self.events = Events("changed")
        self._seeds = seeds if seeds is not None else _SEEDS
        self._values: dict[str, Any] = dict(DEFAULTS)

    def values(self) -> dict[str, Any]:
        """The knob values, ``seed``, ``seed_locked`` and ``system_prompt``."""
        return dict(self._values)

    @property
    def seed_locked(self) -> bool:
        return bool(self._values["seed_locked"])

    @property
    def system_prompt(self) -> str:
        return str(self._values["system_prompt"])

    def update(self, values: Mapping[str, Any]) -> bool:
        """Take ``values`` (missing keys keep theirs); an invalid one raises ValueError and
        changes nothing. Emits ``changed`` once, and only when something changed."""
        merged = _checked({**self._values, **values})
        if merged == self._values:
            return False
        self._values = merged
        self.events.changed.emit(self.values())
        return True

    def lock_seed(self, locked: bool) -> None:
        self.update({"seed_locked": locked})

    def new_seed(self) -> int:
        """The dice: a fresh seed now (kept for the next reply only if the seed is locked)."""
        seed = self._seeds.draw()
        self.update({"seed": seed})
        return seed

    def next_request(self) -> tuple[SamplingParams, str]:
        """The next reply's sampling and system prompt: the locked seed, or a fresh one (which
        becomes the current seed, so the panel shows the one the reply used)."""
        if not self.seed_locked:
            self.new_seed()
        return SamplingParams.from_dict(self._values), self.system_prompt
