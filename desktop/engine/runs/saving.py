"""Which steps of a run are ready to open, which are still being written, and which never
finished (Qt-free).

A run that is training writes its steps while Nanoscope looks at it. Each family saves in an
order that says when a step is done:

* nanochat's ``save_checkpoint`` writes ``model_<step>.pt`` (torch's zip: its end record is
  written last), then ``meta_<step>.json``, then the optimizer shards (not needed to chat);
* KempnerForge's DCP writes the ``*.distcp`` shards, then ``.metadata`` (renamed into place);
* ``save_pretrained`` writes ``config.json`` and safetensors files whose headers state every
  tensor's bytes, so a file cut short says so.

A step is **saved** once its files are complete by those rules *and* unchanged since a look at
least ``settle_s`` earlier (a copy that writes the meta first, or a file still growing, is not
caught half-way). Until then it is **saving**, with what it waits for. One that stops changing
for ``give_up_s`` without completing, or that a later saved step has overtaken, is
**incomplete**, with its reason. Steps already on disk at the first look of a folder need no
second look: complete files are saved at once, and an unfinished step counts from its newest
file's modification time.

A :class:`SaveWatch` keeps what it saw at its last look (the files' sizes and modification times
and the verdict), so looking again costs one ``stat`` per file of a step already saved.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import FileRefused, open_regular
from desktop.engine.hf.files import CONFIG_NAME, INDEX_NAME, read_json, read_tensor_index
from desktop.engine.kempnerforge.dcp_metadata import METADATA_NAME
from desktop.engine.kempnerforge.layout import STEP_RE, dcp_dirs_of
from desktop.engine.nanochat import checkpoint as ckpt

SAVED, SAVING, INCOMPLETE = "saved", "saving", "incomplete"
SETTLE_S = 1.0  # a complete step's files must stay unchanged this long before it is offered
GIVE_UP_S = 120.0  # an unfinished step unchanged this long is shown as incomplete
ZIP_END = b"PK\x05\x06"  # the zip end record: the last thing torch.save writes
ZIP_START = b"PK\x03\x04"
ZIP_END_BYTES = 22  # the end record without a comment (torch writes none)

R = TypeVar("R")
Stamp = tuple[tuple[str, int, int], ...]  # (file name, size, mtime_ns) of a step's files


@dataclass(frozen=True)
class StepState:
    """One step of a folder: ``state`` is saved, saving or incomplete; ``reason`` says what a
    step that is not saved waits for, or why it never finished."""

    step: int
    state: str
    reason: str = ""

    def label(self) -> str:
        """How a list shows a step that cannot be opened yet: "step 30 · saving…"."""
        if self.state == SAVING:
            return f"step {self.step:,} · saving…"
        return f"step {self.step:,} · incomplete"


@dataclass
class _Seen:
    stamp: Stamp
    since: float  # the clock when the files last changed (or, at a first look, their mtime's age)
    state: str
    reason: str


class SaveWatch:
    """Remembers each step's files between looks. ``clock`` is monotonic seconds (the watcher's
    timers use the same clock). Looks may come from one thread at a time."""

    def __init__(
        self,
        settle_s: float = SETTLE_S,
        give_up_s: float = GIVE_UP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settle_s = settle_s
        self.give_up_s = give_up_s
        self._clock = clock
        # (family, folder) -> step -> what the last look saw
        self._seen: dict[tuple[str, Path], dict[int, _Seen]] = {}

    def nanochat(self, folder: Path) -> list[StepState]:
        """Every step a nanochat checkpoint folder names (by its model, meta or optimizer files)."""
        return self._look(Path(folder), _NANOCHAT)

    def kempnerforge(self, run: Path) -> list[StepState]:
        """Every ``step_<N>`` folder of a KempnerForge run."""
        return self._look(Path(run), _KEMPNERFORGE)

    def hf(self, folder: Path) -> StepState:
        """A Hugging Face folder as one step (0): saved when its config and weights are whole."""
        states = self._look(Path(folder), _HF)
        return states[0] if states else StepState(0, INCOMPLETE, f"no {CONFIG_NAME}")

    def pending(self) -> bool:
        """Whether any step seen at the last looks is still saving (a look soon may settle it)."""
        return any(seen.state == SAVING for steps in self._seen.values() for seen in steps.values())

    def _look(self, folder: Path, family: _Family) -> list[StepState]:
        key = (family.name, folder)
        first = key not in self._seen
        before = self._seen.get(key, {})
        now = self._clock()
        seen: dict[int, _Seen] = {}  # steps removed since (a run pruned its old steps) are forgotten
        states = [
            self._state(folder, step, family, now, first, before.get(step), seen)
            for step in family.steps(folder)
        ]
        self._seen[key] = seen
        return _overtaken(states)

    def _state(
        self,
        folder: Path,
        step: int,
        family: _Family,
        now: float,
        first: bool,
        seen: _Seen | None,
        into: dict[int, _Seen],
    ) -> StepState:
        stamp = family.stamp(folder, step)
        if seen is not None and seen.stamp == stamp:
            if seen.state == SAVED:
                into[step] = seen
                return StepState(step, SAVED)  # unchanged since it was whole: no file is read again
            since = seen.since
        elif seen is None and first:
            since = now - _age(stamp)  # there before Nanoscope looked: as old as its newest file
        else:
            since = now  # new, or changed since the last look
        reason = family.problem(folder, step)
        settled = now - since >= self.settle_s or (seen is None and first)
        if not reason and settled:
            state = SAVED
        elif not reason:
            state, reason = SAVING, "its files are still changing"
        elif now - since >= self.give_up_s:
            state = INCOMPLETE
        else:
            state = SAVING
        into[step] = _Seen(stamp, since, state, reason)
        return StepState(step, state, reason)


def _overtaken(states: list[StepState]) -> list[StepState]:
    """A step still unfinished when a later one is saved never will be: the writer moved on."""
    saved = [s.step for s in states if s.state == SAVED]
    last = max(saved, default=-1)
    return [
        StepState(s.step, INCOMPLETE, s.reason) if s.state == SAVING and s.step < last else s for s in states
    ]


def _age(stamp: Stamp) -> float:
    """Seconds since the newest of the files changed (0 when none is there)."""
    newest = max((mtime for _, _, mtime in stamp), default=0)
    return max(0.0, time.time() - newest / 1e9) if newest else 0.0


def _stamp(paths: Iterable[Path]) -> Stamp:
    found = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        found.append((path.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))


def _listing(folder: Path) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(folder)]
    except OSError:
        return []


@dataclass(frozen=True)
class _Family:
    """How one family names its steps, which files make one, and what an unfinished one lacks."""

    name: str
    steps: Callable[[Path], list[int]]
    stamp: Callable[[Path, int], Stamp]
    problem: Callable[[Path, int], str]


# ----- nanochat --------------------------------------------------------------------------------


def _nanochat_steps(folder: Path) -> list[int]:
    found: set[int] = set()
    for name in _listing(folder):
        match = ckpt.MODEL_RE.fullmatch(name) or ckpt.META_RE.fullmatch(name)
        if match is not None:
            found.add(int(match.group(1)))
    return sorted(found)


def _nanochat_files(folder: Path, step: int) -> list[Path]:
    names = (f"model_{step:06d}.pt", f"model_{step}.pt", f"meta_{step:06d}.json", f"meta_{step}.json")
    return [folder / name for name in dict.fromkeys(names)]


def _nanochat_problem(folder: Path, step: int) -> str:
    try:
        model = ckpt.model_file(folder, step)
    except NanoscopeError:
        return f"model_{step:06d}.pt is not written"
    if not _zip_is_whole(model):
        return f"{model.name} is cut short"
    try:
        meta = ckpt.meta_file(folder, step)
    except NanoscopeError:
        return f"meta_{step:06d}.json is not written"
    try:
        ckpt.read_meta(meta)
    except NanoscopeError:
        return f"{meta.name} is not whole JSON"
    return ""


def _zip_is_whole(path: Path) -> bool:
    """A torch zip whose end record is in place (torch.save writes it last); a file in the
    older pickle format has none to check and counts as whole."""
    try:
        with open_regular(path) as f:
            if f.read(len(ZIP_START)) != ZIP_START:
                return True
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size < ZIP_END_BYTES:
                return False
            f.seek(size - ZIP_END_BYTES)
            return f.read(len(ZIP_END)) == ZIP_END
    except (OSError, FileRefused):
        return False


_NANOCHAT = _Family(
    "nanochat",
    _nanochat_steps,
    lambda folder, step: _stamp(_nanochat_files(folder, step)),
    _nanochat_problem,
)


# ----- KempnerForge ----------------------------------------------------------------------------


def _kf_steps(run: Path) -> list[int]:
    steps = {int(m.group(1)) for name in _listing(run) if (m := STEP_RE.fullmatch(name))}
    return sorted(s for s in steps if (run / f"step_{s}").is_dir())


def _kf_stamp(run: Path, step: int) -> Stamp:
    step_dir = run / f"step_{step}"
    names = _listing(step_dir)
    stages = [step_dir / n for n in names if n.startswith("pp") and (step_dir / n).is_dir()]
    files = [step_dir / n for n in names] + [s / n for s in stages for n in _listing(s)]
    return _stamp(p for p in files if p.suffix == ".distcp" or p.name == METADATA_NAME)


def _kf_problem(run: Path, step: int) -> str:
    step_dir = run / f"step_{step}"
    try:
        dcp_dirs_of(step_dir)
    except NanoscopeError:
        return f"step_{step} has no {METADATA_NAME} yet (DCP writes it last)"
    return ""


_KEMPNERFORGE = _Family("kempnerforge", _kf_steps, _kf_stamp, _kf_problem)


# ----- Hugging Face ----------------------------------------------------------------------------


def _hf_stamp(folder: Path, _step: int) -> Stamp:
    names = [n for n in _listing(folder) if n.endswith(".safetensors") or n in (CONFIG_NAME, INDEX_NAME)]
    return _stamp(folder / n for n in names)


def _hf_problem(folder: Path, _step: int) -> str:
    try:
        read_json(folder / CONFIG_NAME, "config")
        read_tensor_index(folder)
    except NanoscopeError as exc:
        return str(exc).replace(f"{folder}/", "").replace(f"{folder}: ", "")
    return ""


_HF = _Family("hf", lambda folder: [0] if (folder / CONFIG_NAME).exists() else [], _hf_stamp, _hf_problem)


# ----- reading files that may be rewritten ------------------------------------------------------


class StillWriting(NanoscopeError):
    """A checkpoint's files kept changing while they were read: a save is writing them."""


