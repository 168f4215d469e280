"""Work at the edges of the GUI, on the qasync event loop: folder scans and debounced search.

Blocking file work (scanning checkpoint folders, reading tensor shapes) runs in the loop's
default executor so the GUI thread never waits on disk; nothing here touches torch compute.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from .engine.checkpoint import model_steps
from .engine.discovery import CheckpointEntry, discover, summarize
from .paths import demo_checkpoint, nanochat_base_dir
from .store import HistoryStore

SEARCH_DEBOUNCE_S = 0.2


class Background(QObject):
    """Signals:
    checkpoints_found(list): CheckpointEntry list after a scan.
    summary_ready(object): CheckpointSummary for the picker's current selection.
    search_results(list): SearchHit list for the latest query (older queries are dropped).
    """

    checkpoints_found = Signal(list)
    summary_ready = Signal(object)
    search_results = Signal(list)

    def __init__(self, store: HistoryStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.extra_dirs: list[Path] = []
        # servers.ServerSource list: their models join the list (source "remote") once listed.
        self.servers: list = []
        self._search_task: asyncio.Task | None = None
        self._summary_task: asyncio.Task | None = None

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
        demo = demo_checkpoint()
        if demo is not None and all(e.path != demo for e in entries):
            entries.append(CheckpointEntry("demo", "demo", demo, model_steps(demo)))
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
        summary = await loop.run_in_executor(None, summarize, path, step)
        self.summary_ready.emit(summary)

    def search(self, query: str) -> None:
        """Debounced: only the last query typed within SEARCH_DEBOUNCE_S runs."""
        if self._search_task is not None:
            self._search_task.cancel()
        self._search_task = self._spawn(self._search(query))

    async def _search(self, query: str) -> None:
        await asyncio.sleep(SEARCH_DEBOUNCE_S)
        # SQLite search over FTS5 takes milliseconds; it runs on this thread, which owns the connection.
        self.search_results.emit(self.store.search(query) if query.strip() else [])
