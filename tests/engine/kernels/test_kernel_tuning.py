"""Kernels are chosen by timing them on this machine, within each mode's contract, and the
timings are kept per CPU, torch version and thread count, so a second load times nothing.

Nothing here assumes which kernel is fastest: that is what differs between machines. The tests
check that whatever was chosen is the fastest of the candidates that kept the contract, and
that the contract holds.
"""

from __future__ import annotations

import json
import logging
import os
import threading

import pytest
import torch
from support.checkpoint_factory import default_config, write_checkpoint

from desktop.engine.backend import LoadOptions
from desktop.engine.kernels import gemv
from desktop.engine.kernels import tuning as kernel_tuning
from desktop.engine.kernels.machine import machine_id
from desktop.engine.kernels.stopwatch import OtherLoad
from desktop.engine.kernels.tuning import TOLERANCE, TUNING_BUDGET_S, KernelTuner, relative_error
from desktop.engine.nanochat.backend import NanochatBackend


@pytest.fixture
def quiet_machine(monkeypatch):
    """Timings are saved only when other programs left the CPU alone; the test suite's own load
    (other tests, other CI jobs) must not decide whether these tests see a file."""
    monkeypatch.setattr(kernel_tuning, "BUSY_SHARE", float("inf"))


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _weight(rows: int = 512, cols: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) / cols**0.5


def _choice(tuner: KernelTuner, kernel):
    (choice,) = tuner.describe([kernel])
    return choice


@pytest.mark.parametrize("kind", ["fp16", "int8"])
def test_the_chosen_kernel_is_the_fastest_within_the_contract(kind):
    tuner = KernelTuner()
    weight = _weight()
    kernel = tuner.product(weight, kind)
    choice = _choice(tuner, kernel)
    within = {name: us for name, us in choice.timings_us.items() if name not in choice.refused}
    assert choice.chosen == min(within, key=within.__getitem__)
    assert relative_error(kernel, weight) <= TOLERANCE[kind]
    # every candidate faster than the chosen one was refused, with the reason
    faster = [name for name, us in choice.timings_us.items() if us < choice.timings_us[choice.chosen]]
    assert all(name in choice.refused for name in faster)


def test_a_candidate_outside_the_bound_is_refused_whatever_its_speed():
    """Int4 groups err by ~8% per product: never int8 mode's kernel, even where it is fastest."""
    tuner = KernelTuner()
    weight = _weight(seed=1)
    kernel = tuner.product(weight, "int8")
    choice = _choice(tuner, kernel)
    assert choice.chosen != "int4 weight-only"
    int4 = choice.timings_us.get("int4 weight-only")  # timed wherever this torch has the kernel
    if int4 is not None and int4 < choice.timings_us[choice.chosen]:
        assert choice.refused["int4 weight-only"].startswith("error ")


