"""Work at the edges of the GUI, on the qasync event loop: folder scans and debounced search.

Blocking file work (scanning checkpoint folders, reading tensor shapes) runs in the loop's
default executor so the GUI thread never waits on disk; nothing here touches torch compute.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from desktop.config.paths import demo_runs, nanochat_base_dir
from desktop.engine.discovery import (
    CheckpointEntry,
    CheckpointSummary,
    discover,
    summarize,
    unlisted_problem,
)
from desktop.engine.errors import NanoscopeError
from desktop.engine.nanochat.checkpoint import (
    detect_unsupported,
    meta_file,
    model_file,
    model_steps,
    read_meta,
)
from desktop.engine.runs.timeline import timeline_of
from desktop.store import HistoryStore

SEARCH_DEBOUNCE_S = 0.2


class Background(QObject):
    """Signals:
    checkpoints_found(list): CheckpointEntry list after a scan.
    summary_ready(object): CheckpointSummary for the picker's current selection.
    summary_listed(object): a CheckpointSummary asked for by ``summarize_many`` (one each).
    folder_opened(object): the FolderReport of a folder the user opened.
    timeline_ready(object) / timeline_failed(object, str): a run's Timeline, or why not.
    search_results(list): SearchHit list for the latest query (older queries are dropped).
    """

    checkpoints_found = Signal(list)
    summary_ready = Signal(object)
    search_results = Signal(list)
    summary_listed = Signal(object)
    folder_opened = Signal(object)
    timeline_ready = Signal(object)  # a Timeline
    timeline_failed = Signal(object, str)  # the run's folder, one line

    def __init__(self, store: HistoryStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.extra_dirs: list[Path] = []
        # servers.ServerSource list: their models join the list (source "remote") once listed.
        self.servers: list = []
        self._search_task: asyncio.Task | None = None
        self._summary_task: asyncio.Task | None = None
        self._batch_task: asyncio.Task | None = None
        # (dir, step) -> (the model file's mtime and size, its summary): reading shapes costs a
        # file open per checkpoint, so the picker's list is read once until a file changes.
        self._summaries: dict[tuple[Path, int], tuple[tuple[int, int], CheckpointSummary]] = {}

    def _spawn(self, coro) -> asyncio.Task | None:
        """Schedule on the running (qasync) loop; without one (plain Qt tests) the work is skipped."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            coro.close()
            return None
        return loop.create_task(coro)

    def scan(self, base_dir: Path | None = None) -> None:
        """List the checkpoints under ``base_dir`` (default: nanochat's), the added folders and
        the bundled demo; ``checkpoints_found`` reports them."""
        self._spawn(self._scan(base_dir or nanochat_base_dir()))

    async def _scan(self, base_dir: Path) -> None:
        loop = asyncio.get_running_loop()
        entries = await loop.run_in_executor(None, discover, base_dir, list(self.extra_dirs))
        known = {e.path for e in entries}
        for run in demo_runs():
            if run not in known and (steps := model_steps(run)):
                entries.append(CheckpointEntry("demo", run.name, run, steps))
        self.checkpoints_found.emit(entries)
        if self.servers:  # local checkpoints first: a slow server must not hold them back
            listed = await asyncio.gather(*(loop.run_in_executor(None, s.entries) for s in self.servers))
            self.checkpoints_found.emit(entries + [e for server in listed for e in server])

    def summarize(self, path: Path, step: int) -> None:
        if self._summary_task is not None:
            self._summary_task.cancel()
        self._summary_task = self._spawn(self._summarize(path, step))

    async def _summarize(self, path: Path, step: int) -> None:
        loop = asyncio.get_running_loop()
        summary = await loop.run_in_executor(None, self._summary_of, path, step)
        self.summary_ready.emit(summary)

    def summarize_many(self, keys: list) -> None:
        """Summaries of (dir, step) pairs, one ``summary_listed`` each, in order (a newer call
        replaces one still running)."""
        if self._batch_task is not None:
            self._batch_task.cancel()
        self._batch_task = self._spawn(self._summarize_many([(Path(d), int(s)) for d, s in keys]))

    async def _summarize_many(self, keys: list[tuple[Path, int]]) -> None:
        loop = asyncio.get_running_loop()
        for path, step in keys:
            self.summary_listed.emit(await loop.run_in_executor(None, self._summary_of, path, step))

    def _summary_of(self, path: Path, step: int) -> CheckpointSummary:
        """``summarize``, cached while the model file is unchanged (runs in the executor)."""
        try:
            st = model_file(path, step).stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except (NanoscopeError, OSError):
            return summarize(path, step)
        cached = self._summaries.get((path, step))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        summary = summarize(path, step)
        self._summaries[(path, step)] = (stamp, summary)
        return summary

    def open_folder(self, folder: Path) -> None:
        """Look into a folder the user chose (``folder_opened`` reports what is there)."""
        self._spawn(self._open_folder(Path(folder)))

    async def _open_folder(self, folder: Path) -> None:
        loop = asyncio.get_running_loop()
        self.folder_opened.emit(await loop.run_in_executor(None, inspect_folder, folder))

    def read_timeline(self, run: Path) -> None:
        """A run's timeline, from its metas, off the GUI thread (``timeline_ready``)."""
        self._spawn(self._read_timeline(Path(run)))

    async def _read_timeline(self, run: Path) -> None:
        loop = asyncio.get_running_loop()
        try:
            self.timeline_ready.emit(await loop.run_in_executor(None, timeline_of, run))
        except NanoscopeError as exc:
            self.timeline_failed.emit(run, str(exc))

    def search(self, query: str) -> None:
        """Debounced: only the last query typed within SEARCH_DEBOUNCE_S runs."""
        if self._search_task is not None:
            self._search_task.cancel()
        self._search_task = self._spawn(self._search(query))

    async def _search(self, query: str) -> None:
        await asyncio.sleep(SEARCH_DEBOUNCE_S)
        # SQLite search over FTS5 takes milliseconds; it runs on this thread, which owns the connection.
        self.search_results.emit(self.store.search(query) if query.strip() else [])


