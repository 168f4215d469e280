"""A draft's forward compiled by ``torch.compile`` on a thread of its own, used once it is faster.

Why: a small draft's step is per-operation dispatch, not weights. The demo's 2-layer draft runs
about 400 small ops a step (1.0-1.5 ms on a 2-core AMD EPYC); inductor's fused code takes 0.46 ms
for the same step (docs/PERFORMANCE.md, speculative). A draft owes no bits to anyone: rejection
sampling keeps the target's distribution whatever the draft's rounding.

What keeps it out of the user's way:

* The compile and its warm-up run on a thread of their own, one compile at a time in the
  process, while the eager draft goes on drafting. The first compile takes about two minutes on
  two cores (about 25 s when inductor's on-disk cache already holds the code).
* Dropping the draft (a new draft, speculative off, unload, quit) stops the compile where it is,
  not when its graph is done: an app closed mid-compile exits at once, and cleanly.
* The worker runs the compiled code in dynamo's run-only mode (``torch._dynamo.run``): it uses
  the code compiled for the shapes warmed up and never compiles. A call whose guards fail (a shape
  never warmed up) runs eagerly. Passes over more than :data:`COMPILED_ROWS` rows (the draft's
  first pass over a prompt) go to the eager model, which prefills in chunks and reads Stop.
* It is adopted at a reply's start, on the worker's thread, once the compile has ended: both
  forms' steps are timed there, and the compiled one is kept only if it is faster
  (:meth:`~.speculative.Draft.settle`).

It needs a C++ compiler and Python's headers (inductor's CPU code generation). Without them, in a
frozen app, or when the compile fails, the draft stays eager and the log says why.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from desktop.engine.decode.protocols import DecodingModel

logger = logging.getLogger(__name__)

# Passes of up to this many rows run the compiled code: a draft's steps (one row) and its catching
# up after a round (the last proposal kept and the target's own token, or a few more after a
# block the calculator forced). Longer passes are prompts, which the eager model prefills.
COMPILED_ROWS = 4
# Room left in a warm-up's cache past the rows it runs, as a reply's cache has: a cache that is
# full, or of one position, would be guarded on as such (dynamo specialises sizes 0 and 1).
ROOM = 64
# One compile at a time in the process: dynamo's tracing is not meant to run on two threads at
# once (two Compare panes may each compile a draft).
_ONE_AT_A_TIME = threading.Lock()


class CompileStopped(BaseException):
    """Raised inside the compile's thread to end it. A BaseException: the compiler's own
    ``except Exception`` handlers (which would wrap it, or fall back) let it through."""


def _raise_in(thread_id: int) -> None:
    """Have the thread raise :class:`CompileStopped` when it next checks for interrupts (a call
    or a loop's jump back in Python code), so a C++ compile it waits on ends first."""
    # CPython's documented way to interrupt another thread. Never call it to withdraw one (exc
    # NULL): that leaves the interpreter's "pending" flag set for good, which slows every thread
    # and hangs the next traced call (sys.settrace) in CPython 3.11. An interrupt raised is
    # always taken by the thread instead (CompiledTwin._work).
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(CompileStopped))


def _take_interrupt() -> None:
    """Nothing; a Python call, at whose start the interpreter raises an interrupt still pending."""


def why_not_compiled() -> str | None:
    """Why no draft can be compiled here (one line), or None when it can."""
    if getattr(sys, "frozen", False):
        return "a frozen app has no compiler toolchain"
    # CXX may carry a launcher or flags ("ccache g++"): its first word is the program.
    compiler = (os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")).split()[0]
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) on the PATH"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "Python's headers (Python.h) are not installed"
    return None