def test_two_panes_loading_at_once_time_a_shape_once():
    """Compare loads its panes on their own threads with one shared tuner: the second waits for
    the first's timings instead of timing the same shape again on a CPU the first is loading."""
    tuner = KernelTuner()
    kernels: dict[int, object] = {}

    def load(seed: int) -> None:
        kernels[seed] = tuner.product(_weight(seed=seed), "int8")

    workers = [threading.Thread(target=load, args=(seed,)) for seed in (1, 2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    choices = [_choice(tuner, kernels[seed]) for seed in (1, 2)]
    alone = KernelTuner()
    alone.product(_weight(seed=1), "int8")
    assert tuner.measured == alone.measured  # one set of timings for the shape, not two
    for seed, choice in zip((1, 2), choices, strict=True):
        assert relative_error(kernels[seed], _weight(seed=seed)) <= TOLERANCE["int8"]
        assert choice.timings_us == choices[0].timings_us


def test_timings_are_kept_per_machine_and_thread_count(tmp_path, quiet_machine, threads):
    cache = tmp_path / "kernels.json"
    weight = _weight()
    threads(2)
    first = KernelTuner(cache)
    chosen = _choice(first, first.product(weight, "fp16")).chosen
    assert first.measured > 0
    saved = json.loads(cache.read_text())
    assert f"fp16 torch.float32 {weight.shape[0]}x{weight.shape[1]}" in saved["machines"][machine_id()]["2"]

    again = KernelTuner(cache)  # a later start of the app
    assert _choice(again, again.product(weight, "fp16")).chosen == chosen
    assert again.measured == 0

    threads(3)  # another thread count is another machine, as far as speed goes
    again.product(weight, "fp16")
    assert again.measured > 0
    assert set(json.loads(cache.read_text())["machines"][machine_id()]) == {"2", "3"}


def test_other_machines_entries_survive_a_save(tmp_path, quiet_machine):
    cache = tmp_path / "kernels.json"
    theirs = {"2": {"fp16 torch.float32 512x256": {"fbgemm fp16": 1.0}}}
    cache.write_text(json.dumps({"version": kernel_tuning.CACHE_VERSION, "machines": {"Apple M9": theirs}}))
    tuner = KernelTuner(cache)
    tuner.product(_weight(), "int8")
    saved = json.loads(cache.read_text())["machines"]
    assert saved["Apple M9"] == theirs
    assert machine_id() in saved


def test_timings_from_a_busy_machine_are_used_and_kept(tmp_path, monkeypatch):
    """A choice made while other programs kept the CPU busy keeps the mode's contract; it is kept,
    so the next start computes the same numbers (it may not be the fastest: Re-measure redoes it)."""
    monkeypatch.setattr(OtherLoad, "share", lambda self: 0.9)
    cache = tmp_path / "kernels.json"
    tuner = KernelTuner(cache)
    kernel = tuner.product(_weight(), "fp16")
    chosen = _choice(tuner, kernel)
    assert chosen.timings_us  # used now
    monkeypatch.setattr(OtherLoad, "share", lambda self: 0.0)
    again = KernelTuner(cache)  # the next start times nothing, and chooses the same
    assert _choice(again, again.product(_weight(), "fp16")).chosen == chosen.chosen
    assert again.measured == 0


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xff garbage",
        b"[" * 100_000,
        b'{"version": 1, "machines": {"x": [1, 2]}}',
        b'{"version": 1, "machines": "nope"}',
        b'{"version": 1, "machines": {"%s": {"2": {"fp16 torch.float32 512x256": {"fbgemm fp16": "fast"}}}}}',
        b" " * (kernel_tuning.MAX_CACHE_BYTES + 1),
        b'{"version": 1, "machines": {"%s": {"2": {"fp16 torch.float32 512x256": {"fp32": '
        + b"9" * 400
        + b"}}}}}",
        b'"' + b'\\"' * 100_000,
    ],
    ids=[
        "binary",
        "deep",
        "wrong-shape",
        "wrong-type",
        "wrong-value",
        "oversized",
        "400-digits",
        "backslash-quotes",
    ],
)
def test_a_damaged_timings_file_is_timed_again_and_replaced(tmp_path, quiet_machine, caplog, content):
    cache = tmp_path / "kernels.json"
    cache.write_bytes(content.replace(b"%s", machine_id().encode()))
    with caplog.at_level(logging.WARNING, logger="desktop.engine.kernels.tuning"):
        tuner = KernelTuner(cache)
        kernel = tuner.product(_weight(), "fp16")
    assert relative_error(kernel, _weight()) <= TOLERANCE["fp16"]
    assert tuner.measured > 0
    assert json.loads(cache.read_text())["machines"][machine_id()]


@pytest.mark.parametrize("make", [os.mkfifo, lambda p: p.symlink_to("/dev/zero")], ids=["fifo", "dev-zero"])
def test_a_timings_file_that_is_not_a_regular_file_is_replaced(tmp_path, quiet_machine, caplog, make):
    cache = tmp_path / "kernels.json"
    make(cache)  # reading a FIFO blocks, reading /dev/zero never ends
    with caplog.at_level(logging.WARNING, logger="desktop.engine.kernels.tuning"):
        tuner = KernelTuner(cache)
        kernel = tuner.product(_weight(), "fp16")
    assert relative_error(kernel, _weight()) <= TOLERANCE["fp16"]
    assert "not a regular file" in caplog.text
    assert json.loads(cache.read_text())["machines"][machine_id()]


