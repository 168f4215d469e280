"""The sampling knobs: their keys, defaults, ranges and validation, in one place (torch-free).

The sampling panel, settings, presets, the Compare view, the CLI and every backend derive from
:data:`KNOBS` and :class:`SamplingParams`; nothing else lists the keys or their limits.

Defaults. ``SamplingParams()`` is the model's own distribution (temperature 1.0, no filters):
the defaults of nanochat's ``Engine.generate``, so ``nanoscope generate`` without flags gives the
tokens nanochat gives. A chat window starts on :data:`CHAT_DEFAULTS` instead, the "Balanced"
preset (temperature 0.8, top-k 50): what nanochat's own chat web UI starts with, and the 0.7-0.8
that LM Studio and GPT4All users are used to. A person chatting wants fluent replies; a person
checking a checkpoint against nanochat wants the raw distribution. Both come from this module.

Infinity. ``temperature=inf`` would make every token equally likely and ``repetition_penalty=inf``
would forbid every token already seen (or, for negative logits, make it infinitely likely); neither
is a setting anyone means, so both are refused with a message, like NaN. Values that are valid but
extreme (a temperature of 1e-30, a top-p of 1e-300) are accepted: the sampler falls back to the
most likely token where the distribution they give cannot be sampled, and says so in the reply's
stats (``GenerationStats.greedy_fallbacks``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed
MAX_TOKENS_MAX = 1 << 20


@dataclass(frozen=True)
class Knob:
    """One sampling knob. ``lo``/``hi`` bound what is valid; a slider spans ``slider_lo`` to
    ``ui_hi`` (a typed value may go beyond, within ``lo``/``hi``). ``off`` switches it off."""

    key: str
    label: str
    lo: float
    hi: float
    ui_hi: float
    step: float
    decimals: int
    off: float | None
    tip: str
    lo_open: bool = False  # lo itself is not valid (top-p 0 would keep no token)
    ui_lo: float | None = None  # where a slider starts, when not at lo

    @property
    def slider_lo(self) -> float:
        return self.lo if self.ui_lo is None else self.ui_lo


KNOBS: tuple[Knob, ...] = (
    Knob(
        "temperature",
        "Temperature",
        0.0,
        100.0,
        2.0,
        0.05,
        2,
        0.0,
        "Randomness. 0 always takes the most likely token (greedy, repeatable);\n"
        "higher values flatten the distribution for more varied text.",
    ),
    Knob(
        "top_k",
        "Top-k",
        0,
        2**31 - 1,
        200,
        1,
        0,
        0,
        "Sample only among the k most likely tokens. 0 turns it off.",
    ),
    Knob(
        "top_p",
        "Top-p",
        0.0,
        1.0,
        1.0,
        0.01,
        2,
        1.0,
        "Nucleus sampling: keep the smallest set of tokens whose probabilities add up to p.\n1 turns it off.",
        lo_open=True,
    ),
    Knob(
        "min_p",
        "Min-p",
        0.0,
        0.99,
        0.99,
        0.01,
        2,
        0.0,
        "Drop tokens less likely than min-p × the most likely token's probability. 0 turns it off.",
    ),
    Knob(
        "repetition_penalty",
        "Repetition penalty",
        0.0,
        100.0,
        2.0,
        0.01,
        2,
        1.0,
        "Make tokens that already appeared less likely. 1 turns it off.",
        lo_open=True,
        ui_lo=1.0,  # below 1 it rewards repetition: allowed when typed, not offered on the slider
    ),
    Knob(
        "max_tokens",
        "Max tokens",
        1,
        MAX_TOKENS_MAX,
        4096,
        1,
        0,
        None,
        "The longest reply, in tokens. Generation also stops at the end-of-turn token.",
    ),
    # A slider or spin box holds 32-bit values; the CLI takes any 63-bit seed.
    Knob(
        "seed",
        "Seed",
        0,
        SEED_MAX,
        2**31 - 1,
        1,
        0,
        None,
        "The random seed: the same seed gives the same reply.",
    ),
)
KNOB = {k.key: k for k in KNOBS}
SAMPLING_KEYS: tuple[str, ...] = tuple(k.key for k in KNOBS)
# The knobs that shape the distribution (what a preset sets and a backend may ignore).
FILTER_KEYS: tuple[str, ...] = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
INT_KEYS = frozenset(k.key for k in KNOBS if k.decimals == 0)


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _shown(value: float | int) -> str:
    """A value for a message (a 400-digit int is not echoed)."""
    if isinstance(value, int) and abs(value) >= 10**20:
        return f"a {int(abs(value).bit_length() * 0.30103) + 1}-digit number"
    return repr(value)


def _check(knob: Knob, value: Any) -> float | int:
    """``value`` as the knob's type, or ValueError with one readable line."""
    name = knob.key
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"{name} must be a number, got {_shown(value) if isinstance(value, int) else repr(value)[:60]}"
        )
    if knob.key in INT_KEYS:
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            value = int(value)
    else:
        if isinstance(value, int) and abs(value) > 1e300:
            value = math.inf if value > 0 else -math.inf
        value = float(value)
        if math.isnan(value):
            raise ValueError(f"{name} must be a number, got nan")
        if math.isinf(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    low_ok = value > knob.lo if knob.lo_open else value >= knob.lo
    if not low_ok or value > knob.hi:
        lo = f"({_bound(knob.lo)}" if knob.lo_open else f"[{_bound(knob.lo)}"
        raise ValueError(f"{name} must be in {lo}, {_bound(knob.hi)}], got {_shown(value)}")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling values. Construction fails with a ValueError naming the bad value."""

    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    max_tokens: int | None = None  # None = up to the model's context
    seed: int = 42

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "max_tokens":
                continue
            object.__setattr__(self, f.name, _check(KNOB[f.name], value))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SamplingParams:
        """The sampling keys of ``values`` (other keys, such as ``system_prompt``, are ignored)."""
        return cls(**{k: values[k] for k in SAMPLING_KEYS if k in values})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def plain(self) -> bool:
        """True when only nanochat's own knobs (temperature, top-k) are in use."""
        return self.top_p >= 1.0 and self.min_p <= 0.0 and self.repetition_penalty == 1.0

    def active(self) -> tuple[str, ...]:
        """The filter knobs set to something other than "off"."""
        return tuple(k for k in FILTER_KEYS if getattr(self, k) != KNOB[k].off)

    def with_values(self, **changes: Any) -> SamplingParams:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """ "greedy" or "T 0.8 · top-k 50 · seed 42" (what a footer or a report shows)."""
        if self.greedy:
            return "greedy"
        bits = [f"T {self.temperature:g}"]
        if self.top_k:
            bits.append(f"top-k {self.top_k}")
        if self.top_p < 1:
            bits.append(f"top-p {self.top_p:g}")
        if self.min_p > 0:
            bits.append(f"min-p {self.min_p:g}")
        if self.repetition_penalty != 1:
            bits.append(f"rep {self.repetition_penalty:g}")
        bits.append(f"seed {self.seed}")
        return " · ".join(bits)


PRESETS: dict[str, SamplingParams] = {
    "Greedy": SamplingParams(temperature=0.0),
    "Balanced": SamplingParams(temperature=0.8, top_k=50),
    "Creative": SamplingParams(temperature=1.2, top_p=0.95, min_p=0.05, repetition_penalty=1.1),
}
CHAT_DEFAULTS = PRESETS["Balanced"].with_values(max_tokens=512)