@dataclass(frozen=True)
class FolderReport:
    """What an opened folder holds: its checkpoint folders (itself, or its subfolders, such as a
    nanochat ``chatsft_checkpoints``), and one readable line when nothing there can be used."""

    folder: Path
    dirs: tuple[Path, ...]
    problem: str = ""


NOTHING_FOUND = (
    "no checkpoint in it: Nanoscope looks for model_<step>.pt files, each with its meta_<step>.json"
)


def inspect_folder(folder: Path) -> FolderReport:
    """Find the checkpoint folders in ``folder`` and check the newest step of the first one
    without loading it (blocking: run it off the GUI thread)."""
    try:
        detect_unsupported(folder)
    except NanoscopeError as exc:  # not nanochat's: a run or model folder of another family?
        other = _other_families(folder)
        return other if other.dirs else FolderReport(folder, (), _short(str(exc), folder))
    try:
        subdirs = sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError as exc:
        return FolderReport(folder, (), f"cannot be read ({exc.strerror or exc})")
    dirs = [folder] if model_steps(folder) else [d for d in subdirs if model_steps(d)]
    if not dirs:
        return _other_families(folder)
    first = dirs[0]
    step = model_steps(first)[-1]
    problems = []
    summary = summarize(first, step)
    if summary.error:
        problems.append(summary.error)
    try:
        meta = read_meta(meta_file(first, step))
    except NanoscopeError as exc:
        meta = None
        if str(exc) not in problems:
            problems.append(str(exc))
    if meta is not None and not isinstance(meta.get("model_config"), dict):
        name = meta_file(first, step).name
        what = "is empty" if not meta else "has no model_config"
        problems.append(f"{name} {what}: it needs the model_config nanochat saves with the weights")
    return FolderReport(folder, tuple(dirs), "; ".join(_short(p, first) for p in problems))


def _other_families(folder: Path) -> FolderReport:
    """A folder without nanochat checkpoints: the Hugging Face model folders and KempnerForge
    runs in it (or that it is), as the scan finds them, the first one's newest step checked."""
    found = [e for e in discover(folder, [folder]) if e.source in ("hf", "kempnerforge") and e.steps]
    if not found:
        return FolderReport(folder, (), _short(unlisted_problem(folder), folder) or NOTHING_FOUND)
    first = found[0]
    problem = summarize(first.path, first.steps[-1]).error
    return FolderReport(folder, tuple(e.path for e in found), _short(problem, first.path))


def _short(message: str, folder: Path) -> str:
    """File names instead of whole paths inside ``folder`` (the banner names the folder)."""
    return message.replace(f"{folder}{os.sep}", "").replace(f"{folder}: ", "")
