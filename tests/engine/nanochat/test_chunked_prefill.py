"""A long prompt prefills in chunks where this machine gives one pass's bits that way, and only
there: on checkpoints nanochat's own code wrote, at every era and in every fork variant, the
default prefill leaves the same logits, the same cache and the same next tokens as one pass."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from support.chunk_checks import chunk_checks, greedy_after_prefill
from support.golden import CASES, EXPERIMENT_CASES, manifest

from desktop.config.paths import DEMO_DIR, resource_path
from desktop.engine.backend import GenerationStats, LoadOptions, StreamOptions
from desktop.engine.decode.chunked import PREFILL_CHUNK
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.kernels.gemv import APPROXIMATE_KINDS, fbgemm_available
from desktop.engine.kernels.tuning import KernelTuner
from desktop.engine.messages import Message
from desktop.engine.nanochat.loader import load_model
from desktop.engine.nanochat.model import GPT
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

DEMO = resource_path(DEMO_DIR)
# A long paste: over 512 tokens of the demo's tokenizer (1,016 with the chat template).
PASTE = " ".join(f"Line {i}: the cat sat on the mat and looked at {i % 7} birds." for i in range(90))
ROWS = 2 * PREFILL_CHUNK + 37  # three chunks, the last one ragged


def _model(case: Path, kernels: Path) -> GPT:
    m = manifest(case)
    if case in EXPERIMENT_CASES:
        directory = case / "experiments" / m["experiment"] / m["tag"] / "sft"
    else:
        directory = case / "chatsft_checkpoints" / m["tag"]
    return load_model(directory, m["step"], device="cpu", dtype="float32", kernel_cache=kernels).model


def _reply(model: GPT, ids: torch.Tensor, chunk: int | None, new: int = 8) -> tuple[list[int], KVCache]:
    """Prefill ``ids`` (``chunk`` as :meth:`GPT.forward` takes it), then decode ``new`` greedy ids."""
    cache = KVCache(model.config, 1, ids.size(1) + new, model.device, model.compute_dtype)
    cache.keep_hidden(True)  # the MTP head's states are part of what a prefill leaves
    return greedy_after_prefill(model, ids, cache, chunk, new), cache


@pytest.mark.parametrize("case", [*CASES, *EXPERIMENT_CASES], ids=lambda c: f"{c.parent.name}-{c.name}")
def test_a_long_prompt_leaves_one_passs_cache_and_tokens(case, tmp_path):
    kernels = tmp_path / "kernels.json"
    model = _model(case, kernels)
    assert model.config.rope_len > ROWS
    ids = torch.randint(model.config.vocab_size, (1, ROWS), generator=torch.Generator().manual_seed(5))

    default_ids, default_cache = _reply(model, ids, chunk=None)
    one_pass_ids, one_pass_cache = _reply(model, ids, chunk=0)

    assert default_ids == one_pass_ids
    assert default_cache.same_as(one_pass_cache)
    checked = chunk_checks(kernels)
    if model.config.mhc:
        # mHC pools over a pass's rows: chunks would change its math, so nothing is checked.
        assert not checked
    else:
        # Whichever way the check went on this CPU, it was made once and kept per machine.
        assert list(checked.values()) in ([0.0], [1.0])


def test_the_check_is_kept_in_the_timings_file_and_a_second_load_does_not_check_again(tmp_path):
    case = next(c for c in CASES if c.name == "E7")
    kernels = tmp_path / "kernels.json"
    ids = torch.randint(300, (1, ROWS), generator=torch.Generator().manual_seed(6))
    first = _model(case, kernels)
    _reply(first, ids, chunk=None, new=1)
    ((entry, same),) = chunk_checks(kernels).items()
    assert same in (0.0, 1.0)

    # A new process reads the verdict: a check that ran again would be a second one.
    fresh = KernelTuner(kernels)

    def again() -> bool:
        raise AssertionError("checked a second time")

    assert fresh.verdict(entry, torch.get_num_threads(), again) is bool(same)


def test_a_verdict_is_per_thread_count(tmp_path):
    kernels = tmp_path / "kernels.json"
    tuner = KernelTuner(kernels)
    assert tuner.verdict("a check", 2, lambda: True) is True
    assert tuner.verdict("a check", 3, lambda: False) is False
    reread = KernelTuner(kernels)
    assert reread.verdict("a check", 2, lambda: False) is True
    assert reread.verdict("a check", 3, lambda: True) is False


def test_a_pass_that_fails_midway_leaves_the_cache_where_it_was(tmp_path):
    case = next(c for c in CASES if c.name == "E4")
    model = _model(case, tmp_path / "kernels.json")
    ids = torch.randint(model.config.vocab_size, (1, ROWS), generator=torch.Generator().manual_seed(7))
    _, cache = _reply(model, ids[:, :20], chunk=0, new=1)
    before = cache.pos
    last_block = model.blocks[-1]
    calls = 0

    def fails_on_the_second_chunk(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise MemoryError("out of memory")
        return type(last_block).forward(last_block, *args, **kwargs)

    last_block.forward = fails_on_the_second_chunk  # type: ignore[method-assign]
    with pytest.raises(MemoryError), torch.inference_mode():
        model(ids, cache, last_only=True, chunk=PREFILL_CHUNK)
    assert cache.pos == before
    del last_block.forward


@pytest.mark.parametrize(
    ("precision", "draft"),
    [("float32", ""), ("float32", "int8"), ("int8", "")],
    ids=["plain", "speculative", "int8-mode"],
)
def test_stop_during_a_long_prompt_ends_its_prefill_and_the_next_send_goes_on_from_what_was_done(
    tmp_path, precision, draft
):
    """A user pastes a long text into the demo chat, presses Stop before the first token, and
    sends again: the first reply ends with nothing said, and the second prefills only what the
    first did not (everything after the first chunk where this CPU prefills in chunks, as int8
    mode always does)."""
    kernels = tmp_path / "kernels.json"
    backend = open_backend(DEMO, LoadOptions(dtype=precision, kernel_cache=kernels))
    prompt = backend.render([Message.of_text("user", PASTE)], 8)
    assert prompt.tokens > PREFILL_CHUNK
    params = SamplingParams(temperature=0.0, max_tokens=8)
    options = StreamOptions(draft=draft, draft_k=2 if draft else 0)  # a fixed k always drafts

    stop = threading.Event()
    stop.set()  # pressed while the prompt is prefilled
    first = GenerationStats()
    said = [e for e in backend.stream(prompt, params, stop, options, first) if e.id >= 0]
    chunked = precision == "int8" or list(chunk_checks(kernels).values()) == [1.0]

    again = GenerationStats()
    go = threading.Event()
    reply = [e.id for e in backend.stream(prompt, params, go, options, again) if e.id >= 0]
    assert (said, first.new_tokens, first.stopped) == ([], 0, "cancelled")
    assert again.prefilled_tokens == (prompt.tokens - PREFILL_CHUNK if chunked else 1)
    assert len(reply) == again.new_tokens > 0
    assert (again.drafted > 0) is bool(draft)
    backend.close()


@pytest.mark.skipif(not fbgemm_available(), reason="needs torch's fbgemm (x86) for packed weights")
@pytest.mark.parametrize(("precision", "max_kl"), [("fast", 1e-4), ("int8", 0.15)])
def test_fast_and_int8_modes_prefill_in_chunks_unchecked_and_stay_as_close_to_exact(
    tmp_path, precision, max_kl
):
    """Their kernels promise an error bound, not nanochat's bits: a long prompt goes in chunks
    (Stop ends it after the first) with no check, and its next token is as close to exact
    mode's as their bound (test_exact_mode.py) asks of one pass."""
    kernels = tmp_path / "kernels.json"
    exact = load_model(DEMO, None, device="cpu", dtype="float32", kernel_cache=kernels).model
    model = load_model(DEMO, None, device="cpu", dtype=precision, kernel_cache=kernels).model
    assert model.kernel_kind in APPROXIMATE_KINDS
    ids = torch.randint(model.config.vocab_size, (1, ROWS), generator=torch.Generator().manual_seed(8))

    stop = threading.Event()
    stop.set()
    cache = KVCache(model.config, 1, ROWS, model.device, model.compute_dtype)
    with torch.inference_mode():
        model(ids, cache, last_only=True, cancel=stop)
        one_pass = KVCache(exact.config, 1, ROWS, exact.device, exact.compute_dtype)
        reference = exact(ids, one_pass, last_only=True, chunk=0)
        in_chunks = KVCache(model.config, 1, ROWS, model.device, model.compute_dtype)
        chunked = model(ids, in_chunks, last_only=True)
    assert cache.pos == PREFILL_CHUNK
    assert not chunk_checks(kernels)  # nothing was checked
    kl = F.kl_div(F.log_softmax(chunked, -1), F.log_softmax(reference, -1), log_target=True, reduction="sum")
    assert kl.item() < max_kl


