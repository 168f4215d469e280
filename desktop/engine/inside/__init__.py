"""The inside of a model at a token: logit lens, attention rows and direct logit attribution
from one hooked forward pass (docs/INSIDE.md). Qt-free; torch is imported when a pass runs."""

from desktop.engine.inside.api import CACHE_FORMAT, InsideCache, PassYielded, inspect, inspect_all, kept_bytes
from desktop.engine.inside.result import FORMAT, Attribution, Guess, Inside, LensLayer, Term

__all__ = [
    "CACHE_FORMAT",
    "FORMAT",
    "Attribution",
    "Guess",
    "Inside",
    "InsideCache",
    "LensLayer",
    "PassYielded",
    "Term",
    "inspect",
    "inspect_all",
    "kept_bytes",
]
