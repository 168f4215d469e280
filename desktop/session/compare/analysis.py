"""Pure functions of the Compare view: step sweeps, first divergence, token diffs, CPU sharing
and labels (no Qt, no torch)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from desktop.engine.backend import SHA256_PREFIX, ModelInfo
from desktop.engine.files.bounded import file_sha256
from desktop.engine.params import SamplingParams

MIN_PANES, MAX_PANES = 2, 4
LETTERS = "ABCD"
# What a pane may set for itself; the rest of the sampling values are shared.
OVERRIDE_KEYS = ("temperature", "top_k", "seed")


def sweep_steps(steps: Sequence[int], count: int = MAX_PANES) -> list[int]:
    """Up to ``count`` evenly spaced steps of ``steps``, the first and the latest included."""
    ordered = sorted(set(steps))
    if len(ordered) <= count:
        return ordered
    picks = sorted({round(i * (len(ordered) - 1) / (count - 1)) for i in range(count)})
    return [ordered[i] for i in picks]


def first_divergence(
    runs: Sequence[Sequence[Any]], complete: Sequence[bool], start: int = 0
) -> tuple[int | None, int]:
    """(index where the token lists first differ or None, length known to agree so far).

    The items are token ids, or token texts where a backend gives no ids. A list that has ended
    while another has a token at that index diverges there. A list still streaming that has not
    reached the index yet leaves the answer open (None), and the returned length lets the next
    call start where this one stopped, so streaming costs O(new tokens).
    """
    i = start
    while True:
        have = [i < len(r) for r in runs]
        if all(have):
            if any(r[i] != runs[0][i] for r in runs[1:]):
                return i, i
            i += 1
            continue
        ended = any(not h and done for h, done in zip(have, complete, strict=True))
        return (i if ended and any(have) else None), i


@dataclass(frozen=True)
class DiffSpan:
    """A token range that differs between reply A (``a_start:a_end``) and reply B (``b_start:b_end``).

    ``tag`` is difflib's: "delete" (only in A), "insert" (only in B) or "replace" (both sides differ).
    """

    tag: str
    a_start: int
    a_end: int
    b_start: int
    b_end: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def token_diff(a: Sequence[Any], b: Sequence[Any]) -> list[DiffSpan]:
    """The differing spans between two token lists (no junk heuristics: every token counts)."""
    matcher = difflib.SequenceMatcher(None, list(a), list(b), autojunk=False)
    return [DiffSpan(tag, i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def effective_params(shared: SamplingParams, overrides: Mapping[str, Any]) -> SamplingParams:
    """The sampling values a pane runs with: the shared ones, then its overrides that are set."""
    return shared.with_values(**{k: v for k, v in overrides.items() if k in OVERRIDE_KEYS and v is not None})


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_threads(mode: str, count: int, cores: int) -> list[int | None]:
    """Intra-op threads for each of ``count`` CPU panes sharing ``cores`` cores under ``mode``.

    One pane keeps the default. "parallel": each gets ``cores // count`` and all compute at
    once. "interleaved": each keeps every core but waits its turn per token (a shared lock).
    """
    if count < 2:
        return [None] * count
    if mode == "interleaved":
        return [cores] * count
    return [max(1, cores // count)] * count


def checkpoint_label(meta: Mapping[str, Any]) -> str:
    """A reply's model as "sft/d20 · step 1,500" (from what the reply recorded)."""
    if meta.get("name"):
        return str(meta["name"])
    step = meta.get("step")
    where = "/".join(str(x) for x in (meta.get("source"), meta.get("tag")) if x) or "?"
    return f"{where} · step {step:,}" if isinstance(step, int) else where


def describe_sampling(values: Mapping[str, Any]) -> str:
    """Recorded sampling values as "greedy" or "T 0.8 · top-k 50 · seed 42"."""
    try:
        return SamplingParams.from_dict({k: v for k, v in values.items() if v is not None}).describe()
    except ValueError:
        return "?"


def _tokenizer_identity(tokenizer: str) -> str:
    """What a reply recorded of its tokenizer as comparable text: a served model's stated digest
    ("sha256:…", from ``nanoscope serve``), else the digest of the file it names, else the name."""
    if tokenizer.startswith(SHA256_PREFIX):
        return tokenizer.removeprefix(SHA256_PREFIX)
    return file_sha256(tokenizer) or tokenizer


def same_tokenizer(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether token ids mean the same text under two models (same file, or same bytes)."""
    ta, tb = a.get("tokenizer"), b.get("tokenizer")
    if not ta or not tb or a.get("vocab_size") != b.get("vocab_size"):
        return False
    return ta == tb or _tokenizer_identity(ta) == _tokenizer_identity(tb)


def draft_reader(family: str) -> str:
    """Whose loader reads a checkpoint as a draft: nanochat's reads the fork's too, and one Hugging
    Face backend reads every architecture it knows; a backend drafts only with its own's."""
    if family.startswith("nanochat"):
        return "nanochat"
    return "hf" if family.startswith("hf-") else family


READER_NAMES = {"nanochat": "nanochat", "hf": "Hugging Face", "kempnerforge": "KempnerForge"}


def cross_family_reason(target_family: str, draft_family: str) -> str:
    """Why a model cannot draft with another family's checkpoint, or "" when it can."""
    mine, theirs = draft_reader(target_family), draft_reader(draft_family)
    if mine == theirs:
        return ""
    name, other = READER_NAMES.get(mine, mine), READER_NAMES.get(theirs, theirs)
    return f"a {name} model drafts only with a {name} checkpoint, not a {other} one"


def checkpoint_draft(info: ModelInfo) -> str:
    """A pane's loaded checkpoint as another pane's draft (engine/decode/drafts.py's
    ``PATH@STEP``; a Hugging Face folder has no steps), or "" for a served model."""
    if info.family == "remote":
        return ""
    if info.step is None or draft_reader(info.family) == "hf":
        return info.path
    return f"{info.path}@{info.step}"


def draft_agreement(reply: Sequence[int], skip: Sequence[bool], top: Sequence[Sequence[Any]]) -> float | None:
    """How often a checkpoint's most likely token is the reply's own (the tokens the model chose,
    forced ones left out): the acceptance rate of greedy speculative decoding with this
    checkpoint drafting for the reply's. None when there is nothing to count."""
    hits = [
        bool(rows) and int(rows[0][0]) == token
        for token, skipped, rows in zip(reply, skip, top, strict=False)
        if not skipped
    ]
    return sum(hits) / len(hits) if hits else None