def test_an_unwritable_timings_file_loses_nothing_but_the_cache(tmp_path, quiet_machine, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="desktop.engine.kernels.tuning"):
        tuner = KernelTuner(blocker / "kernels.json")  # a folder that cannot exist
        kernel = tuner.product(_weight(), "int8")
    assert relative_error(kernel, _weight()) <= TOLERANCE["int8"]
    assert "could not save kernel timings" in caplog.text


def test_a_model_shows_its_kernels_and_a_second_load_times_nothing(tmp_path, quiet_machine, monkeypatch):
    monkeypatch.setattr(gemv, "MIN_SPLIT_BYTES", 1)  # the tiny test model's matrices take every path
    cfg = default_config("E7", n_embd=128, vocab_size=1000, n_layer=2)  # matrices big enough to pack
    ckpt = write_checkpoint(tmp_path, "E7", cfg=cfg)
    cache = tmp_path / "cache" / "kernels.json"
    options = LoadOptions(device="cpu", dtype="fast", kernel_cache=cache)
    first = NanochatBackend.open(ckpt, options)
    lines = first.info().kernels
    assert lines and all("×" in line for line in lines)
    first.close()
    kernel_tuning._shared.clear()  # as a new process would start
    second = NanochatBackend.open(ckpt, options)
    assert kernel_tuning.tuner_for(cache).measured == 0  # every timing came from the file
    # The packed kinds' choices come back from the file; exact routes are checked per input
    # alignment, which the new allocation may change, so they may settle on another route.
    assert _lossy_choices(second.info().kernels) == _lossy_choices(lines)
    second.close()


def _lossy_choices(lines: tuple[str, ...]) -> list[str]:
    return [line.split(" (")[0] for line in lines if " exact: " not in line]


@pytest.mark.parametrize("kind", ["exact", "fp16", "int8"])
def test_past_the_tuning_budget_a_product_takes_its_safe_default_and_keeps_it(tmp_path, quiet_machine, kind):
    """The safe default taken past the budget is that product's choice: the next start makes the
    same one instead of timing it and perhaps choosing another (other numbers for the same seed)."""
    cache = tmp_path / "kernels.json"
    weight = _weight()
    x = torch.randn(1, 1, weight.shape[1])
    for start in range(2):  # a first start whose budget is already used up, then a later one
        tuner = KernelTuner(cache, budget_s=0.0 if start == 0 else TUNING_BUDGET_S)
        kernel = tuner.product(weight, kind)
        assert isinstance(kernel, gemv.ExactLinear)  # exact fp32: every mode's contract holds
        assert torch.equal(kernel(x), torch.nn.functional.linear(x, weight))
        assert kernel.chosen == "F.linear" and tuner.measured == 0
    assert tuner.spent_s == 0


def test_a_first_load_says_it_is_tuning_and_a_second_load_does_not(tmp_path, quiet_machine):
    ckpt = write_checkpoint(tmp_path, "E7", cfg=default_config("E7", n_embd=128, vocab_size=1000, n_layer=2))
    cache = tmp_path / "cache" / "kernels.json"
    options = LoadOptions(device="cpu", dtype="int8", kernel_cache=cache)

    def load() -> list[tuple[int, str]]:
        said: list[tuple[int, str]] = []
        NanochatBackend.open(ckpt, options, progress=lambda pct, text: said.append((pct, text))).close()
        return said

    first = load()
    tuning = [(pct, text) for pct, text in first if text.startswith("Tuning for this CPU")]
    assert tuning and all(70 <= pct <= 95 for pct, _ in tuning)
    assert [pct for pct, _ in first] == sorted(pct for pct, _ in first)  # the bar never goes back
    assert f"at most {TUNING_BUDGET_S:.0f} s more" in tuning[0][1]
    kernel_tuning._shared.clear()  # as a new process would start
    assert not any(text.startswith("Tuning") for _, text in load())  # timings come from the file


