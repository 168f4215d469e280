"""Intra-op threads for one request (Compare panes running side by side on the CPU)."""

from __future__ import annotations

import torch


class torch_threads:
    """Run with ``count`` intra-op threads on this thread, then restore the previous count.

    torch keeps the count per thread once a thread has run an op (and hands the last value set
    to threads that start later), so parallel Compare panes each set their share on their own
    thread. A generator holds it across its yields, which all run on the worker's thread.
    """

    def __init__(self, count: int | None) -> None:
        self.count = count
        self.before = 0

    def __enter__(self) -> None:
        if self.count:
            self.before = torch.get_num_threads()
            torch.set_num_threads(self.count)

    def __exit__(self, *exc: object) -> None:
        if self.count:
            torch.set_num_threads(self.before)
