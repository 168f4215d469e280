"""Each matrix product's kernel, chosen by timing the candidates on this machine.

The fastest way to multiply a weight by one row depends on the CPU (its vector units, caches and
BLAS), the matrix's shape and the thread count: fp32 ``F.linear`` streams at 13-16 GB/s on one
AMD EPYC and 27 GB/s on an Intel Sapphire Rapids, where splitting its rows across threads then
gains nothing; fbgemm's int8 beats torch's weight-only int8 on one and not the other. A table
written from one machine is what failed, so at the first load of a shape, dtype and thread count
the candidates of the mode are timed here and the fastest that keeps the mode's contract is used:

* exact: bit-identical to ``F.linear`` (each route is checked bit for bit by ``gemv.ExactLinear``
  before it is used; timing only orders them);
* fast (``fp16``): relative error of the product at most :data:`TOLERANCE` ``["fp16"]``, which
  keeps the next-token KL near 1e-7 (bf16 compute, ~3e-3 per product, gives ~1e-4 and is refused);
* int8: at most :data:`TOLERANCE` ``["int8"]`` (int8 per channel is ~1e-2; 4-bit groups, ~8e-2,
  are timed and refused).

The error bound is checked on the real weight at every load (it depends on the values); the
timings depend on the machine only and are cached in a JSON file keyed by the CPU, torch's
version and the thread count, so later loads time nothing.

A choice, once made, is kept: in the lossy modes (and in the few-row routes of a speculative
verifying pass, exact mode included) another kernel computes other numbers, and the app promises
that the same seed, prompt and settings give the same reply in the next session too (Compare
and the history rely on it). So:

* timings taken while other programs kept the CPU busy are saved like any others (a busy-time
  choice keeps the mode's contract; it may not be the fastest), and an entry once timed is never
  timed again, not even for a candidate added since, until the user asks (:meth:`KernelTuner.forget`,
  :func:`remeasure`: Settings › "Re-measure kernels", ``nanoscope bench --retime``);
* timing has a budget per process (:data:`TUNING_BUDGET_S`): on a busy machine the first answer
  once waited over a minute for it. Past the budget, a product not yet timed takes its safe
  default (``F.linear``'s own route in exact mode, exact fp32 in the lossy modes), which keeps
  every contract, and that default is saved as its choice (:data:`UNTIMED`), so the next start
  makes the same one rather than timing it and choosing otherwise;
* other timing-driven choices that change the numbers (speculative decoding's draft costs and
  its compiled twins) are kept beside the timings, under the same keys, by :meth:`KernelTuner.remember`.

Where a choice must be made again (another CPU or torch version: the key differs; another
thread count; the user re-measured), the entry is timed anew and flagged as :attr:`Choice.renewed`
(:meth:`KernelTuner.renewed`): the backends report it as ``ModelInfo.choices_renewed`` and
``GenerationStats.choices_renewed``, so the first reply can say that replies of this mode may
differ from older ones.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from desktop.engine.files.bounded import FileRefused, read_json
from desktop.engine.kernels import gemv
from desktop.engine.kernels.gemv import ExactLinear, Kernel, Route
from desktop.engine.kernels.machine import machine_id
from desktop.engine.kernels.native import native_ops
from desktop.engine.kernels.stopwatch import (
    FLUSH_BYTES,
    FLUSH_FROM,
    Candidate,
    OtherLoad,
    best_us,
    bind,
    stream_times,
)

logger = logging.getLogger(__name__)

CACHE_VERSION = 1
MAX_CACHE_BYTES = 1 << 20  # a few hundred shapes; a bigger file is not ours, and is started afresh
# Relative RMS error of one product against fp32 that each lossy mode accepts (see the docstring).
TOLERANCE = {"fp16": 1e-3, "int8": 2e-2}
# A matrix bigger than this (fp32) is timed on a slice of its rows (at least MIN_PACKED_ROWS).
TIMING_BYTES = 32 << 20
MIN_PACKED_ROWS = 256
ERROR_ROWS = 4  # random rows the error of a lossy candidate is measured with
# Timings taken while other processes used more than this share of all cores are logged as such
# (and saved all the same: a choice once used is kept, see the docstring).
BUSY_SHARE = 0.25
# The entry of a product that took its safe default past the budget: that is its choice, kept.
UNTIMED = "untimed"
# Seconds of timing one process spends at most (all shapes, all modes): an idle 2-core machine
# times the demo in about 2 s, a d20 model's every shape in exact and fast mode in about 10 s.
TUNING_BUDGET_S = 20.0
# Told (seconds spent timing so far, the budget) before each timing: what a load shows meanwhile.
TuningListener = Callable[[float, float], None]


def _candidates(kind: str, native_folder: Path | None) -> list[Candidate]:
    """What may compute a product in ``kind`` mode on this build of torch, fastest unknown.
    ``native_folder``: where this machine's own kernels are built (:mod:`.native`)."""
    fbgemm = gemv.fbgemm_available()
    ops = native_ops(native_folder)
    if kind == "fp16":
        found = [Candidate("fbgemm fp16", gemv.PackedFp16Linear)] if fbgemm else []
        if ops is not None:
            found.append(Candidate("native fp16", lambda w: gemv.NativeHalfLinear(w, ops)))
        return [
            *found,
            Candidate("fp16 F.linear", lambda w: gemv.HalfLinear(w, torch.float16)),
            Candidate("bf16 F.linear", lambda w: gemv.HalfLinear(w, torch.bfloat16)),
        ]
    if kind == "int8":
        found = [Candidate("fbgemm int8", gemv.Int8Linear)] if fbgemm else []
        if ops is not None:
            found.append(Candidate("native int8", lambda w: gemv.NativeInt8Linear(w, ops)))
        return [
            *found,
            Candidate("int8 weight-only", gemv.Int8WeightOnlyLinear),
            Candidate("int4 weight-only", gemv.Int4WeightOnlyLinear),
        ]
    raise ValueError(f"no candidates for {kind!r}")


