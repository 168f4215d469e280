"""A draft's forward compiled in the background (engine/decode/compiled_draft.py): the compiled
code computes the draft's own logits and fills the same cache, the caller's thread never
compiles, Stop and a dropped draft end the compile, and a machine without a compiler keeps the
eager draft.

Most cases compile with dynamo's "eager" backend: the graphs dynamo traces from the real forward
of each era, run op by op, so every logit must equal the eager model's. One case compiles the
demo's 2-layer draft with inductor, as the app does, where this machine has a C++ compiler.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from support.golden import GOLDEN, manifest
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

from desktop.config.paths import DEMO_DIR, resource_path
from desktop.engine.backend import GenerationStats, LoadOptions, StreamOptions
from desktop.engine.decode import compiled_draft
from desktop.engine.decode.attention import inlined_attention
from desktop.engine.decode.compiled_draft import COMPILED_ROWS, CompiledTwin, Switched, why_not_compiled
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.pass_timing import TIMED_ROWS, TIMINGS, timed_ms
from desktop.engine.kernels.gemv import few_rows
from desktop.engine.messages import Message
from desktop.engine.nanochat import drafts
from desktop.engine.nanochat.drafts import VERIFIED_ROWS, compile_twin, warm_positions
from desktop.engine.nanochat.loader import LoadedModel, load_model
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

ROOT = Path(__file__).resolve().parents[3]
DEMO = resource_path(DEMO_DIR)
DEMO_D2 = DEMO.parent / "demo-d2"
CASES = [
    GOLDEN / "nanochat" / "E0",
    GOLDEN / "nanochat" / "E4",
    GOLDEN / "nanochat" / "E7",
    GOLDEN / "fork" / "engram-mhc-mtp-swiglu",
]
# Long enough to wait out a first compile on two busy cores (two to three minutes cold).
COMPILE_WAIT_S = 600


def base_model(case: Path) -> LoadedModel:
    m = manifest(case)
    return load_model(case / "base_checkpoints" / m["tag"], m["base_step"], "cpu", "float32")


def cache_maker(loaded: LoadedModel):
    cfg = loaded.config
    return lambda capacity: KVCache(cfg, 1, capacity, loaded.device, torch.float32)


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def served(twin: CompiledTwin, ids: torch.Tensor, cache: KVCache, last_only: bool = True) -> bool:
    """Whether code compiled for ``twin``'s forward accepts this call (its guards pass), i.e. the
    call runs compiled code rather than falling back to the eager forward."""
    call = {
        "self": twin.twin,
        "idx": ids,
        "cache": cache,
        "last_only": last_only,
        "chunk": None,
        "cancel": None,
    }
    return any(e.guard_manager.check(call) for e in _debug_get_cache_entry_list(twin.forward.__code__))


@contextmanager
def said(log: logging.Logger, text: str) -> Iterator[threading.Event]:
    """An event set once ``log`` says a line starting with ``text``, from whichever thread."""
    event = threading.Event()

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith(text):
                event.set()

    handler, level = Said(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield event
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def reply(backend, prompt, params: SamplingParams, draft: str, k: int) -> tuple[list[int], GenerationStats]:
    """A reply's ids and stats, ``draft`` drafting ``k`` tokens a round ("": none)."""
    stats = GenerationStats()
    events = backend.stream(prompt, params, threading.Event(), StreamOptions(draft=draft, draft_k=k), stats)
    return [e.id for e in events if e.id >= 0], stats


@torch.inference_mode()
def walk(
    model,
    cache: KVCache,
    plan: list[int],
    start: int,
    twin: CompiledTwin | None = None,
    every_row: bool = False,
) -> list[torch.Tensor]:
    """Feed ``model`` passes of the given row counts on a cache made as a reply makes it, with new
    id tensors: as a draft's reply does (the last row's logits), or with ``every_row`` as a
    speculative reply feeds its target (every row's logits of a pass over several, within
    few_rows). With ``twin``, each pass of up to the rows it was compiled for must run compiled
    code."""
    compiled_rows = VERIFIED_ROWS if every_row else COMPILED_ROWS
    out, token = [], start
    for rows in plan:
        ids = torch.tensor([[(token + i) % 200 + 3 for i in range(rows)]], dtype=torch.long)
        last_only = rows == 1 or not every_row
        if twin is not None and rows <= compiled_rows:
            assert served(twin, ids, cache, last_only), f"{rows} rows at position {cache.pos} ran eagerly"
        with few_rows() if every_row else contextlib.nullcontext():
            out.append(model(ids, cache, last_only=last_only))
        token += rows
    return out