def test_a_pass_without_a_cache_is_never_cut(tmp_path):
    """Chunks attend to the rows before them through the cache; with none (scoring a text), a
    chunk size asked for is one pass."""
    model = _model(next(c for c in CASES if c.name == "E7"), tmp_path / "kernels.json")
    ids = torch.randint(model.config.vocab_size, (1, ROWS), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        assert torch.equal(model(ids, chunk=PREFILL_CHUNK), model(ids, chunk=0))


class _StopOnLongPass:
    """The draft's model, with the user pressing Stop as its pass over the long prompt begins."""

    def __init__(self, model: GPT, stop: threading.Event) -> None:
        self.model, self.stop = model, stop
        self.config, self.device, self.compute_dtype = model.config, model.device, model.compute_dtype

    def __call__(self, ids: torch.Tensor, cache=None, last_only=False, cancel=None) -> torch.Tensor:
        if ids.size(1) > PREFILL_CHUNK:
            self.stop.set()
        return self.model(ids, cache, last_only=last_only, cancel=cancel)


def test_stop_during_the_drafts_pass_over_a_long_prompt_ends_it_after_a_chunk(tmp_path):
    """With speculative decoding on, the draft's first pass takes the whole prompt after the
    target's has: Stop pressed then ends it after its first chunk (the int8 copy chunks without
    a check), and the reply says nothing."""
    backend = open_backend(DEMO, LoadOptions(dtype="float32", kernel_cache=tmp_path / "kernels.json"))
    prompt = backend.render([Message.of_text("user", PASTE)], 8)
    options = StreamOptions(draft="int8", draft_k=2)
    draft = backend.draft("int8")
    stop = threading.Event()
    draft.model = _StopOnLongPass(draft.model, stop)
    stats = GenerationStats()
    params = SamplingParams(temperature=0.0, max_tokens=8)
    said = [e for e in backend.stream(prompt, params, stop, options, stats) if e.id >= 0]
    assert (said, stats.new_tokens, stats.stopped, stats.drafted) == ([], 0, "cancelled", 0)
    assert draft.cache.pos == PREFILL_CHUNK  # the rows done stay for the next send
    backend.close()
