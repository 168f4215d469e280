"""A draft's forward compiled in the background (engine/decode/compiled_draft.py): the compiled
code computes the draft's own logits and fills the same cache, the caller's thread never
compiles, Stop and a dropped draft end the compile, and a machine without a compiler keeps the
eager draft.

Most cases compile with dynamo's "eager" backend: the graphs dynamo traces from the real forward
of each era, run op by op, so every logit must equal the eager model's. One case compiles the
demo's 2-layer draft with inductor, as the app does, where this machine has a C++ compiler.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from support.golden import GOLDEN, manifest
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from desktop.config.paths import DEMO_DIR, resource_path
from desktop.engine.backend import GenerationStats, LoadOptions, StreamOptions
from desktop.engine.decode.compiled_draft import COMPILED_ROWS, Switched, why_not_compiled
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.messages import Message
from desktop.engine.nanochat.drafts import compile_twin, warm_positions
from desktop.engine.nanochat.loader import LoadedModel, load_model
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

DEMO = resource_path(DEMO_DIR)
DEMO_D2 = DEMO.parent / "demo-d2"
CASES = [
    GOLDEN / "nanochat" / "E0",
    GOLDEN / "nanochat" / "E4",
    GOLDEN / "nanochat" / "E7",
    GOLDEN / "fork" / "engram-mhc-mtp-swiglu",
]
# Long enough to wait out a first compile on two busy cores (about a minute cold).
COMPILE_WAIT_S = 600


def base_model(case: Path) -> LoadedModel:
    m = manifest(case)
    return load_model(case / "base_checkpoints" / m["tag"], m["base_step"], "cpu", "float32")


def cache_maker(loaded: LoadedModel):
    cfg = loaded.config
    return lambda capacity: KVCache(cfg, 1, capacity, loaded.device, torch.float32)


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def served(twin: torch.nn.Module, ids: torch.Tensor, cache: KVCache) -> bool:
    """Whether code compiled for ``twin``'s forward accepts this call (its guards pass), i.e. the
    call runs compiled code rather than falling back to the eager forward."""
    call = {"self": twin, "idx": ids, "cache": cache, "last_only": True, "chunk": None, "cancel": None}
    return any(e.guard_manager.check(call) for e in _debug_get_cache_entry_list(type(twin).forward.__code__))


def reply(backend, prompt, params: SamplingParams, draft: str, k: int) -> tuple[list[int], GenerationStats]:
    """A reply's ids and stats, ``draft`` drafting ``k`` tokens a round ("": none)."""
    stats = GenerationStats()
    events = backend.stream(prompt, params, threading.Event(), StreamOptions(draft=draft, draft_k=k), stats)
    return [e.id for e in events if e.id >= 0], stats


@torch.inference_mode()
def walk(model, cache: KVCache, plan: list[int], start: int, twin=None) -> list[torch.Tensor]:
    """Feed ``model`` passes of the given row counts, as a draft's reply does (new id tensors), on
    a cache made as a reply makes it; with ``twin``, each pass of a few rows must run compiled code."""
    out, token = [], start
    for rows in plan:
        ids = torch.tensor([[(token + i) % 200 + 3 for i in range(rows)]], dtype=torch.long)
        if twin is not None and rows <= COMPILED_ROWS:
            assert served(twin, ids, cache), f"{rows} rows at position {cache.pos} ran eagerly"
        out.append(model(ids, cache, last_only=True))
        token += rows
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_the_compiled_twin_gives_the_drafts_logits_and_the_caller_never_compiles(case):
    loaded = base_model(case)
    twin = compile_twin(loaded, backend="eager")
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
    got = walk(switched, switched_cache, plan, 5, twin.twin)
    assert graphs() == before  # run-only: the caller's thread compiled nothing
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"pass {i} ({plan[i]} rows)"
    assert switched_cache.pos == eager_cache.pos == sum(plan)
    assert switched_cache.same_as(eager_cache)


@pytest.mark.skipif(why_not_compiled() is not None, reason=str(why_not_compiled()))
def test_a_dropped_draft_ends_its_compile_and_a_reply_goes_on_eagerly():
    backend = open_backend(DEMO, LoadOptions(compile_drafts=True))
    prompt = backend.render([Message.of_text("user", "What is 12 times 7?")], 16)
    params = SamplingParams(temperature=0.0, max_tokens=16)
    drafted, _ = reply(backend, prompt, params, str(DEMO_D2), k=3)
    twin = backend.draft(str(DEMO_D2)).twin
    assert twin is not None  # compiling while the draft drafts eagerly
    # Speculative off: the draft goes, and its compile stops.
    assert reply(backend, prompt, params, "", k=3)[0] == drafted
    twin._thread.join(COMPILE_WAIT_S)
    assert not twin._thread.is_alive() and twin.compiled is None
    backend.close()


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
def test_the_demo_drafts_with_its_smaller_depth_compiled_by_inductor():
    """What the app does: the demo's 2-layer run, compiled in the background with inductor, drafts
    for the 4-layer demo; the reply is the demo's own greedy reply, and the footer's flag says
    which form drafted. Whether the compiled form is adopted is this machine's timing; its
    logits are the draft's to float rounding either way."""
    backend = open_backend(DEMO, LoadOptions(compile_drafts=True))
    prompt = backend.render([Message.of_text("user", "How many r are in strawberry?")], 48)
    params = SamplingParams(temperature=0.0, max_tokens=48)

    plain, _ = reply(backend, prompt, params, "", k=4)
    assert reply(backend, prompt, params, str(DEMO_D2), k=4)[0] == plain
    draft = backend.draft(str(DEMO_D2))
    twin = draft.twin
    assert twin is not None and twin.done.wait(COMPILE_WAIT_S) and twin.error is None, twin and twin.error
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
    got = walk(switched, cache_maker(loaded)(64), plan, 9, twin.twin)
    want = walk(loaded.model, cache_maker(loaded)(64), plan, 9)
    assert graphs() == before
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4)
    draft.model = switched
    assert reply(backend, prompt, params, str(DEMO_D2), k=4)[0] == plain
    backend.close()