@pytest.mark.parametrize("inlined", [True, False], ids=["inlined", "plain"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_the_compiled_twin_gives_the_drafts_logits_and_the_caller_never_compiles(case, inlined, monkeypatch):
    """Every pass of up to the rows compiled runs compiled code, before and past each sliding
    window, and gives the draft's logits. With plain kernels (a larger model's twin) those are
    the eager model's bit for bit; the inlined products and attention of a small model's twin
    (these golden models are small) sum in another order: to float rounding."""
    if not inlined:
        monkeypatch.setattr(drafts, "INLINED_BYTES", 0)
    loaded = base_model(case)
    twin = compile_twin(loaded, backend="eager")
    assert (twin.twin.blocks[0].attn.attend is inlined_attention) == inlined
    assert twin.done.wait(COMPILE_WAIT_S) and twin.error is None, twin.error
    compiled = twin.compiled
    assert compiled is not None
    switched = Switched(loaded.model, compiled)
    new_cache = cache_maker(loaded)
    # A prompt, then steps and catch-ups past every sliding window, a pass of every compiled row
    # count, and a block the calculator might force (longer: eager).
    head = [12, *[1] * 4, 2, 3, COMPILED_ROWS, 7, 1]
    past = max(max(warm_positions(loaded.config)) + 2 - sum(head), COMPILED_ROWS + 1)
    plan = [*head, past, *[1] * 3, 2, *range(1, COMPILED_ROWS + 1)]
    before = graphs()
    eager_cache, switched_cache = new_cache(512), new_cache(512)  # made outside inference mode
    want = walk(loaded.model, eager_cache, plan, 5)
    got = walk(switched, switched_cache, plan, 5, twin)
    assert graphs() == before  # run-only: the caller's thread compiled nothing
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if inlined:
            torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4, msg=f"pass {i} ({plan[i]} rows)")
        else:
            assert torch.equal(a, b), f"pass {i} ({plan[i]} rows)"
    assert switched_cache.pos == eager_cache.pos == sum(plan)
    if not inlined:
        assert switched_cache.same_as(eager_cache)
    else:  # the same tokens held, their keys and values to float rounding
        held = sum(plan)
        assert torch.equal(switched_cache.tokens[:, :held], eager_cache.tokens[:, :held])
        for mine, theirs in ((switched_cache.k, eager_cache.k), (switched_cache.v, eager_cache.v)):
            torch.testing.assert_close(mine[:, :, :held], theirs[:, :, :held], atol=2e-4, rtol=1e-4)


@pytest.mark.slow  # two dynamo compiles of the demo pair: about a minute on two quiet cores
def test_twins_of_one_class_each_run_their_own_compiled_code():
    """A draft's twin and its target's are GPTs of one width (the demo's 2 and 4 layers), and
    their guards on modules are dropped, so neither may run the other's graphs: each twin's code
    is compiled on a code object of its own (a second compile adds nothing to the first twin's
    graphs), and each gives its own model's logits."""
    models = [load_model(path, None, "cpu", "float32") for path in (DEMO_D2, DEMO)]
    twins, graphs_of = [], []
    for loaded in models:
        twin = compile_twin(loaded, backend="eager")
        assert twin.done.wait(COMPILE_WAIT_S) and twin.error is None, twin.error
        twins.append(twin)
        graphs_of.append([len(_debug_get_cache_entry_list(t.forward.__code__)) for t in twins])
    assert graphs_of[1][0] == graphs_of[0][0] > 0 and graphs_of[1][1] > 0
    plan = [12, 1, 1, 2, 3, 1, COMPILED_ROWS]
    for loaded, twin in zip(models, twins, strict=True):
        switched = twin.switched(loaded.model)
        got = walk(switched, cache_maker(loaded)(64), plan, 5, twin)
        want = walk(loaded.model, cache_maker(loaded)(64), plan, 5)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4, msg=f"{loaded.directory.name}: pass {i}")


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_the_targets_compiled_twin_gives_every_row_of_a_verifying_pass(case):
    """The target's twin (engine/decode/verifier.py) is compiled for passes of up to
    VERIFIED_ROWS rows that return every row's logits, as a speculative round verifies: each such
    pass, before and past every sliding window, runs compiled code, and gives the target's own
    logits at every row to float rounding (the target's few-row products take other routes)."""
    loaded = base_model(case)
    twin = compile_twin(loaded, backend="eager", rows=VERIFIED_ROWS, every_row=True)
    assert twin.done.wait(COMPILE_WAIT_S) and twin.error is None, twin.error
    switched = twin.switched(loaded.model)
    assert switched is not None
    new_cache = cache_maker(loaded)
    head = [12, 1, *range(2, VERIFIED_ROWS + 1)]
    past = max(max(warm_positions(loaded.config, VERIFIED_ROWS)) + 2 - sum(head), VERIFIED_ROWS + 1)
    plan = [*head, past, 1, 3, VERIFIED_ROWS, VERIFIED_ROWS + 2, 2]  # the prompt and a long block: eager
    before = graphs()
    eager_cache, switched_cache = new_cache(512), new_cache(512)
    want = walk(loaded.model, eager_cache, plan, 5, every_row=True)
    got = walk(switched, switched_cache, plan, 5, twin, every_row=True)
    assert graphs() == before  # run-only: the caller's thread compiled nothing
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.shape == b.shape, f"pass {i} ({plan[i]} rows)"
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4, msg=f"pass {i} ({plan[i]} rows)")
    assert switched_cache.pos == eager_cache.pos == sum(plan)