class CompiledTwin:
    """``twin`` (a model computing what the draft computes, with kernels dynamo can trace: plain
    ``F.linear``) compiled on a thread of its own. ``done`` is set when the thread has ended;
    ``error`` then says why nothing was compiled.

    It is warmed up with each row count up to :data:`COMPILED_ROWS` at each of ``positions``, on
    caches from ``new_cache``, with ids made as the decode loop makes them. Code is compiled for
    what the warm-up meets, so ``positions`` must reach every branch a step can take: the family
    names them (nanochat's sliding windows attend differently once the context passes them)."""

    def __init__(
        self,
        twin: torch.nn.Module,
        new_cache: Callable[[int], Any],
        positions: Sequence[int],
        backend: str = "inductor",
    ) -> None:
        self.twin = twin
        self.new_cache = new_cache
        self.positions = tuple(positions)
        self.backend = backend
        self.done = threading.Event()
        self.error: str | None = None
        self._stop = threading.Event()
        self._run: Callable[..., torch.Tensor] | None = None
        # Not a daemon: a daemon thread still compiling when the interpreter exits aborts the
        # process ("terminate called without an active exception"). stop() ends it promptly, and
        # unloading a model (as quitting does) stops its draft's compile.
        self._thread = threading.Thread(target=self._work, name="draft-compile", daemon=False)
        # Held while stop() may interrupt the thread: an interrupt lands in the compile, never in
        # the code that reports how the compile ended.
        self._interruptible = threading.Lock()
        self._compiling = False
        self._interrupted = False  # at most one interrupt is raised

    def start(self) -> CompiledTwin:
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the compile: at once where it runs Python code, else between two passes."""
        with self._interruptible:
            self._stop.set()
            if self._compiling and not self._interrupted:
                self._interrupted = True
                _raise_in(self._thread.ident or 0)

    @property
    def compiled(self) -> Callable[..., torch.Tensor] | None:
        """The twin's forward in run-only mode, once the thread has ended with it compiled."""
        return self._run if self.done.is_set() else None

    def _work(self) -> None:
        try:
            with _ONE_AT_A_TIME:
                with self._interruptible:
                    self._compiling = True
                try:
                    if not self._stop.is_set():
                        self._compile()
                finally:
                    with self._interruptible:
                        self._compiling = False  # no interrupt is raised from here on
                        owed = self._interrupted
                    if owed:  # raised, maybe not yet taken: take it here rather than below
                        with contextlib.suppress(CompileStopped):
                            _take_interrupt()
        except CompileStopped:
            logger.info("the draft's compile was stopped")
        except Exception as exc:  # anything the compiler raises leaves the draft eager
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            logger.warning("the draft was not compiled: %s", self.error)
        finally:
            if self._interrupted:
                self.error = "stopped"
            self.done.set()

    @torch.inference_mode()
    def _compile(self) -> None:
        import torch._dynamo
        import torch._inductor.config

        logger.info("compiling the draft's forward (%s)", self.backend)
        # Compile in this thread: a pool of compile processes would outlive the compile.
        torch._inductor.config.compile_threads = 1
        # The forward itself, not the module's __call__: dynamo keeps compiled code on the code
        # object it compiled, and run-only mode looks it up there.
        forward = self.twin.forward
        compiled = torch.compile(forward, backend=self.backend, dynamic=True)
        # Each position and row count may be its own graph (a size of 1 is specialised).
        torch._dynamo.config.recompile_limit = max(
            torch._dynamo.config.recompile_limit, 2 * COMPILED_ROWS * len(self.positions)
        )
        device = next(self.twin.parameters()).device
        for start in self.positions:
            # One prefill per position, rolled back after each pass (as a rejection rolls back).
            cache = self.new_cache(start + COMPILED_ROWS + ROOM)
            self.twin(torch.zeros(1, start, dtype=torch.long, device=device), cache, last_only=True)
            for rows in range(1, COMPILED_ROWS + 1):
                if self._stop.is_set():
                    return
                # A new tensor, as the decode loop passes: a view would be guarded on its offset,
                # and an inference tensor, as its ids are (dynamo guards on the dispatch keys).
                compiled(torch.zeros(1, rows, dtype=torch.long, device=device), cache, last_only=True)
                cache.truncate(start)
        self._run = torch._dynamo.run(forward)
        logger.info("the draft's forward is compiled (%s)", self.backend)


class Switched:
    """A draft model whose short passes run ``twin``'s compiled code and the others ``eager``.
    Both compute the same function of the same weights and fill caches of one layout."""

    def __init__(self, eager: DecodingModel, compiled: Callable[..., torch.Tensor]) -> None:
        self.eager = eager
        self.compiled = compiled

    @property
    def config(self) -> Any:
        return self.eager.config

    @property
    def device(self) -> torch.device:
        return self.eager.device

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.eager.compute_dtype

    def __call__(
        self,
        ids: torch.Tensor,
        cache: Any = None,
        last_only: bool = False,
        cancel: threading.Event | None = None,
    ) -> torch.Tensor:
        if cache is not None and ids.shape[1] <= COMPILED_ROWS:
            return self.compiled(ids, cache, last_only=last_only)
        return self.eager(ids, cache, last_only=last_only, cancel=cancel)