def _fake_timings(monkeypatch, order: list[str]) -> None:
    """The stopwatch as this test wants it: candidates take 10 µs more the later they come in
    ``order`` (others 1000 µs). What a timing chooses is then the test's, not the machine's."""

    def stream_times(candidates, part, refused):
        return {c.name: 10.0 * (order.index(c.name) + 1) if c.name in order else 1000.0 for c in candidates}

    monkeypatch.setattr(kernel_tuning, "stream_times", stream_times)


def test_a_busy_time_choice_is_kept_until_the_user_re_measures(tmp_path, monkeypatch):
    """Timed on a busy machine, fp32 came out fastest; the next start keeps it whatever a new timing
    would say. A re-measure times again, chooses by the new timings and flags the choice as
    renewed (its replies may differ from older ones); the start after that keeps it, unflagged."""
    monkeypatch.setattr(OtherLoad, "share", lambda self: 0.9)
    cache = tmp_path / "kernels.json"
    weight = _weight()

    def start(order: list[str]):
        _fake_timings(monkeypatch, order)
        tuner = KernelTuner(cache)
        return tuner, _choice(tuner, tuner.product(weight, "fp16"))

    first_tuner, first = start(["fp32 exact", "fp16 F.linear"])
    assert first.chosen == "fp32 exact" and not first.renewed and first_tuner.measured > 0
    later_tuner, later = start(["fp16 F.linear", "fp32 exact"])  # a quiet machine would choose fp16
    assert later.chosen == "fp32 exact" and not later.renewed and later_tuner.measured == 0

    kernel_tuning.remeasure(cache)  # Settings › Re-measure kernels (this process's shared tuner)
    kernel_tuning._shared.clear()
    renewed_tuner, renewed = start(["fp16 F.linear", "fp32 exact"])
    assert renewed.chosen == "fp16 F.linear" and renewed.renewed and renewed_tuner.measured > 0
    kept_tuner, kept = start(["fp32 exact", "fp16 F.linear"])
    assert kept.chosen == "fp16 F.linear" and not kept.renewed and kept_tuner.measured == 0


def test_a_choice_made_under_another_key_is_renewed_once(tmp_path, monkeypatch, quiet_machine):
    """Another torch version or CPU is another key: its entries are not used, the product is timed
    again, and the new choice is flagged as renewed, at that start only."""
    cache = tmp_path / "kernels.json"
    weight = _weight()
    entry = f"int8 torch.float32 {weight.shape[0]}x{weight.shape[1]}"
    older = {str(torch.get_num_threads()): {entry: {"fp32 exact": 1.0}}}
    cache.write_text(json.dumps({"version": kernel_tuning.CACHE_VERSION, "machines": {"older torch": older}}))
    _fake_timings(monkeypatch, ["int8 weight-only", "fbgemm int8", "fp32 exact"])
    first = KernelTuner(cache)
    assert _choice(first, first.product(weight, "int8")).renewed
    again = KernelTuner(cache)
    assert not _choice(again, again.product(weight, "int8")).renewed and again.measured == 0


def test_a_remembered_decision_is_measured_once_and_kept(tmp_path):
    cache = tmp_path / "kernels.json"
    calls: list[int] = []

    def measure() -> dict[str, float]:
        calls.append(1)
        return {"cost": 0.35 + len(calls)}  # another value each time it is measured

    values, renewed = KernelTuner(cache).remember("draft costs", measure)
    assert (values, renewed, len(calls)) == ({"cost": 1.35}, False, 1)
    assert KernelTuner(cache).remember("draft costs", measure) == ({"cost": 1.35}, False)
    assert KernelTuner(cache).recall("draft costs") == {"cost": 1.35} and len(calls) == 1
    KernelTuner(cache).forget()
    assert KernelTuner(cache).remember("draft costs", measure) == ({"cost": 2.35}, True)


def test_a_damaged_list_of_forgotten_choices_leaves_the_timings_in_use(tmp_path, quiet_machine):
    cache = tmp_path / "kernels.json"
    KernelTuner(cache).product(_weight(), "int8")
    data = json.loads(cache.read_text())
    data["forgotten"] = [1, 2]
    cache.write_text(json.dumps(data))
    again = KernelTuner(cache)
    again.product(_weight(), "int8")
    assert again.measured == 0