STOPS = 100  # stops, each of a thread caught somewhere in a loop that takes and releases a lock


def test_a_stop_never_leaves_a_lock_held():
    """A compile is stopped wherever its thread is; the lock it was taking must not stay held.

    The loop takes a lock as Python 3.11's logging takes its module lock: a call that acquires it,
    then the ``try`` that releases it. An exception raised asynchronously landed between the two
    in 2 to 7 stops of 40 here, and the lock stayed held by the ended thread for good (the
    next compile, and every logging call, then waited on it: a CI run hung so). A stop raised at
    a function's entry lands before the acquire or inside the ``try``."""
    lock = threading.RLock()

    def take() -> None:
        lock.acquire()

    def hold() -> None:
        pass

    def debugger(frame, event, arg) -> None:  # a trace function the thread had before (unused)
        return None

    for _ in range(STOPS):
        looping = threading.Event()
        stopped: list[bool] = []
        call_stop = compiled_draft.CallStop()

        def work(call_stop=call_stop, looping=looping, stopped=stopped) -> None:
            sys.settrace(debugger)
            try:
                with call_stop:
                    while True:
                        take()
                        try:
                            hold()
                        finally:
                            lock.release()
                        looping.set()
            except compiled_draft.CompileStopped:
                stopped.append(sys.gettrace() is debugger)  # given back
            finally:
                sys.settrace(None)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        assert looping.wait(COMPILE_WAIT_S)
        call_stop.request()
        thread.join(COMPILE_WAIT_S)
        assert not thread.is_alive() and stopped == [True]
        assert lock.acquire(timeout=COMPILE_WAIT_S), "the stopped thread left the lock held"
        lock.release()
    assert sys.gettrace() is None  # the stops traced their own threads only


