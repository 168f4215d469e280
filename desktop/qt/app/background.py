"""Work at the edges of the GUI: folder scans, shape summaries, timelines and debounced search.

Blocking file work (scanning checkpoint folders, reading tensor shapes, a run's metas, asking a
server for its models) runs on jobs' threads (``qt/jobs/runner.py``) so the GUI thread never waits
on disk or network; nothing here touches torch compute. Every lookup is latest-wins: a newer
request stops the one under way and what that one would still say is dropped, so a stale list,
summary or timeline never replaces a newer one.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

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
from desktop.engine.runs.saving import SAVED, SaveWatch, files_stamp
from desktop.engine.runs.timeline import RunReader
from desktop.engine.runs.watched import run_files, watch_paths
from desktop.qt.app.run_watcher import RunWatcher, fingerprint
from desktop.qt.jobs.runner import Job, Run
from desktop.store import HistoryStore

SEARCH_DEBOUNCE_S = 0.2


class Background(QObject):
    """Signals (each emitted on the GUI thread):
    checkpoints_found(list): CheckpointEntry list after a scan (after a look the watcher asked
        for, only when something changed).
    runs_changed(): the watched folders or the chosen run's files changed (a look followed).
    summary_ready(object): CheckpointSummary for the picker's current selection.
    summary_listed(object): a CheckpointSummary asked for by ``summarize_many`` (one each).
    folder_opened(object): the FolderReport of a folder the user opened.
    timeline_ready(object) / timeline_failed(object, str): a run's Timeline, or why not.
    timeline_grown(object, object): a run's folder and its Timeline, read again as it trains.
    search_results(list): SearchHit list for the latest query (older queries are dropped).
    """

    checkpoints_found = Signal(list)
    runs_changed = Signal()
    summary_ready = Signal(object)
    search_results = Signal(list)
    summary_listed = Signal(object)
    folder_opened = Signal(object)
    timeline_ready = Signal(object)  # a Timeline
    timeline_grown = Signal(object, object)  # the run's folder, its Timeline read again
    timeline_failed = Signal(object, str)  # the run's folder, one line

    def __init__(self, store: HistoryStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.extra_dirs: list[Path] = []
        # servers.ServerSource list: their models join the list (source "remote") once listed.
        self.servers: list = []
        self._scan = Job("scan", self, latest_wins=True)
        self._summary = Job("summary", self, latest_wins=True)
        self._batch = Job("summaries", self, latest_wins=True)
        self._folder = Job("open-folder", self, latest_wins=True)
        self._timeline = Job("timeline", self, latest_wins=True)
        self._query = ""
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(round(SEARCH_DEBOUNCE_S * 1000))
        self._search_timer.timeout.connect(self._search)
        # (dir, step) -> (the model file's mtime and size, its summary): reading shapes costs a
        # file open per checkpoint, so the picker's list is read once until a file changes.
        # Jobs' threads share it; at worst two of them read the same file.
        self._summaries: dict[tuple[Path, int], tuple[tuple[int, int], CheckpointSummary]] = {}
        # Runs keep training while the window is open: the watcher says when their folders change,
        # and the save watch (one scan at a time holds it) offers a step once its files settled.
        self.saves = SaveWatch()
        self._saves_lock = threading.Lock()
        self.watcher = RunWatcher(self)
        self.watcher.changed.connect(self.look_again)
        self.watched_run: Path | None = None  # the Run tab's run: its logs are watched too
        self._listed: list[CheckpointEntry] | None = None  # what the last scan reported
        self._remote: list[CheckpointEntry] = []  # the servers' models, as last listed
        # The Run tab's run, read again as it grows from where its logs stopped (one read at a time).
        self._reader: RunReader | None = None
        self._reader_lock = threading.Lock()

    def scan(self, base_dir: Path | None = None, quiet: bool = False) -> None:
        """List the checkpoints under ``base_dir`` (default: nanochat's), the added folders and
        the bundled demo; ``checkpoints_found`` reports them, then again with the servers' models.
        ``quiet``: report only if the list changed since the last scan (a look the watcher asked for)."""
        base, extra, servers = base_dir or nanochat_base_dir(), list(self.extra_dirs), list(self.servers)
        self._scan.start(lambda run: self._scan_work(base, extra, servers, quiet, run))

    def look_again(self) -> None:
        """The watched folders changed: list again, and say so (the Run tab reads its run again)."""
        self.scan(quiet=True)

    def _scan_work(self, base_dir: Path, extra: list[Path], servers: list, quiet: bool, run: Run) -> None:
        with self._saves_lock:
            entries = discover(base_dir, extra, self.saves)
            pending = self.saves.pending()
        known = {e.path for e in entries}
        for demo in demo_runs():
            if demo not in known and (steps := model_steps(demo)):
                entries.append(CheckpointEntry("demo", demo.name, demo, steps))
        watched = watch_paths(base_dir, extra, entries)
        if self.watched_run is not None:
            watched += run_files(self.watched_run)
        run.post(self._scanned, entries, watched, fingerprint(map(str, watched)), pending, quiet)
        if servers and not quiet and not run.stopped():
            # local checkpoints first: a slow server must not hold them back
            run.post(self._served, entries, [e for s in servers for e in s.entries()])

    def _scanned(self, entries: list, watched: list[Path], seen: dict, pending: bool, quiet: bool) -> None:
        self.watcher.watch(watched, seen)
        if pending:
            self.watcher.look_again_in(self.saves.settle_s)
        if not quiet:
            self._remote = []  # the servers are asked again
        listed = entries + self._remote  # a look the watcher asked for does not ask the servers
        changed = listed != self._listed
        self._listed = listed
        if changed or not quiet:
            self.checkpoints_found.emit(listed)
        if quiet:
            self.runs_changed.emit()

    def _served(self, entries: list, remote: list) -> None:
        self._remote = remote
        self._listed = entries + remote
        self.checkpoints_found.emit(self._listed)

    def watch_run(self, run: Path | None) -> None:
        """The Run tab shows ``run``: its log and event files are watched as well."""
        self.watched_run = Path(run) if run is not None else None
        self.scan(quiet=True)

    def summarize(self, path: Path, step: int) -> None:
        self._summary.start(lambda _run: self._summary_of(path, step), done=self.summary_ready.emit)

    def summarize_many(self, keys: list) -> None:
        """Summaries of (dir, step) pairs, one ``summary_listed`` each, in order (a newer call
        replaces one still running)."""
        pairs = [(Path(d), int(s)) for d, s in keys]
        self._batch.start(lambda run: self._summaries_of(pairs, run))

    def _summaries_of(self, pairs: list[tuple[Path, int]], run: Run) -> None:
        for path, step in pairs:
            if run.stopped():
                return
            run.post(self.summary_listed.emit, self._summary_of(path, step))

    def _summary_of(self, path: Path, step: int) -> CheckpointSummary:
        """``summarize``, cached while the model file is unchanged (on a job's thread)."""
        try:
            st = model_file(path, step).stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except (NanoscopeError, OSError):
            return summarize(path, step)
        cached = self._summaries.get((path, step))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        before = files_stamp(path, step)
        summary = summarize(path, step)
        if summary.error and files_stamp(path, step) != before:  # rewritten while read: not corrupt
            return replace(
                summary, error=f"step {step:,} is being written; it is read again once its save ends"
            )
        self._summaries[(path, step)] = (stamp, summary)
        return summary

    def open_folder(self, folder: Path) -> None:
        """Look into a folder the user chose (``folder_opened`` reports what is there)."""
        folder = Path(folder)
        self._folder.start(lambda _run: inspect_folder(folder), done=self.folder_opened.emit)

    def read_timeline(self, run: Path, again: bool = False) -> None:
        """A run's timeline, from its metas, off the GUI thread (``timeline_ready``, or
        ``timeline_failed`` with one line); ``again``: the run grew (``timeline_grown``)."""
        folder = Path(run)
        self._timeline.start(
            lambda reading: self._timeline_work(folder, again, reading),
            failed=lambda line: self.timeline_failed.emit(folder, line),
        )

    def _timeline_work(self, folder: Path, again: bool, run: Run) -> None:
        try:
            with self._reader_lock:
                if not again or self._reader is None or self._reader.target != folder:
                    self._reader = RunReader(folder, self._saved_steps)
                timeline = self._reader.read()
        except NanoscopeError as exc:
            run.post(self.timeline_failed.emit, folder, str(exc))
            return
        if again:
            run.post(self.timeline_grown.emit, folder, timeline)
        else:
            run.post(self.timeline_ready.emit, timeline)

    def _saved_steps(self, folder: Path) -> list[int]:
        """A nanochat folder's steps whose save settled: the timeline lists what the picker does."""
        with self._saves_lock:
            return [s.step for s in self.saves.nanochat(folder) if s.state == SAVED]

    def search(self, query: str) -> None:
        """Debounced: only the last query typed within SEARCH_DEBOUNCE_S runs."""
        self._query = query
        self._search_timer.start()

    def _search(self) -> None:
        # SQLite search over FTS5 takes milliseconds; it runs on this thread, which owns the connection.
        query = self._query
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