def files_stamp(target: Path, step: int | None) -> Stamp:
    """The sizes and modification times of the files a load of ``target`` at ``step`` reads."""
    target = Path(target)
    if (target / CONFIG_NAME).exists():
        return _hf_stamp(target, 0)
    named = STEP_RE.fullmatch(target.name)
    if named is not None and target.is_dir():  # a step folder of a run
        return _kf_stamp(target.parent, int(named.group(1)))
    if step is not None and (target / f"step_{step}").is_dir():
        return _kf_stamp(target, step)
    if step is None:
        steps = _nanochat_steps(target)
        step = steps[-1] if steps else None
    return _stamp(_nanochat_files(target, step)) if step is not None else ()


def read_unchanged(
    read: Callable[[], R],
    target: Path,
    step: int | None,
    wait: Callable[[float], object] = time.sleep,
    attempts: int = 3,
    settle_s: float = SETTLE_S,
) -> R:
    """``read()`` of ``target`` 's files; when it fails while the files changed under it (a save
    rewriting them), it is tried again once they have had ``settle_s`` to settle, and after
    ``attempts`` a :class:`StillWriting` says so: a file being written is never called corrupt.
    ``wait``: how to wait (a worker's stop event's ``wait``, so closing the app is not held up)."""
    for attempt in range(1, attempts + 1):
        before = files_stamp(target, step)
        try:
            return read()
        except NanoscopeError:
            if files_stamp(target, step) == before:
                raise  # nothing moved: what it says is about the files as they are
            if attempt == attempts:
                raise StillWriting(
                    f"{Path(target).name}: its files changed while they were read (a save is writing "
                    "them); try again once the save ends"
                ) from None
        wait(settle_s)
    raise AssertionError("unreachable")
