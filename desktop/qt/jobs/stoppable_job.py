"""One job at a time on a Python thread of its own, with a Stop: the window's long tasks (the Run
tab's sweeps and report card, the Hugging Face export) run torch and the disk off the GUI thread.

The thread is never a daemon. A daemon thread still in torch code when the interpreter exits
aborts the process ("terminate called without an active exception", measured with a matmul
loop: five exits of five). Quitting stops each job and waits for it; one that outlives the wait
is joined by the interpreter before it exits, so the job ends cleanly (and cleans up after
itself) rather than taking the process down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class StoppableJob:
    """``start`` runs ``work(cancel)`` on a thread named ``name`` unless the previous run is still
    going; ``stop`` sets that run's ``cancel`` (the work reads it between its items) and may wait."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, name: str, work: Callable[[threading.Event], None]) -> bool:
        """False, doing nothing, while the previous run is still going."""
        if self.running():
            return False
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=work, args=(self._cancel,), name=name, daemon=False)
        self._thread.start()
        return True

    def stop(self, wait: float = 0.0) -> None:
        """Ask the run to end; with ``wait``, wait up to that many seconds for it."""
        self._cancel.set()
        if wait and self._thread is not None:
            self._thread.join(wait)
