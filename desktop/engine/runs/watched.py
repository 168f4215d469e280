"""Which folders and files to watch so that a run's new steps and new log lines are noticed
(Qt-free; the window's watcher asks the OS about these paths and polls them).

A folder's notifications say an entry was added, removed or renamed, not that a file in it grew:
so the folders where steps and runs appear are watched, and, for the run the Run tab shows, its
log and event files themselves (their curves grow line by line).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from pathlib import Path

from desktop.engine.discovery import PHASES, CheckpointEntry
from desktop.engine.errors import NanoscopeError
from desktop.engine.kempnerforge.layout import is_kf_target, run_dir
from desktop.engine.nanochat.experiment_layout import EXPERIMENTS, is_stage_folder, is_tag_folder
from desktop.engine.runs.experiment_logs import stage_logs
from desktop.engine.runs.tensorboard_scalars import event_files, event_folders

MAX_SUBFOLDERS = 256  # of one watched root (a base dir's tokenizer, data and phase folders)


def watch_paths(base: Path, extra_dirs: Iterable[Path], entries: Iterable[CheckpointEntry]) -> list[Path]:
    """The base dir, its phase and experiment folders, each added folder and its subfolders (a
    model or run may appear in one), each listed checkpoint folder or run, and the step folders
    of a KempnerForge run that are still being saved."""
    roots = [Path(base), *map(Path, extra_dirs)]
    found: list[Path] = [*roots]
    for root in roots:
        found += _subfolders(root)
    found += [Path(base) / phase for phase in PHASES]
    experiments = Path(base) / EXPERIMENTS
    for experiment in _subfolders(experiments):
        found += [experiment, *_subfolders(experiment)]
    for entry in entries:
        if entry.source == "remote":
            continue
        found.append(Path(entry.path))
        if entry.source == "kempnerforge":
            found += [Path(entry.path) / f"step_{s.step}" for s in entry.unsaved]
    return [p for p in dict.fromkeys(found) if p.is_dir()]


def run_files(target: Path) -> list[Path]:
    """The files a run's curves are read from, as they are now: an experiment's stage logs, a
    KempnerForge run's TensorBoard event files and their folders (a restarted run adds a file)."""
    target = Path(target)
    if is_stage_folder(target) and is_tag_folder(target.parent):
        target = target.parent
    if is_tag_folder(target):
        return [log for _stage, log in stage_logs(target)]
    if not is_kf_target(target):
        return []
    try:
        folders = event_folders(run_dir(target))
    except NanoscopeError:
        return []
    return [*folders, *(f for folder in folders for f in event_files(folder)[0])]


def _subfolders(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as entries:
            names = [e.name for e in itertools.islice(entries, MAX_SUBFOLDERS * 4) if e.is_dir()]
    except OSError:
        return []
    return [folder / name for name in sorted(names)[:MAX_SUBFOLDERS] if not name.startswith(".")]
