"""How a draft for speculative decoding is named (``StreamOptions.draft``, ``--draft``), torch-free.

* ``auto``: the target's own weights at the cheapest precision its family has on this device
  (int8 on a CPU), or its MTP head where it has one and that yields more per unit of cost;
* ``int8``, ``fp16``, ``bf16``, ``fast`` (or any ``--dtype`` name): the target's own weights at
  that precision, a *self-draft*;
* ``mtp``: the target's own multi-token-prediction head (the nanochat fork's, trained with
  ``mtp_enabled``), proposing the next token from the target's last hidden state;
* ``[PRECISION:]PATH[@STEP]``: another checkpoint whose tokenizer is the target's (compared by
  content, not by name), e.g. an earlier step or a smaller depth of the run, at PRECISION
  (default: as ``--dtype auto`` loads it) and STEP (default: the latest).

Each family turns a :class:`DraftSpec` into a :class:`~.speculative.Draft` (its backend's
``stream``); a served model has no draft.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.engine.errors import CheckpointError, DeviceError, NanoscopeError, TokenizerError
from desktop.engine.files.bounded import PathRefused, named_path
from desktop.engine.files.numbers import NumberRefused, parse_count
from desktop.engine.kernels.device import PRECISIONS

AUTO = "auto"
MTP = "mtp"
# Short names for the precisions a self-draft is usually asked in.
ALIASES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_STEP = re.compile(r"^(?P<path>.+)@(?P<step>\d+)$")


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft name: the target itself (``checkpoint`` None) at ``precision``, its MTP
    head (``head``), or a checkpoint at ``precision`` and ``step`` (None: the latest)."""

    text: str
    precision: str = AUTO
    checkpoint: Path | None = None
    step: int | None = None
    head: bool = False

    @property
    def is_self(self) -> bool:
        """The target's own weights at some precision (not its head, not another checkpoint)."""
        return self.checkpoint is None and not self.head


def _precision(name: str) -> str | None:
    name = ALIASES.get(name.lower(), name.lower())
    return name if name in PRECISIONS else None


def parse_draft(text: str) -> DraftSpec:
    """The draft ``text`` names; one readable line when it names none."""
    text = text.strip()
    if not text:
        raise NanoscopeError("the draft is empty: name a precision (int8, fp16, auto), mtp or a checkpoint")
    if text.lower() == MTP:
        return DraftSpec(text, head=True)
    alone = _precision(text)
    if alone is not None:
        return DraftSpec(text, alone)
    precision, rest = AUTO, text
    head, sep, tail = text.partition(":")
    if sep and _precision(head) is not None and tail:
        precision, rest = _precision(head) or AUTO, tail
    step = None
    found = _STEP.match(rest)
    if found and not _exists(rest):
        rest = found["path"]
        try:
            step = parse_count(found["step"])
        except NumberRefused as exc:
            raise NanoscopeError(f"the step after @ {exc}") from None
    return DraftSpec(text, precision, named_path(rest), step)


def _exists(text: str) -> bool:
    """Whether ``text`` names an existing file or folder (a path no file can have does not)."""
    try:
        return named_path(text).exists()
    except PathRefused:
        return False


def no_head(where: object) -> CheckpointError:
    """The one line for ``mtp`` where the model has no multi-token-prediction head."""
    return CheckpointError(
        f"{where} has no multi-token-prediction head (mtp.* weights, the nanochat fork's "
        "mtp_enabled): pick another draft"
    )


def check_same_tokenizer(draft: Any, target: Any) -> None:
    """One line when the draft's token ids may mean other tokens than the target's: the two
    tokenizers are compared by content (``content_digest``), whatever their files are called."""
    mine, theirs = getattr(draft, "content_digest", None), getattr(target, "content_digest", None)
    if mine is None or theirs is None or mine() != theirs():
        raise TokenizerError(
            f"its tokenizer ({draft.path}) differs from the model's ({target.path}); "
            "a draft must share the model's tokenizer"
        )


# A self-draft's kernels by the precision asked for (``auto``: whichever is timed cheaper).
SELF_KERNELS = {"auto": ("int8", "fp16"), "int8": ("int8",), "float16": ("fp16",), "fast": ("fp16",)}


def self_draft_kernels(device: str, precision: str, loaded_as: str, family: str) -> tuple[str, ...]:
    """The kernels a self-draft at ``precision`` of a ``family`` model may take: int8 or fp16
    weights, which only a CPU has, made from the target's fp32 matrices, which a target loaded in
    fast or int8 mode (``loaded_as``: its kernels' kind) no longer holds."""
    if device != "cpu":
        raise DeviceError(
            f"a self-draft needs the CPU's int8 or fp16 kernels; on {device.upper()} name another "
            "checkpoint as the draft"
        )
    if precision not in SELF_KERNELS:
        raise DeviceError(f"a self-draft of a {family} model is int8 or fp16, not {precision}")
    if loaded_as != "exact":
        raise DeviceError(
            "a self-draft is made from the model's fp32 weights, and this one was loaded with "
            f"{loaded_as} weights: load it in float32, or name another checkpoint as the draft"
        )
    return SELF_KERNELS[precision]
