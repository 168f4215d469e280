"""Where a KempnerForge run keeps its checkpoints (checkpoint-formats spec §3.2); torch-free.

::

    <run>/step_<N>/.metadata, *.distcp, train_state.pt, metadata.json
    <run>/step_<N>/pp<k>/.metadata, *.distcp      (pipeline parallel: one DCP directory per stage)
    <run>/latest -> step_<N>                       (the newest committed step)

DCP writes ``.metadata`` last, so a step without it is an unfinished save and is not listed.
``train_state.pt`` is a full pickle and is never opened; ``metadata.json`` is plain JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from desktop.engine.errors import CheckpointError
from desktop.engine.files import bounded
from desktop.engine.kempnerforge.dcp_metadata import METADATA_NAME

STEP_RE = re.compile(r"step_(\d+)")
STAGE_RE = re.compile(r"pp(\d+)")
LATEST = "latest"


@dataclass(frozen=True)
class KFCheckpoint:
    """One step of a run, resolved to the DCP directories that hold its model."""

    run: Path  # the run directory (checkpoint.dir)
    step: int | None
    step_dir: Path
    dcp_dirs: tuple[Path, ...]  # the step dir itself, or its pp<k> stages in order

    @property
    def stages(self) -> int:
        return len(self.dcp_dirs) if self.dcp_dirs[0] != self.step_dir else 0


def _stage_dirs(directory: Path) -> list[tuple[int, Path]]:
    try:
        children = list(directory.iterdir())
    except OSError:
        return []
    stages = [(int(m.group(1)), p) for p in children if (m := STAGE_RE.fullmatch(p.name)) and p.is_dir()]
    return sorted(stages)


def dcp_dirs_of(step_dir: Path) -> tuple[Path, ...]:
    """The DCP directories of a complete step, else CheckpointError saying what is missing."""
    if (step_dir / METADATA_NAME).is_file():
        return (step_dir,)
    stages = _stage_dirs(step_dir)
    if not stages:
        raise CheckpointError(
            f"{step_dir}: no {METADATA_NAME} (DCP writes it last: the save is incomplete, "
            "or this is not a DCP checkpoint)"
        )
    indices = [k for k, _ in stages]
    if indices != list(range(len(stages))):
        # Which of pp0..pp<n-1> are absent (a folder pp1000000000000 names one stage, not a range).
        present = set(indices)
        missing = [k for k in range(len(stages)) if k not in present][:5]
        raise CheckpointError(
            f"{step_dir}: pipeline stages {', '.join(f'pp{k}' for k in missing)} are missing"
        )
    unfinished = [p.name for _, p in stages if not (p / METADATA_NAME).is_file()]
    if unfinished:
        raise CheckpointError(
            f"{step_dir}: stage(s) {', '.join(unfinished)} have no {METADATA_NAME} (incomplete save)"
        )
    return tuple(p for _, p in stages)


def is_dcp_dir(path: Path) -> bool:
    """A DCP checkpoint directory: ``.metadata`` here or in a ``pp<k>`` stage."""
    if (path / METADATA_NAME).is_file():
        return True
    return any((p / METADATA_NAME).is_file() for _, p in _stage_dirs(path))


def _complete(step_dir: Path) -> bool:
    try:
        dcp_dirs_of(step_dir)
    except CheckpointError:
        return False
    return True


def run_steps(run: Path) -> list[int]:
    """Steps of ``run`` whose save completed, ascending."""
    try:
        children = list(run.iterdir())
    except OSError:
        return []
    steps = {
        int(m.group(1)) for p in children if (m := STEP_RE.fullmatch(p.name)) and p.is_dir() and _complete(p)
    }
    return sorted(steps)


def is_run(path: Path) -> bool:
    return path.is_dir() and bool(run_steps(path))


def _is_step_dir(path: Path) -> bool:
    """A ``step_<N>`` folder of a run, or one holding DCP shards, finished or not."""
    if STEP_RE.fullmatch(path.name) is None:
        return False
    return any(path.glob("*.distcp")) or any(path.glob("pp*/*.distcp")) or is_run(path.parent)


def is_kf_target(path: Path) -> bool:
    """Whether ``path`` is a KempnerForge run or one of its steps (what the registry routes here)."""
    path = Path(path).expanduser()
    return path.is_dir() and (is_dcp_dir(path) or is_run(path) or _is_step_dir(path))


def run_dir(path: Path) -> Path:
    """The run a path names: a ``step_<N>`` or ``latest`` folder's parent, else the path itself."""
    path = Path(path).expanduser()
    return path.parent if path.name == LATEST or STEP_RE.fullmatch(path.name) else path


def _step_of_dir(step_dir: Path) -> int | None:
    """The step a DCP directory holds: from its ``step_<N>`` name, else its metadata.json."""
    m = STEP_RE.fullmatch(step_dir.name)
    if m:
        return int(m.group(1))
    try:
        data = bounded.read_json(step_dir / "metadata.json", "config", limit=1 << 20)
    except bounded.FileRefused:  # absent, not a file, unreadable, not UTF-8 or not (bounded) JSON
        return None
    step = data.get("step") if isinstance(data, dict) else None
    return step if type(step) is int else None


def _latest_step(run: Path, steps: list[int]) -> int:
    """The step ``latest`` points at when it names a complete step of this run, else the newest."""
    link = run / LATEST
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):
        return steps[-1]
    m = STEP_RE.fullmatch(target.name)
    if m and target.parent == run.resolve() and int(m.group(1)) in steps:
        return int(m.group(1))
    return steps[-1]


def resolve_checkpoint(path: Path, step: int | None = None) -> KFCheckpoint:
    """``path`` (a run: its ``latest`` or ``step``; a ``step_<N>`` or ``latest`` directory) resolved."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if is_dcp_dir(path) or _is_step_dir(path):
        step_dir = path.resolve() if path.name == LATEST else path
        here = _step_of_dir(step_dir)
        if step is not None and here is not None and step != here:
            raise CheckpointError(f"{path}: this is step {here}, not step {step}")
        named = STEP_RE.fullmatch(step_dir.name) is not None
        run = path.parent if named or path.name == LATEST else path
        return KFCheckpoint(run, here if here is not None else step, step_dir, dcp_dirs_of(step_dir))
    steps = run_steps(path)
    if not steps:
        raise CheckpointError(
            f"{path}: not a KempnerForge run (no step_<N> directory with a complete DCP save)"
        )
    if step is None:
        step = _latest_step(path, steps)
    elif step not in steps:
        shown = ", ".join(map(str, steps[-8:]))
        raise CheckpointError(f"{path}: no complete step {step} (available: {shown})")
    step_dir = path / f"step_{step}"
    return KFCheckpoint(path, step, step_dir, dcp_dirs_of(step_dir))


def find_runs(roots: list[Path], depth: int = 2) -> list[tuple[Path, list[int]]]:
    """KempnerForge runs at or below each root (down to ``depth`` levels), with their steps."""
    found: dict[Path, list[int]] = {}

    def visit(directory: Path, level: int) -> None:
        steps = run_steps(directory)
        if steps:
            found.setdefault(directory, steps)
            return
        if level >= depth:
            return
        try:
            children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for child in children:
            if STEP_RE.fullmatch(child.name) is None:
                visit(child, level + 1)

    for root in roots:
        if Path(root).is_dir():
            visit(Path(root), 0)
    return sorted(found.items())