def relative_error(kernel: Callable[[torch.Tensor], torch.Tensor], weight: torch.Tensor) -> float:
    """RMS error of ``kernel``'s product over fp32 ``F.linear``'s, relative to the product's RMS,
    for :data:`ERROR_ROWS` random rows."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, ERROR_ROWS, weight.shape[1], generator=generator).to(weight.dtype)
    with torch.inference_mode():
        reference = F.linear(x, weight).double()
        got = torch.cat([kernel(x[:, i : i + 1]) for i in range(ERROR_ROWS)], 1).double()
    scale = reference.norm().item() or 1.0
    return (got - reference).norm().item() / scale


@dataclass
class Choice:
    """What was chosen for one matrix shape, for ``nanoscope bench`` and the status bar."""

    shape: tuple[int, int]
    mode: str
    chosen: str
    timings_us: dict[str, float] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # candidate -> why it was not used
    # Chosen anew in this process where an earlier choice existed (another CPU, torch version or
    # thread count; a re-measure): its numbers may differ from older replies'.
    renewed: bool = False

    def line(self) -> str:
        n, k = self.shape
        by_speed = sorted(
            ((name, us) for name, us in self.timings_us.items() if name != UNTIMED), key=lambda item: item[1]
        )
        others = ", ".join(f"{name} {us:.0f}" for name, us in by_speed)
        refused = "; ".join(f"{name}: {why}" for name, why in self.refused.items())
        text = f"{n}×{k} {self.mode}: {self.chosen}"
        if others:
            text += f" (µs: {others})"
        return text + (f"; refused {refused}" if refused else "")


class KernelTuner:
    """Times candidate kernels once per machine, shape and thread count, and keeps the verdicts
    (in memory, and in ``cache_file`` when given) until :meth:`forget`. Safe to share between
    worker threads."""

    def __init__(self, cache_file: Path | None = None, budget_s: float = TUNING_BUDGET_S) -> None:
        self.cache_file = cache_file
        # This machine's own kernels are built beside the timings (kernels.native).
        self.native_folder = cache_file.parent / "native" if cache_file is not None else None
        self.budget_s = budget_s
        self.spent_s = 0.0  # seconds spent timing so far
        self.skipped = 0  # products that took their safe default: the budget was spent
        self._lock = threading.RLock()
        # Entries chosen before under another key (machine, torch, thread count) or forgotten by a
        # re-measure: choosing one of them now is a renewal (Choice.renewed).
        self._earlier: set[str] = set()
        self._forgotten: set[str] = set()  # this machine's entries a re-measure dropped, kept in the file
        self._timings: dict[str, dict[str, dict[str, float]]] = self._read()  # threads -> entry -> µs
        self.measured = 0  # candidates timed by this tuner (the cache's effect is visible here)
        self._renewed: set[tuple[str, str]] = set()  # (threads, entry) chosen anew over an earlier choice
        self._choices: weakref.WeakKeyDictionary[object, Choice] = weakref.WeakKeyDictionary()
        self._listeners = threading.local()  # per thread: Compare's panes load side by side

    @contextlib.contextmanager
    def listening(self, listener: TuningListener) -> Iterator[None]:
        """Tell ``listener`` (seconds spent, the budget) before each timing this thread runs, so
        a first load on a new machine can say what it waits for."""
        self._listeners.current = listener
        try:
            yield
        finally:
            self._listeners.current = None

    # ----- the cache ----------------------------------------------------------------------------

    def _read(self) -> dict[str, dict[str, dict[str, float]]]:
        if self.cache_file is None or not self.cache_file.exists():
            return {}
        try:
            data = read_json(self.cache_file, "state", max_depth=8, limit=MAX_CACHE_BYTES)
            if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
                return {}
            machines = data.get("machines", {})
            mine = _entries(machines.get(machine_id(), {}))
            # What was chosen under any key: met again under this one, it is chosen anew (an entry
            # this key holds is never chosen again).
            for theirs in machines.values():
                for entries in _entries(theirs).values():
                    self._earlier.update(entries)
            forgotten = data.get("forgotten")
            forgotten = forgotten.get(machine_id()) if isinstance(forgotten, dict) else None
            if isinstance(forgotten, list):
                self._forgotten = {entry for entry in forgotten if isinstance(entry, str)}
            self._earlier |= self._forgotten
            return mine
        except (FileRefused, AttributeError) as exc:
            logger.warning("kernel timings in %s not used (%s); timing again", self.cache_file, exc)
            return {}

    def _write(self) -> None:
        """Merge this machine's timings into the file (other machines' entries stay), atomically."""
        if self.cache_file is None:
            return
        try:
            data: dict = {"version": CACHE_VERSION, "machines": {}, "forgotten": {}}
            if self.cache_file.exists():
                try:
                    old = read_json(self.cache_file, "state", max_depth=8, limit=MAX_CACHE_BYTES)
                    if isinstance(old, dict) and old.get("version") == CACHE_VERSION:
                        for key in ("machines", "forgotten"):
                            if isinstance(old.get(key), dict):
                                data[key] = dict(old[key])
                except FileRefused:
                    pass  # replaced below
            data["machines"][machine_id()] = self._timings
            data["forgotten"][machine_id()] = sorted(self._forgotten)
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_file.parent, prefix=".kernels-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.cache_file)
        except OSError as exc:
            logger.warning("could not save kernel timings to %s: %s", self.cache_file, exc)

    def forget(self) -> None:
        """Re-measure: drop this machine's timings and kept choices, here and in the file, so
        every product a later load builds is timed (and chosen) again, and flagged as renewed.
        Models already loaded keep their kernels until they are loaded again."""
        with self._lock:
            for entries in self._timings.values():
                self._forgotten.update(entries)
            self._earlier |= self._forgotten
            self._timings.clear()
            self._renewed.clear()
            self.spent_s = 0.0  # an asked-for re-measure has a budget of its own
            self._write()
            logger.info("kernel choices forgotten: the next loads time them again")

    def timings(self, entry: str, threads: int) -> dict[str, float]:
        with self._lock:
            return dict(self._timings.get(str(threads), {}).get(entry, {}))

    def renewed(self, entry: str, threads: int) -> bool:
        """Whether ``entry`` was chosen anew in this process where an earlier choice existed
        (another CPU, torch version or thread count, or a re-measure)."""
        with self._lock:
            return (str(threads), entry) in self._renewed

    def _settle(self, entry: str, threads: int, values: dict[str, float]) -> None:
        """Keep ``values`` as ``entry``'s, in memory and in the file (the lock is held)."""
        self._timings.setdefault(str(threads), {})[entry] = values
        if entry in self._earlier:
            self._renewed.add((str(threads), entry))
            logger.info("%s at %d threads: chosen anew (earlier replies may differ)", entry, threads)
        self._forgotten.discard(entry)
        self._write()

    def _measure(
        self,
        entry: str,
        threads: int,
        names: Sequence[str],
        time_them: Callable[[list[str]], dict[str, float]],
        scale: float = 1.0,
    ) -> dict[str, float]:
        """µs per product of each of ``names`` by ``time_them`` (times ``scale``, for a product
        timed on a slice of the matrix), saved to the file; then ``entry``'s timings. An entry
        timed once is kept as it is, whatever candidates are asked for now (a candidate it lacks
        is not used): the choice it made is kept until :meth:`forget`. Past the budget the entry
        is kept as :data:`UNTIMED`: every caller then takes its safe default, now and later."""
        with self._lock:
            known = self.timings(entry, threads)
            if known:
                return known
            if self.spent_s >= self.budget_s:
                if not self.skipped:
                    logger.info(
                        "kernel timing passed its %.0f s budget: safe defaults, kept as the choices",
                        self.budget_s,
                    )
                self.skipped += 1
                self._settle(entry, threads, {UNTIMED: 1.0})
                return {UNTIMED: 1.0}
            listener = getattr(self._listeners, "current", None)
            if listener is not None:
                listener(self.spent_s, self.budget_s)
            others = OtherLoad()
            started = time.perf_counter()
            with torch.inference_mode():
                timed = time_them(list(names))
            self.spent_s += time.perf_counter() - started
            self.measured += len(timed)
            busy = others.share()
            if busy > BUSY_SHARE:
                # Kernels that need every core lose most on a busy machine, so this choice may
                # favour a single-threaded one; it is kept all the same (it keeps the mode's
                # contract, and replies must not change at the next start): Re-measure redoes it.
                logger.info(
                    "timed %s while other programs used %.0f%% of the CPU; kept until re-measured",
                    entry,
                    100 * busy,
                )
            values = {name: round(us * scale, 2) for name, us in timed.items()}
            self._settle(entry, threads, values)
            return dict(values)

    def remember(self, entry: str, measure: Callable[[], dict[str, float]]) -> tuple[dict[str, float], bool]:
        """``entry``'s values as kept for this machine and the calling thread's thread count, or
        ``measure()``'s, kept from now on (no budget: a decision is asked for once); and whether
        they were chosen anew over an earlier choice. For timing-driven decisions besides kernels
        that change the numbers a reply computes (speculative decoding's costs and compiled twins)."""
        threads = torch.get_num_threads()
        with self._lock:
            known = self.timings(entry, threads)
        if not known:
            with torch.inference_mode():  # outside the lock: Compare's other panes go on meanwhile
                values = {name: float(value) for name, value in measure().items() if _is_timing(value)}
            with self._lock:
                known = self.timings(entry, threads) or values  # another thread may have settled it
                if known is values:
                    self._settle(entry, threads, values)
        return dict(known), self.renewed(entry, threads)

    def recall(self, entry: str) -> dict[str, float]:
        """``entry``'s values as :meth:`remember` kept them at this thread count ({}: none yet)."""
        return self.timings(entry, torch.get_num_threads())

    def verdict(self, entry: str, threads: int, check: Callable[[], bool]) -> bool:
        """Whether ``check`` held for ``entry`` at ``threads`` threads on this machine. It is run
        once and kept with the timings: like a kernel's speed, whether two ways of computing give
        the same bits depends on the CPU, its BLAS and the thread count, not on the inputs."""
        with self._lock:
            known = self._timings.get(str(threads), {}).get(entry, {})
        if "same" in known:
            return known["same"] == 1.0  # as written below; anything else in a damaged file: not the same
        with torch.inference_mode():  # outside the lock: Compare's other panes go on meanwhile
            same = check()
        with self._lock:
            self._settle(entry, threads, {"same": float(same)})
            logger.info("%s at %d threads: %s", entry, threads, "same bits" if same else "other bits")
            return same

    # ----- exact mode: order the routes that ExactLinear checks bit for bit ---------------------

    def rank_routes(
        self, product: ExactLinear, threads: int, routes: dict[str, Route], rows: int = 1
    ) -> list[str]:
        """``routes``' names, fastest first, timed at ``threads`` threads (the caller's count) on
        ``rows`` input rows."""
        x = torch.randn(1, rows, product.in_features, dtype=product.weight.dtype)
        calls = {name: bind(route, x) for name, route in routes.items()}

        def time_them(missing: list[str]) -> dict[str, float]:
            big = product.weight_nbytes >= FLUSH_FROM
            flush = torch.empty(FLUSH_BYTES // 4).normal_() if big else None
            return best_us({name: calls[name] for name in missing}, flush)

        entry = _exact_entry(product) + (f" {rows} rows" if rows > 1 else "")
        timed = self._measure(entry, threads, list(routes), time_them)
        if UNTIMED in timed:  # past the budget: the safe route first (and at every later start)
            safe = "by parts" if "by parts" in routes else "F.linear"
            return [safe, *(name for name in routes if name != safe)]
        # A route the kept entry lacks comes last: the choice once made stays.
        return sorted(routes, key=lambda name: timed.get(name, float("inf")))

    # ----- building products ----------------------------------------------------------------------

    def exact(self, weight: torch.Tensor, parts: Sequence[int] = ()) -> ExactLinear:
        """Exact mode's product, its routes ordered by timing them on the CPU. A GPU runs
        kernels asynchronously (a host clock would time the launch), and has one route there."""
        product = ExactLinear(weight, parts)
        if weight.device.type == "cpu":
            for each in (product, *product._part_products):
                each.rank = self.rank_routes
        return product

    def product(self, weight: torch.Tensor, kind: str, parts: Sequence[int] = ()) -> Kernel:
        """The kernel computing ``x @ weight.T`` in ``kind`` mode (a bias-free weight). ``parts``:
        the row counts of matrices fused into ``weight``, which exact mode matches one by one."""
        if kind not in gemv.GEMV_KINDS:
            raise ValueError(f"unknown matrix-vector kind {kind!r}")
        if kind == "plain":
            return gemv.PlainLinear(weight)
        if kind == "inlined":
            return gemv.InlinedLinear(weight)
        if kind == "exact" or not gemv.packs(weight, kind):
            return self.exact(weight, parts)
        return self._lossy(weight, kind)

    def _lossy(self, weight: torch.Tensor, kind: str) -> Kernel:
        """The fastest candidate of ``kind`` whose error on this weight is within the bound; the
        fp32 routes (exact) when none is."""
        threads = torch.get_num_threads()
        n, k = weight.shape
        entry = f"{kind} {weight.dtype} {n}x{k}"
        refused: dict[str, str] = {}
        # fp32 is a candidate of every lossy mode: where fp32 products stream fast enough (small
        # matrices, a CPU without a fast 16- or 8-bit kernel), fewer bytes may not pay for the
        # conversion, and fp32 keeps every contract.
        found = _candidates(kind, self.native_folder)
        candidates = {c.name: c for c in (*found, Candidate("fp32 exact", self.exact))}
        with self._lock:
            timed = self._time_candidates(entry, threads, weight, list(candidates.values()), refused)
        renewed = self.renewed(entry, threads)
        bound = TOLERANCE[kind]
        for name in sorted((name for name in timed if name in candidates), key=timed.__getitem__):
            kernel = candidates[name].build(weight)
            error = relative_error(kernel, weight)
            if error <= bound:
                with self._lock:  # Compare's panes load on their own threads
                    self._choices[kernel] = Choice((n, k), kind, name, timed, refused, renewed)
                return kernel
            refused[name] = f"error {error:.1e} > {bound:.0e}"
        if UNTIMED not in timed:
            logger.info("%s %dx%d: no candidate within %.0e; exact fp32", kind, n, k, bound)
        kernel = self.exact(weight)
        with self._lock:  # what the status bar and the renewal flag read
            why = "untimed" if UNTIMED in timed else "none within the bound"
            self._choices[kernel] = Choice((n, k), kind, f"fp32 exact ({why})", {}, refused, renewed)
        return kernel

    def _time_candidates(
        self,
        entry: str,
        threads: int,
        weight: torch.Tensor,
        untimed: list[Candidate],
        refused: dict[str, str],
    ) -> dict[str, float]:
        """Time ``untimed`` on (the first rows of) ``weight``; a candidate this build of torch
        cannot run goes to ``refused``. A matrix above :data:`TIMING_BYTES` is timed on a slice of
        its rows: the same columns and memory access, bounded memory, the time scaled up."""
        n, k = weight.shape
        # A multiple of 64 rows: packed layouts want whole tiles of rows (torch's int4: 16).
        rows = min(n, max(MIN_PACKED_ROWS, TIMING_BYTES // (4 * k) // 64 * 64))
        part = weight[:rows]
        by_name = {candidate.name: candidate for candidate in untimed}

        def time_them(missing: list[str]) -> dict[str, float]:
            return stream_times([by_name[name] for name in missing], part, refused)

        return self._measure(entry, threads, list(by_name), time_them, scale=n / rows)

    def own_products(
        self, matrices: Sequence[torch.Tensor], kind: str, keep: Sequence[torch.Tensor] = ()
    ) -> dict[int, Kernel]:
        """``kind``'s product of each of ``matrices`` (a model's own, in fast or int8 mode), by
        ``id`` of the matrix; the fp32 matrix is freed where its kernel holds a form of its own,
        one after another (memory holds one extra matrix at a time). The tensor objects stay (an
        empty storage), as the keys a model looks its products up by; ``keep`` (an embedding
        table the head shares) keeps its values."""
        kept = {id(t) for t in keep}
        found: dict[int, Kernel] = {}
        for weight in matrices:
            kernel = found[id(weight)] = self.product(weight, kind)
            if id(weight) not in kept and getattr(kernel, "weight", None) is not weight:
                # The values now live in the kernel's own form.
                weight.set_(torch.empty(0, dtype=weight.dtype, device=weight.device).untyped_storage())
        return found

    def install(self, module: torch.nn.Linear, kind: str) -> None:
        """Route a bias-free Linear through ``kind``'s kernel.

        A kind that stores the weight in another form takes it over: the module's own ``weight``
        becomes None, so the fp32 matrix is freed as soon as it is converted (the next one is
        converted after, so memory holds one extra matrix at a time).
        """
        weight = module.weight
        # An instance attribute shadows Linear.forward (mypy: a kernel is the same kind of callable).
        module.forward = self.product(weight, kind)  # type: ignore[method-assign, assignment]
        if gemv.packs(weight, kind):
            module.register_parameter("weight", None)

    def describe(self, kernels: Sequence[Kernel]) -> list[Choice]:
        """One :class:`Choice` per distinct shape and choice among ``kernels`` (a model's
        products), in order."""
        threads = torch.get_num_threads()
        seen: dict[tuple, Choice] = {}
        for kernel in kernels:
            with self._lock:
                choice = self._choices.get(kernel)
            if choice is None and isinstance(kernel, ExactLinear):
                timings = self.timings(_exact_entry(kernel), threads)
                if timings:  # an untimed product (a gate of a dozen weights) has one route
                    choice = Choice(tuple(kernel.weight.shape), "exact", kernel.chosen, timings)  # type: ignore[arg-type]
            if choice is not None:
                seen.setdefault((choice.shape, choice.mode, choice.chosen), choice)
        return list(seen.values())


def _entries(machine: object) -> dict[str, dict[str, dict[str, float]]]:
    """One machine's entries from the file (thread count -> entry -> values), what is well formed."""
    if not isinstance(machine, dict):
        return {}
    return {
        threads: {
            entry: {name: float(us) for name, us in timings.items() if _is_timing(us)}
            for entry, timings in entries.items()
            if isinstance(timings, dict)
        }
        for threads, entries in machine.items()
        if isinstance(entries, dict)
    }


def _is_timing(value: object) -> bool:
    """A time in µs as this cache writes it. Compared before ``float()``: a 400-digit integer in
    a damaged file would overflow it."""
    return type(value) in (int, float) and 0 <= value < 1e12  # type: ignore[operator]


def shown_precision(name: str, choices: Sequence[Choice]) -> str:
    """``name``, unless a 16- or 8-bit mode found fp32 fastest for every matrix (a tiny model):
    then the model runs in fp32, and the status bar should say so."""
    lossy = [choice for choice in choices if choice.mode != "exact"]
    if lossy and all(choice.chosen == "fp32 exact" for choice in lossy):
        return "float32 (fastest here)"
    return name


def _exact_entry(product: ExactLinear) -> str:
    w = product.weight
    parts = f" parts {','.join(map(str, product.part_rows))}" if product.part_rows else ""
    return f"exact {w.dtype} {w.shape[0]}x{w.shape[1]}{parts}"


_shared: dict[Path | None, KernelTuner] = {}
_shared_lock = threading.Lock()


def tuner_for(cache_file: Path | None) -> KernelTuner:
    """One tuner per cache file for the whole process, so Compare's panes share their timings."""
    with _shared_lock:
        if cache_file not in _shared:
            _shared[cache_file] = KernelTuner(cache_file)
        return _shared[cache_file]


def remeasure(cache_file: Path | None) -> None:
    """Settings › "Re-measure kernels" (and ``nanoscope bench --retime``): forget this machine's
    kernel choices and kept speculative decisions in ``cache_file``, for this process's tuner and
    the next start's. The models loaded next time every product again; their first replies are
    flagged (``ModelInfo.choices_renewed``) as possibly differing from older ones."""
    tuner_for(cache_file).forget()


def tuning_progress(report: Callable[[int, str], None], start: int, end: int) -> TuningListener:
    """A listener that shows timing as a load's progress, from ``start`` to ``end`` percent as
    the budget is spent: the first load on a new machine says what it waits for, and for how
    long at most (later loads read the timings from the cache and never call it)."""

    def said(spent: float, budget: float) -> None:
        share = min(spent / budget, 1.0) if budget > 0 else 1.0
        left = max(budget - spent, 0.0)
        report(
            start + int((end - start) * share),
            f"Tuning for this CPU… once per machine, at most {left:.0f} s more",
        )

    return said
