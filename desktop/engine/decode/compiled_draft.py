"""A model's forward compiled by ``torch.compile`` on a thread of its own, used once it is faster:
a draft's steps, and the target's verifying passes in speculative decoding.

Why: a small model's step is per-operation dispatch, not weights. The demo's 2-layer draft runs
about 400 small ops a step (1.0-1.5 ms on a 2-core AMD EPYC); inductor's fused code takes
0.25-0.33 ms for the same step, its products and attention inlined (docs/PERFORMANCE.md,
speculative). A draft owes no bits to anyone: rejection
sampling keeps the target's distribution whatever the draft's rounding. The target's verifying
passes owe it their distribution, not nanochat's bits: a pass over a few rows already sums in
another order than one-row steps (kernels.gemv.few_rows), and the compiled code computes the same
function in fp32, its logits within float rounding of the eager ones. Plain decoding (exact
mode) never runs compiled code.

What keeps it out of the user's way:

* The compile and its warm-up run on a thread of their own, one compile at a time in the
  process, while the eager model goes on. The first compile takes about two minutes on two
  cores (about 25 s when inductor's on-disk cache already holds the code).
* That thread runs at the lowest OS priority, with one inductor compile worker, and it waits
  (at the next call it makes into the compiler) while a reply streams or the user types
  (:mod:`desktop.engine.foreground`): a compile takes what the user leaves.
* One compile per model and settings in the process (:func:`shared_twin`): a second request for
  it (the same model in two Compare panes, or loaded again) holds the first, under way or done.
* Dropping the model's use (a new draft, speculative off, unload, quit) stops the compile where
  it is, not when its graph is done: at the next Python function it calls (:class:`CallStop`), so
  an app closed mid-compile exits at once, and cleanly.
* The worker runs the compiled code in dynamo's run-only mode (``torch._dynamo.run``): it uses
  the code compiled for the shapes warmed up and never compiles. A call whose guards fail (a shape
  never warmed up) runs eagerly. Passes over more rows than were warmed up (a prompt) go to the
  eager model, which prefills in chunks and reads Stop.
* It is adopted at a reply's start, on the worker's thread, once the compile has ended: both
  forms are timed there, and the compiled one is kept only if it is faster
  (:meth:`~.speculative.Draft.settle`, :meth:`~.verifier.Verifier.settle`). That decision and
  the costs it brings are kept per model and machine (:class:`~.pass_timing.Decisions`): the
  costs set the draft lengths, hence a seed's ids, so a later session uses them from its first
  reply, and never compiles a form found slower.

It needs a C++ compiler and Python's headers (inductor's CPU code generation). Without them, in a
frozen app, or when the compile fails, the model stays eager and the log says why.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from desktop.engine.decode.protocols import DecodingModel
from desktop.engine.foreground import HELD, lower_this_threads_priority, wait_while_held
from desktop.engine.kernels.native import why_no_toolchain
from desktop.engine.text_lines import error_text

logger = logging.getLogger(__name__)

# A draft's passes of up to this many rows run the compiled code: its steps (one row) and its
# catching up after a round (the last proposal kept and the target's own token, or a few more
# after a block the calculator forced). Longer passes are prompts, which the eager model prefills.
COMPILED_ROWS = 4
# Room left in a warm-up's cache past the rows it runs, as a reply's cache has: a cache that is
# full, or of one position, would be guarded on as such (dynamo specialises sizes 0 and 1).
ROOM = 64
# Python's switch interval while a compile runs. A compile is Python code that holds the GIL; the
# worker (and the GUI) give it up at every torch op and wait to take it back, by default up to
# 5 ms each time: a demo reply streamed during a compile took 9.3 s instead of 0.5 (a draft's
# step 8.6 ms instead of 1.5). At 0.1 ms the same reply took 0.55 s (2-core AMD EPYC).
SWITCH_WHILE_COMPILING_S = 1e-4
# One compile at a time in the process: dynamo's tracing is not meant to run on two threads at
# once (two Compare panes may each compile a draft).
_ONE_AT_A_TIME = threading.Lock()
# Where the compiler's own Python code is: a compile waits for the foreground at a call into it,
# never at a call into the standard library, whose locks (logging's, an import's) other threads
# take too.
_TORCH = str(Path(torch.__file__).parent)
COMPILER_FILES = tuple(os.path.join(_TORCH, d, "") for d in ("_dynamo", "_inductor", "fx", "_functorch"))
# Frames that may hold a lock another thread takes: a wait under one of them could wait on the
# reply that waits on the lock.
_LOCKING_FILES = (os.path.dirname(logging.__file__), "<frozen importlib")
# The compiles under way or done in this process, by what they compile (shared_twin).
_SHARED: dict[str, CompiledTwin] = {}
_SHARED_LOCK = threading.Lock()


class CompileStopped(BaseException):
    """Raised inside the compile's thread to end it. A BaseException: the compiler's own
    ``except Exception`` handlers (which would wrap it, or fall back) let it through."""


class CallStop:
    """Ends the code run inside it, on its thread, once :meth:`request` is called from any thread:
    :class:`CompileStopped` is raised at the entry of the next Python function that thread calls
    outside logging and imports (by a trace function, set for this thread alone, that raises at
    most once). And while the
    foreground holds background work (:mod:`desktop.engine.foreground`) that thread waits at the
    entry of the next function it calls in ``pause_in`` (the compiler's files), unless a frame
    under it may hold a lock other threads take (logging's, an import's); ``waiting`` is set
    meanwhile. A stop ends the wait.

    Not an asynchronous exception (``PyThreadState_SetAsyncExc``), which lands at whatever
    instruction the thread is at: it once landed after a lock's ``acquire()`` had returned and
    before the ``try`` that releases it (Python 3.11's logging takes its module lock so), and that
    lock stayed held by the ended thread: the next compile, and every other thread's logging,
    waited on it for good. A function's entry comes before any lock the function takes, and the
    cleanup the exception unwinds through runs whole (nothing is raised in it). Not at the entry
    of a function called under logging or an import either: a handler's ``release()`` in the
    ``finally`` after its ``emit`` is such a function, and a stop raised there left the handler's
    lock held by the ended thread (every later log line in the process then waited for good: a
    test run hung so). The price: Python
    code runs slower traced (a compile of the demo's draft, inductor's cache warm: 19 -> 29 s on a
    2-core AMD EPYC). A C++ compile it waits on ends first."""

    def __init__(self, pause_in: tuple[str, ...] = COMPILER_FILES) -> None:
        self._requested: list[bool] = []  # a list: the trace function reads it without a lookup
        self._before: Callable[..., Any] | None = None  # the thread's trace function before it
        self.pause_in = pause_in
        self.waiting = threading.Event()  # set while the thread waits for the foreground
        self._wake = threading.Event()  # ends a wait: the foreground is free, or a stop

    def request(self) -> None:
        self._requested.append(True)
        self._wake.set()

    def __enter__(self) -> CallStop:
        requested, pause_in = self._requested, self.pause_in
        self._before = before = sys.gettrace()  # a debugger's or a coverage tool's, given back

        def check(frame: types.FrameType, event: str, arg: object) -> None:
            if HELD and not requested and frame.f_code.co_filename.startswith(pause_in):
                self._wait_for_foreground(frame)
            if requested and _may_wait(frame):  # where a wait may hold no lock, a stop may land
                sys.settrace(before)  # once: what the exception unwinds through runs unchecked
                raise CompileStopped

        sys.settrace(check)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._before)

    def _wait_for_foreground(self, frame: types.FrameType) -> None:
        if not _may_wait(frame):
            return
        self.waiting.set()
        try:
            while True:
                self._wake.clear()  # before the checks: a stop requested after them still wakes it
                if not HELD or self._requested:
                    return
                wait_while_held(self._wake)
        finally:
            self.waiting.clear()


def _may_wait(frame: types.FrameType) -> bool:
    """Whether the thread running ``frame`` can wait, or end, without holding a lock another
    thread takes: logging's module lock, or any frame of logging or of an import under it (a
    handler's lock, a module's import lock)."""
    owned = getattr(logging._lock, "_is_owned", None)  # type: ignore[attr-defined]
    if owned is not None and owned():
        return False
    under: types.FrameType | None = frame
    while under is not None:
        if under.f_code.co_filename.startswith(_LOCKING_FILES) or under.f_code.co_name == "<module>":
            return False
        under = under.f_back
    return True


def keep_compiled_code_in(folder: Path) -> None:
    """Inductor's on-disk cache in ``folder`` (beside the kept kernel timings), unless the user
    named one: its default, under the system's temporary folder, is emptied at a reboot on many
    systems, and a compile that paid off would then take minutes again instead of ~25 s. Before
    the process's first compile: inductor reads it then."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder))


def why_not_compiled() -> str | None:
    """Why nothing can be compiled here (one line), or None when it can: inductor's CPU code is
    C++, built as the native kernels are (kernels/native.py)."""
    return why_no_toolchain()


def private_forward(module: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """``module.forward`` bound to a copy of its code object. Dynamo keeps compiled code on the
    code object, so code compiled through the copy is this module's alone: another twin of the
    same class (a draft's and its target's are both GPTs) never runs it, and a call looks up
    only this twin's graphs (sharing one code object, the target's twin took 237 us a call to
    find its graph among the draft's, on a 2-core AMD EPYC)."""
    function = type(module).forward
    code = function.__code__.replace()  # equal to the original, but an object of its own
    own = types.FunctionType(
        code, function.__globals__, function.__name__, function.__defaults__, function.__closure__
    )
    own.__kwdefaults__ = function.__kwdefaults__
    return types.MethodType(own, module)


class CompiledTwin:
    """``twin`` (a model computing what the original computes, with kernels dynamo can trace:
    plain ``F.linear``, or a small model's inlined products and attention) compiled on a thread
    of its own, on a code object of its own (:func:`private_forward`). ``done`` is set when the
    thread has ended; ``error`` then says why nothing was compiled.

    It is warmed up with each row count up to ``rows`` at each of ``positions``, on caches from
    ``new_cache``, with ids made as the decode loop makes them, and the logits of the last row
    (a draft's passes) or, with ``every_row``, of every row of a pass over several (a target's
    verifying passes). Code is compiled for what the warm-up meets, so ``positions`` must reach
    every branch a step can take: the family names them (nanochat's sliding windows attend
    differently once the context passes them)."""

    def __init__(
        self,
        twin: torch.nn.Module,
        new_cache: Callable[[int], Any],
        positions: Sequence[int],
        backend: str = "inductor",
        rows: int = COMPILED_ROWS,
        every_row: bool = False,
    ) -> None:
        self.twin = twin
        self.new_cache = new_cache
        self.positions = tuple(positions)
        self.backend = backend
        self.rows = rows
        self.every_row = every_row
        self.done = threading.Event()
        self.error: str | None = None
        self._stop = threading.Event()
        # The forward that is compiled, on a code object of its own (private_forward).
        self.forward = private_forward(twin)
        self._run: Callable[..., torch.Tensor] | None = None
        # Not a daemon: a daemon thread still compiling when the interpreter exits aborts the
        # process ("terminate called without an active exception"). stop() ends it promptly, and
        # unloading a model (as quitting does) stops its compiles.
        name = "verifier-compile" if every_row else "draft-compile"
        self._thread = threading.Thread(target=self._work, name=name, daemon=False)
        self._call_stop = CallStop()  # ends the compile at its next Python call (stop())
        self.holders = 1  # who use it (shared_twin hands it to more); the last stop() ends it
        self.key: str | None = None  # what it compiles, when shared (shared_twin)

    def start(self) -> CompiledTwin:
        self._thread.start()
        return self

    def stop(self) -> bool:
        """A holder lets it go. Once none is left (one, unless :func:`shared_twin` handed it to
        more), the compile ends: at its next Python call (after a C++ compile it waits on), or
        before it starts; a compile already ended keeps its code for whoever took it. Whether
        this ended a compile under way."""
        with _SHARED_LOCK:
            self.holders -= 1
            if self.holders > 0:
                return False
            if self.key is not None and _SHARED.get(self.key) is self:
                del _SHARED[self.key]
        self._stop.set()
        self._call_stop.request()
        return not self.done.is_set()

    @property
    def waiting(self) -> threading.Event:
        """Set while the compile waits for the foreground (a reply streaming, the user typing)."""
        return self._call_stop.waiting

    @property
    def compiled(self) -> Callable[..., torch.Tensor] | None:
        """The twin's forward in run-only mode, once the thread has ended with it compiled."""
        return self._run if self.done.is_set() else None

    def _work(self) -> None:
        # The lowest priority for this thread and what it starts (the C++ compiler, OpenMP's
        # workers): the user's replies first. Its intra-op threads stay the process's: dynamo
        # guards compiled code on that count, so code compiled under one thread would run
        # eagerly on the worker's (a timed pass ran no compiled region).
        lower_this_threads_priority()
        try:
            with _ONE_AT_A_TIME:
                switch = sys.getswitchinterval()
                try:
                    if not self._stop.is_set():
                        sys.setswitchinterval(SWITCH_WHILE_COMPILING_S)
                        with self._call_stop:
                            self._compile()
                finally:
                    sys.setswitchinterval(switch)
        except CompileStopped:
            logger.info("the compile of %s was stopped", self._what)
        except Exception as exc:  # anything the compiler raises leaves the model eager
            self.error = error_text(exc, named=True)
            logger.warning("%s was not compiled: %s", self._what, self.error)
        finally:
            # Stopped mid-compile, between two warm-up passes, or before its turn came (another
            # compile held the lock): nothing was compiled, and that is why.
            if self._stop.is_set() and self._run is None:
                self.error = "stopped"
            self.done.set()

    def switched(self, eager: DecodingModel) -> Switched | None:
        """``eager`` with its short passes on the compiled code, once the compile has ended with it."""
        compiled = self.compiled
        return None if compiled is None else Switched(eager, compiled, self.rows)

    @property
    def _what(self) -> str:
        return "the target's verifying passes" if self.every_row else "the draft's forward"

    @torch.inference_mode()
    def _compile(self) -> None:
        import torch._dynamo
        import torch._inductor.config

        logger.info("compiling %s (%s)", self._what, self.backend)
        # Compile in this thread (one worker): a pool of compile processes would outlive the
        # compile, and would take cores from the user's replies at their own priority.
        torch._inductor.config.compile_threads = 1
        # The forward itself, not the module's __call__: dynamo keeps compiled code on the code
        # object it compiled, and run-only mode looks it up there. One graph (fullgraph: a graph
        # break fails the compile, and the model stays eager), so all of it is on that code
        # object, which is this twin's alone. So the guards on the twin's modules (its weights,
        # its config, hundreds of checks a call) are dropped: nothing changes them after the
        # compile. What a call passes (ids, the cache and its position) is still guarded. A
        # draft's step looked up its graph in 136 us with them, 35 us without. For the same
        # reason inductor's code does not assert its inputs' sizes and strides at each call
        # (~35 asserts a call; the demo-d2 step 0.31 -> 0.245 ms).
        forward = self.forward
        options: dict[str, Any] = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
        if self.backend == "inductor":
            options["size_asserts"] = False
        compiled = torch.compile(forward, backend=self.backend, dynamic=True, fullgraph=True, options=options)
        # Each position and row count may be its own graph (a size of 1 is specialised).
        torch._dynamo.config.recompile_limit = max(
            torch._dynamo.config.recompile_limit, 2 * self.rows * len(self.positions)
        )
        device = next(self.twin.parameters()).device
        for start in self.positions:
            # One prefill per position, rolled back after each pass (as a rejection rolls back).
            cache = self.new_cache(start + self.rows + ROOM)
            self.twin(torch.zeros(1, start, dtype=torch.long, device=device), cache, last_only=True)
            for rows in range(1, self.rows + 1):
                if self._stop.is_set():
                    return
                # A new tensor, as the decode loop passes: a view would be guarded on its offset,
                # and an inference tensor, as its ids are (dynamo guards on the dispatch keys).
                ids = torch.zeros(1, rows, dtype=torch.long, device=device)
                compiled(ids, cache, last_only=rows == 1 or not self.every_row)
                cache.truncate(start)
        self._run = torch._dynamo.run(forward)
        logger.info("%s: compiled (%s)", self._what, self.backend)


def shared_twin(key: str, make: Callable[[], CompiledTwin]) -> CompiledTwin:
    """The compile of ``key`` (what it compiles: a model, its settings) under way or ended in this
    process, held once more (each holder calls :meth:`CompiledTwin.stop` once); else ``make()``'s,
    started. So a model is never compiled twice at once, nor again while a holder keeps it:
    twins of one checkpoint compute the same function, whichever one's tensors the code reads."""
    with _SHARED_LOCK:
        twin = _SHARED.get(key)
        if twin is not None:
            twin.holders += 1
            logger.info("%s: compiled once for %s", twin._what, key)
            return twin
        twin = make()
        twin.key = key
        _SHARED[key] = twin
    return twin.start()


class HoldsTwin(Protocol):
    """What holds a compile under way until it is settled: a draft, or the target's verifier."""

    twin: CompiledTwin | None


def take_compiled(holder: HoldsTwin, eager: DecodingModel) -> Switched | None:
    """``eager`` switched to ``holder``'s compiled code once its compile has ended (the holder
    then lets the compile go, whether it compiled or not); None while it compiles, or if nothing
    was compiled."""
    twin = holder.twin
    if twin is None or not twin.done.is_set():
        return None
    holder.twin = None
    twin.stop()  # this holder lets it go; its code, if any, is taken now
    return twin.switched(eager)


class Switched:
    """A model whose passes of up to ``rows`` rows run a twin's compiled code and the others
    ``eager``. Both compute the same function of the same weights and fill caches of one layout."""

    def __init__(
        self, eager: DecodingModel, compiled: Callable[..., torch.Tensor], rows: int = COMPILED_ROWS
    ) -> None:
        self.eager = eager
        self.compiled = compiled
        self.rows = rows

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
        if cache is not None and ids.shape[1] <= self.rows:
            # A one-row pass's last row is all of it: the code was compiled (and guarded) for
            # last_only=True there, so a plain reply's step (which passes False) must say True
            # too, or every step silently runs the eager forward.
            return self.compiled(ids, cache, last_only=last_only or ids.shape[1] == 1)
        return self.eager(ids, cache, last_only=last_only, cancel=cancel)