@pytest.mark.skipif(why_not_compiled() is not None, reason=str(why_not_compiled()))
def test_a_process_that_ends_mid_compile_exits_at_once_and_cleanly():
    """Quitting closes the model (the app's shutdown unloads every worker's backend); a compile
    under way must end with it, and the interpreter's exit must not abort on the compile's thread.
    The model runs on a daemon thread, as in the app (Python counts a QThread as one), whose
    threads were daemons too: one still compiling at exit aborted the process ("terminate called
    without an active exception")."""
    script = f"""
import logging, os, sys, threading
from desktop.engine.backend import LoadOptions, StreamOptions, GenerationStats
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend
compiling = threading.Event()
class Said(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("compiling"):
            compiling.set()
log = logging.getLogger("desktop.engine.decode.compiled_draft")
log.setLevel(logging.INFO)
log.addHandler(Said())
def worker():
    backend = open_backend({str(DEMO)!r}, LoadOptions(compile_drafts=True))
    prompt = backend.render([Message.of_text("user", "Hi")], 8)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    options = StreamOptions(draft={str(DEMO_D2)!r}, draft_k=3)
    list(backend.stream(prompt, params, threading.Event(), options, GenerationStats()))
    compile = backend.draft({str(DEMO_D2)!r}).twin
    assert compiling.wait({COMPILE_WAIT_S})
    backend.close()
    compile._thread.join()
    assert compile.error == "stopped", compile.error
    print("closed mid-compile", flush=True)
thread = threading.Thread(target=worker, daemon=True)
thread.start()
thread.join()
# The stop left nothing behind: a traced call (a debugger's, a coverage tool's) returns.
def called():
    return None
def trace_a_call():
    sys.settrace(lambda *_: None)
    called()
    sys.settrace(None)
traced = threading.Thread(target=trace_a_call, daemon=True)
traced.start()
traced.join(60)
if traced.is_alive():
    print("traced call hung", flush=True)
    os._exit(3)
print("traced call returned", flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=COMPILE_WAIT_S, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "closed mid-compile" in done.stdout and "terminate called" not in done.stderr
    assert "traced call returned" in done.stdout


def test_without_a_compiler_the_draft_stays_eager(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert "no C++ compiler" in (why_not_compiled() or "")
    backend = open_backend(DEMO, LoadOptions(compile_drafts=True))
    prompt = backend.render([Message.of_text("user", "What is 12 times 7?")], 16)
    ids, stats = reply(backend, prompt, SamplingParams(temperature=0.0, max_tokens=16), str(DEMO_D2), k=3)
    assert ids and stats.drafted > 0 and not stats.draft_compiled
    assert backend.draft(str(DEMO_D2)).twin is None
    backend.close()


@pytest.mark.skipif(why_not_compiled() is not None, reason=str(why_not_compiled()))
# The stop interrupts the compile wherever it is, which may be an import reading a source file
# (networkx's, once): that file is closed when it is collected, with a ResourceWarning Python
# ignores by default, and the import runs again in the next compile.
@pytest.mark.slow  # an inductor compile, stopped, then a whole one: 1.5 minutes on two quiet cores
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_draft_dropped_mid_compile_then_picked_again_is_compiled_by_inductor_and_drafts():
    """What the app does: the demo's 2-layer run, compiled in the background with inductor, drafts
    for the 4-layer demo. Turning speculative off mid-compile stops the compile and the reply goes
    on plainly; picking the draft again compiles it anew in the same process. The replies are the
    demo's own greedy reply, and the footer's flag says which form drafted. Whether the compiled
    form is adopted is this machine's timing; its logits are the draft's to float rounding either
    way."""
    backend = open_backend(DEMO, LoadOptions(compile_drafts=True))
    prompt = backend.render([Message.of_text("user", "How many r are in strawberry?")], 48)
    params = SamplingParams(temperature=0.0, max_tokens=48)

    with said(logging.getLogger(compiled_draft.__name__), "compiling") as compiling:
        plain, _ = reply(backend, prompt, params, "", k=4)
        drafted, stats = reply(backend, prompt, params, str(DEMO_D2), k=4)
        assert drafted == plain and stats.drafted > 0 and not stats.draft_compiled
        dropped = backend.draft(str(DEMO_D2)).twin
        assert dropped is not None and compiling.wait(COMPILE_WAIT_S)
    assert reply(backend, prompt, params, "", k=4)[0] == plain  # speculative off: the draft goes
    dropped._thread.join(COMPILE_WAIT_S)
    assert not dropped._thread.is_alive() and dropped.compiled is None and dropped.error == "stopped"

    assert reply(backend, prompt, params, str(DEMO_D2), k=4)[0] == plain
    draft = backend.draft(str(DEMO_D2))
    twin = draft.twin
    assert twin is not None and twin is not dropped
    assert twin.done.wait(COMPILE_WAIT_S) and twin.error is None, twin.error
    compiled = twin.compiled
    assert compiled is not None
    eager = draft.model
    ids, stats = reply(
        backend, prompt, params, str(DEMO_D2), k=4
    )  # settles: times both forms, keeps the faster
    assert ids == plain and stats.drafted > 0 and stats.draft_compiled == draft.compiled
    assert draft.twin is None and (draft.model is not eager) == draft.compiled

    # The compiled form itself, whichever was kept: the draft's logits, nothing compiled here.
    loaded = load_model(DEMO_D2, None, "cpu", "float32")
    switched = Switched(loaded.model, compiled)
    plan = [20, *[1] * 6, 2, 3, 4, 1]
    before = graphs()
    got = walk(switched, cache_maker(loaded)(64), plan, 9, twin)
    want = walk(loaded.model, cache_maker(loaded)(64), plan, 9)
    assert graphs() == before
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4)
    draft.model = switched
    assert reply(backend, prompt, params, str(DEMO_D2), k=4)[0] == plain

    # The target's verifying passes, compiled after the draft: adopted where faster, and the
    # reply is still the target's greedy reply.
    verifier = backend.verifier
    assert verifier is not None
    if verifier.twin is not None:
        assert verifier.twin.done.wait(COMPILE_WAIT_S) and verifier.twin.error is None, verifier.twin.error
    ids, stats = reply(backend, prompt, params, str(DEMO_D2), k=4)
    assert ids == plain and stats.drafted > 0 and stats.verifier_compiled == verifier.compiled
    backend.close()
    backend.close()


@pytest.mark.parametrize("rows", [1, TIMED_ROWS])
def test_the_timing_that_adopts_a_twin_times_its_compiled_code(rows):
    """A twin is adopted when its timed passes (pass_timing.timed_ms) beat the eager model's: those
    passes must run the compiled code, not its eager fallback (their cache once filled up
    exactly, a case the compiled code was not warmed up for)."""
    loaded = load_model(DEMO_D2, None, "cpu", "float32")
    twin = compile_twin(loaded, backend="eager", rows=VERIFIED_ROWS, every_row=rows > 1)
    assert twin.done.wait(COMPILE_WAIT_S) and twin.error is None, twin.error
    switched = twin.switched(loaded.model)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as timed:
        timed_ms(switched, cache_maker(loaded), rows)
    regions = [e for e in timed.events() if e.name.startswith("Torch-Compiled Region")]
    assert len(regions) == TIMINGS + 1  # every timed pass (the first, untimed, too); the prefill is eager
