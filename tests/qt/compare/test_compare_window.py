"""The Compare view driven end to end: real worker threads, tiny checkpoints, real SQLite.

Expected values are computed here from the token lists and from the models themselves (a
direct forward pass and log-softmax), never read back from the code under test.
"""

from __future__ import annotations

import math
import shutil
import threading
from pathlib import Path

import pytest
import torch
from support import backend_helpers
from support.checkpoint_factory import write_checkpoint
from support.golden import GOLDEN

from desktop.config.settings import Settings
from desktop.engine.backend import LoadOptions
from desktop.engine.discovery import CheckpointEntry, summarize
from desktop.engine.kernels import memory
from desktop.engine.messages import Message
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.params import SamplingParams
from desktop.qt.compare.controller import CompareController
from desktop.qt.compare.view import CompareView
from desktop.qt.model.worker import TurnLock
from desktop.qt.widgets.token_view import probability_color
from desktop.session.compare.analysis import cpu_threads, first_divergence, sweep_steps, token_diff
from desktop.store import HistoryStore
from desktop.store.export import from_json

pytestmark = pytest.mark.gui

PROMPT = "hello there"
LOAD_MS = 60000


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    """a@10 and b@10 (other random weights), and a@20: a@10 with its output head nudged a little,
    so it agrees with a@10 for a few tokens and then goes its own way."""
    base = tmp_path_factory.mktemp("nanochat")
    a = write_checkpoint(base, "E7", phase="chatsft", tag="a", step=10, seed=0, tokenizer="pkl")
    b = write_checkpoint(base, "E7", phase="chatsft", tag="b", step=10, seed=1, tokenizer="pkl")
    write_checkpoint(base, "E7", phase="chatsft", tag="a", step=20, seed=0, tokenizer="pkl")
    sd = torch.load(a / "model_000010.pt", weights_only=True)
    head = sd["lm_head.weight"]
    noise = torch.randn(head.shape, generator=torch.Generator().manual_seed(1))
    sd["lm_head.weight"] = head + 0.1 * head.std() * noise
    torch.save(sd, a / "model_000020.pt")
    return {"a10": (a, 10), "a20": (a, 20), "b10": (b, 10)}


@pytest.fixture
def controller(qtbot, tmp_path):
    store = HistoryStore(tmp_path / "history.sqlite3")
    c = CompareController(store, Settings(tmp_path / "settings.json"))
    yield c
    c.shutdown()
    assert all(p.host.model_thread.isFinished() for p in c.panes)
    store.close()


@pytest.fixture
def view(qtbot, controller):
    v = CompareView(controller)
    qtbot.addWidget(v)
    v.resize(1200, 700)
    v.show()
    return v


def load(qtbot, c: CompareController, *keys: tuple[Path, int]) -> None:
    for i, (path, step) in enumerate(keys):
        c.load(i, path, step)
    qtbot.waitUntil(lambda: all(c.panes[i].loaded_key == keys[i] for i in range(len(keys))), timeout=LOAD_MS)


def run(qtbot, c: CompareController, shared: dict, text: str = PROMPT) -> None:
    with qtbot.waitSignal(c.busy_changed, timeout=LOAD_MS, check_params_cb=lambda busy: not busy):
        assert c.send(text, SamplingParams(**shared))


def direct_logprobs(key: tuple[Path, int], reply: list[int], max_tokens: int) -> tuple[torch.Tensor, int]:
    """log_softmax of one plain forward pass over prompt + reply, and the prompt length."""
    session = NanochatBackend.open(key[0], LoadOptions(step=key[1], device="cpu"))
    prompt = list(session.render([Message.of_text("user", PROMPT)], max_tokens).ids)
    with torch.inference_mode():
        logits = session.model(torch.tensor([prompt + reply]))[0]
    return torch.log_softmax(logits.float(), dim=-1), len(prompt)


def expected_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ----- pure pieces --------------------------------------------------------------------------------


def test_first_divergence_waits_for_streams_and_counts_an_early_end():
    assert first_divergence([[1, 2, 3], [1, 2, 4]], [True, True]) == (2, 2)
    assert first_divergence([[1, 2], [1, 2]], [True, True]) == (None, 2)
    assert first_divergence([[1, 2], [1, 2, 3]], [True, False]) == (2, 2)  # one ended, the other went on
    assert first_divergence([[1, 2], [1]], [False, False]) == (None, 1)  # still streaming: undecided
    assert first_divergence([[1, 2, 5], [1, 2, 6]], [False, False], start=2) == (2, 2)


def test_sweep_steps_are_evenly_spaced_and_keep_the_latest():
    assert sweep_steps([10, 20, 30, 40, 50]) == [10, 20, 40, 50]
    assert sweep_steps([5, 1, 3]) == [1, 3, 5]
    picked = sweep_steps(list(range(0, 1001, 10)))
    assert picked[0] == 0 and picked[-1] == 1000 and len(picked) == 4


def test_token_diff_spans_turn_one_reply_into_the_other():
    a, b = [1, 2, 3, 4, 5, 6], [1, 9, 3, 4, 6, 7, 8]
    rebuilt, pos = [], 0
    for span in token_diff(a, b):
        rebuilt += a[pos : span.a_start] + b[span.b_start : span.b_end]
        pos = span.a_end
    assert rebuilt + a[pos:] == b
    assert token_diff(a, a) == []


def test_cpu_threads_share_the_cores_or_give_each_all_of_them():
    assert cpu_threads("parallel", 1, 8) == [None]
    assert cpu_threads("parallel", 3, 8) == [2, 2, 2]
    assert cpu_threads("parallel", 4, 2) == [1, 1, 1, 1]
    assert cpu_threads("interleaved", 2, 8) == [8, 8]


def test_turn_lock_serves_waiters_in_arrival_order():
    lock, order = TurnLock(), []
    lock.__enter__()
    threads = []
    for name in ("first", "second"):
        t = threading.Thread(target=lambda n=name: (lock.__enter__(), order.append(n), lock.__exit__()))
        t.start()
        threads.append(t)
        expected = len(threads) + 1
        while lock._next_ticket < expected:  # the thread has taken its ticket (no timing involved)
            pass
    lock.__exit__()
    for t in threads:
        t.join()
    assert order == ["first", "second"]


# ----- panes end to end ---------------------------------------------------------------------------


def test_same_checkpoint_and_seed_give_identical_replies(qtbot, controller, view, ckpts):
    load(qtbot, controller, ckpts["a10"], ckpts["a10"])
    run(qtbot, controller, {"temperature": 1.0, "top_k": 0, "max_tokens": 24, "seed": 7})
    a, b = (p.run for p in controller.panes)
    assert a.tokens and a.tokens == b.tokens
    assert a.reply.parts == b.reply.parts
    assert controller.divergence is None
    assert view.panes[0].view.toPlainText() == view.panes[1].view.toPlainText() != ""
    assert view.panes[0].view.marker_token() is None
    assert "identical" in view.status.text()


@pytest.mark.parametrize("scheduling", ["parallel", "interleaved"])
def test_both_cpu_schedules_give_the_chat_sessions_tokens(qtbot, tmp_path, ckpts, scheduling):
    store = HistoryStore(tmp_path / "history.sqlite3")
    c = CompareController(store, Settings(tmp_path / "settings.json"), scheduling=scheduling)
    try:
        load(qtbot, c, ckpts["a10"], ckpts["b10"])
        shared = {"temperature": 0.9, "top_k": 20, "max_tokens": 16, "seed": 11}
        run(qtbot, c, shared)
        for pane, key in zip(c.panes, (ckpts["a10"], ckpts["b10"]), strict=True):
            session = NanochatBackend.open(key[0], LoadOptions(step=key[1], device="cpu"))
            prompt = list(session.render([Message.of_text("user", PROMPT)], 16).ids)
            params = SamplingParams(temperature=0.9, top_k=20, max_tokens=16, seed=11)
            assert pane.run.tokens == backend_helpers.reply_ids(session, prompt, params)
    finally:
        c.shutdown()
        store.close()


def test_different_checkpoints_diverge_where_the_tokens_first_differ(qtbot, controller, view, ckpts):
    load(qtbot, controller, ckpts["a10"], ckpts["a20"])
    run(qtbot, controller, {"temperature": 1.0, "top_k": 0, "max_tokens": 32, "seed": 7})
    a, b = (p.run.tokens for p in controller.panes)
    expected = expected_divergence(a, b)
    assert expected is not None and expected > 0  # the scenario: agree for a while, then differ
    assert controller.divergence == expected
    assert [p.view.marker_token() for p in view.panes] == [expected, expected]
    # The diff marks exactly the tokens that differ.
    view.diff_box.setChecked(True)
    spans = token_diff(a, b)
    deleted = {i for s in spans for i in range(s.a_start, s.a_end)}
    inserted = {i for s in spans for i in range(s.b_start, s.b_end)}
    assert set(view.panes[0].view.diff_marks) == deleted and min(deleted) >= expected
    assert set(view.panes[1].view.diff_marks) == inserted
    assert set(view.panes[1].view.diff_marks.values()) == {"insert"}


def test_stop_stops_every_pane(qtbot, controller, view, ckpts):
    load(qtbot, controller, ckpts["a10"], ckpts["b10"])
    stopped = []

    def on_token(_pane, _index, _ev) -> None:
        if not stopped and all(len(p.run.tokens) >= 3 for p in controller.panes):
            stopped.append(True)
            view.input.stop_requested.emit()  # what the Stop button and Esc do

    controller.pane_token.connect(on_token)
    run(qtbot, controller, {"temperature": 1.0, "top_k": 0, "max_tokens": 400, "seed": 3})
    assert stopped
    for pane in controller.panes:
        assert pane.run.stats["stopped"] == "cancelled"
        assert 3 <= pane.run.stats["new_tokens"] < 400
    assert not view.input.generating


def test_overlay_probabilities_equal_a_direct_log_softmax(qtbot, controller, view, ckpts):
    load(qtbot, controller, ckpts["a10"], ckpts["b10"])
    emitted = []
    for pane in controller.panes:
        pane.token.connect(lambda ev: emitted.append(ev))
    shared = {"temperature": 0.0, "max_tokens": 12, "seed": 1}
    run(qtbot, controller, shared)
    assert emitted and all(
        ev.logprob is None and ev.top is None for ev in emitted
    )  # overlay off: none computed
    assert all(lp is None for p in controller.panes for lp in p.run.trace.logprobs)

    view.overlay_box.setChecked(True)
    run(qtbot, controller, shared)
    for index, key in enumerate((ckpts["a10"], ckpts["b10"])):
        run_ = controller.panes[index].run
        lp, start = direct_logprobs(key, run_.tokens, 12)
        for i, token in enumerate(run_.tokens):
            row = lp[start - 1 + i]
            chosen, top = run_.trace.logprobs[i]
            assert chosen == pytest.approx(row[token].item(), abs=1e-4)
            assert [t for t, _, _ in top] == row.topk(5).indices.tolist()
            assert [v for _, _, v in top] == pytest.approx(row.topk(5).values.tolist(), abs=1e-4)
            shown = view.panes[index].view
            assert shown.tokens[i].probability == pytest.approx(math.exp(row[token].item()), abs=1e-4)
            assert shown.background(i) == probability_color(shown.tokens[i].probability)
        tip = view.panes[index].view.tooltip_html(0)
        assert "p = " in tip and tip.count("<tr") == 5


def test_overlay_switched_on_afterwards_fills_probabilities_in(qtbot, controller, view, ckpts):
    load(qtbot, controller, ckpts["a10"], ckpts["a10"])
    run(qtbot, controller, {"temperature": 1.0, "top_k": 0, "max_tokens": 10, "seed": 5})
    with qtbot.waitSignals([controller.pane_refreshed, controller.pane_refreshed], timeout=LOAD_MS):
        view.overlay_box.setChecked(True)
    run_ = controller.panes[0].run
    lp, start = direct_logprobs(ckpts["a10"], run_.tokens, 10)
    got = [entry[0] for entry in run_.trace.logprobs]
    want = [lp[start - 1 + i, t].item() for i, t in enumerate(run_.tokens)]
    assert got == pytest.approx(want, abs=1e-4)
    assert view.panes[0].view.background(0) is not None


def test_cross_scores_match_teacher_forcing_under_each_checkpoint(qtbot, controller, view, ckpts):
    keys = (ckpts["a10"], ckpts["b10"])
    load(qtbot, controller, *keys)
    run(qtbot, controller, {"temperature": 1.0, "top_k": 0, "max_tokens": 16, "seed": 2})
    results = {}
    controller.cross_scored.connect(lambda src, scorer, res: results.__setitem__(scorer, (src, res)))
    assert controller.cross_score(0)
    qtbot.waitUntil(lambda: len(results) == 2, timeout=LOAD_MS)
    reply = controller.panes[0].run.tokens
    session = NanochatBackend.open(keys[0][0], LoadOptions(step=keys[0][1], device="cpu"))
    for scorer, key in enumerate(keys):
        src, res = results[scorer]
        assert src == 0 and "error" not in res
        lp, start = direct_logprobs(key, reply, 16)
        per_token = [lp[start - 1 + i, t].item() for i, t in enumerate(reply)]
        forced = controller.panes[0].run.trace.forced
        scored = [(t, x) for t, x, f in zip(reply, per_token, forced, strict=True) if not f]
        assert res["mean_logprob"] == pytest.approx(sum(x for _, x in scored) / len(scored), abs=1e-4)
        text = [(t, x) for t, x in scored if session.tok.special_name(t) is None]
        n_bytes = len(session.tok.decode([t for t, _ in text]).encode("utf-8"))
        assert res["bits_per_byte"] == pytest.approx(
            -sum(x for _, x in text) / math.log(2) / n_bytes, rel=1e-4
        )
        assert "A's reply here" in view.panes[scorer].score.text()


def test_memory_warning_when_the_selection_needs_more_than_is_free(
    qtbot, controller, view, ckpts, monkeypatch
):
    summaries = [summarize(*ckpts["a10"]), summarize(*ckpts["b10"])]
    need = sum(s.memory_estimate(4) for s in summaries)
    monkeypatch.setattr(memory, "available_ram", lambda: need - 1)
    with qtbot.waitSignal(controller.memory_checked, timeout=LOAD_MS, check_params_cb=lambda ok, _m: not ok):
        controller.select(0, *ckpts["a10"])
        controller.select(1, *ckpts["b10"])
    assert controller.memory.last[:3] == (False, need, need - 1)
    assert not view.memory_banner.isHidden() and "RAM" in view.memory_banner.message.text()
    monkeypatch.setattr(memory, "available_ram", lambda: need)
    with qtbot.waitSignal(controller.memory_checked, timeout=LOAD_MS, check_params_cb=lambda ok, _m: ok):
        controller.select(1, *ckpts["b10"])
    assert view.memory_banner.isHidden()


def test_a_panes_checkpoint_drafting_for_the_others_counts_once_more_per_pane_that_loads_it(
    qtbot, controller, view, ckpts, monkeypatch
):
    """Each other pane loads its own copy of the drafting checkpoint: with room for the two panes
    but not a third copy, picking pane A as the draft warns before anything loads; Off clears it."""
    controller.settings.set("draft_k", 3)
    load(qtbot, controller, ckpts["a10"], ckpts["a20"])
    a10, a20 = summarize(*ckpts["a10"]), summarize(*ckpts["a20"])
    two = a10.memory_estimate(4) + a20.memory_estimate(4)
    room = a10.memory_estimate(4) - 1  # free with both panes loaded: one byte short of a copy
    monkeypatch.setattr(memory, "available_ram", lambda: room)
    with qtbot.waitSignal(controller.memory_checked, timeout=LOAD_MS, check_params_cb=lambda ok, _m: not ok):
        view.speed.setCurrentIndex(
            speed_choices(view).index(f"Pane A's checkpoint ({ckpts['a10'][0].name}@10)")
        )
    assert controller.memory.last[:3] == (False, two + a10.memory_estimate(4), two + room)
    assert not view.memory_banner.isHidden()
    said = view.memory_banner.message.text()
    assert said.startswith("These 2 checkpoints and a draft copy of one need about")
    assert "Turn Speculative off" in said
    with qtbot.waitSignal(controller.memory_checked, timeout=LOAD_MS, check_params_cb=lambda ok, _m: ok):
        view.speed.setCurrentIndex(view.speed.findData(""))
    assert view.memory_banner.isHidden()
    # With room for the copy, pane B drafts; once it holds its copy, the check does not count it
    # against itself (the OS's free memory already lacks it).
    monkeypatch.setattr(memory, "available_ram", lambda: 10 * a10.memory_estimate(4))  # the loader checks too
    view.speed.setCurrentIndex(speed_choices(view).index(f"Pane A's checkpoint ({ckpts['a10'][0].name}@10)"))
    assert controller.memory.last[0]
    run(qtbot, controller, {"temperature": 0.0, "top_k": 0, "max_tokens": 8, "seed": 7})
    assert controller.panes[1].run.stats["drafted"] > 0
    monkeypatch.setattr(memory, "available_ram", lambda: 0)  # the copy is in use: nothing more is needed
    controller.memory.check()
    assert controller.memory.last[0]


def test_save_to_history_and_json_export_round_trip(qtbot, controller, view, ckpts, tmp_path):
    load(qtbot, controller, ckpts["a10"], ckpts["b10"])
    controller.set_overrides(1, {"temperature": 0.5})
    run(qtbot, controller, {"temperature": 1.0, "top_k": 0, "max_tokens": 12, "seed": 9})
    conv_id = controller.save()
    store = controller.store
    assert [(r.id, r.kind) for r in store.list_conversations()] == [(conv_id, "compare")]
    stored = [m for _, m in store.active_path(conv_id)]
    assert [m.role for m in stored] == ["user", "assistant", "assistant"]
    assert stored[0].plain_text() == PROMPT
    for message, pane, key in zip(stored[1:], controller.panes, (ckpts["a10"], ckpts["b10"]), strict=True):
        meta = message.meta
        assert (meta["checkpoint"], meta["step"], meta["era"]) == (str(key[0]), key[1], "E7")
        assert message.tokens.ids == pane.run.tokens and meta["stats"] == pane.run.stats
        assert meta["device"] == "cpu" and meta["dtype"] == "float32" and meta["sampling"]["seed"] == 9
    assert [m.meta["sampling"]["temperature"] for m in stored[1:]] == [1.0, 0.5]

    target = tmp_path / "comparison.json"
    controller.export("json", target)
    exported = from_json(target.read_text(encoding="utf-8"))
    assert [m.to_dict() for m in exported.messages] == [m.to_dict() for m in stored]
    assert exported.meta == store.conversation_meta(conv_id) and exported.meta["kind"] == "compare"
    markdown = tmp_path / "comparison.md"
    controller.export("md", markdown)
    assert PROMPT in markdown.read_text() and "## B · sft/b · step 10" in markdown.read_text()

    # A fresh controller shows the saved comparison again, token for token.
    again = CompareController(store, Settings(tmp_path / "settings.json"))
    try:
        assert again.open_comparison(conv_id)
        assert [p.run.tokens for p in again.panes] == [p.run.tokens for p in controller.panes]
        assert again.prompt == PROMPT and again.divergence == controller.divergence
        # Each pane's own settings come back with it.
        assert [p.overrides for p in again.panes] == [{}, {"temperature": 0.5}]
    finally:
        again.shutdown()


def test_step_sweep_and_temperature_switch_set_up_the_panes(qtbot, controller, view, ckpts):
    path = ckpts["a10"][0]
    entry = CheckpointEntry("sft", "a", path, [10, 20])
    view.set_entries([entry])
    assert controller.step_sweep(entry) == [10, 20]
    qtbot.waitUntil(
        lambda: [p.loaded_key for p in controller.panes] == [(path, 10), (path, 20)], timeout=LOAD_MS
    )
    assert [p.current() for p in view.panes] == [(path, 10), (path, 20)]
    assert controller.add_pane() and len(view.panes) == 3
    assert controller.temperature_sweep()
    qtbot.waitUntil(lambda: all(p.loaded_key == (path, 10) for p in controller.panes), timeout=LOAD_MS)
    assert [p.overrides for p in controller.panes] == [{"temperature": t} for t in (0.0, 0.6, 1.0)]
    assert [p.overrides()["temperature"] for p in view.panes] == [0.0, 0.6, 1.0]


def speed_choices(view: CompareView) -> list[str]:
    return [view.speed.itemText(i) for i in range(view.speed.count())]


def pane_drafts(view: CompareView) -> list[str]:
    """The Speculative choices that name a pane's checkpoint."""
    return [t for t in speed_choices(view) if t.startswith("Pane")]


def test_one_panes_checkpoint_drafts_for_the_others_and_the_choice_follows_the_panes(
    qtbot, controller, view, ckpts
):
    controller.settings.set("draft_k", 3)  # Chat's fixed draft length: this small a model drafts
    load(qtbot, controller, ckpts["a10"], ckpts["a20"])
    a_path = ckpts["a10"][0]
    offered = pane_drafts(view)
    assert offered == [f"Pane A's checkpoint ({a_path.name}@10)", f"Pane B's checkpoint ({a_path.name}@20)"]
    view.speed.setCurrentIndex(speed_choices(view).index(offered[0]))
    plain = "Not every pane decodes speculatively"
    with qtbot.waitSignal(
        controller.notice, check_params_cb=lambda _level, title, _msg: title == plain
    ) as said:
        run(qtbot, controller, {"temperature": 0.0, "top_k": 0, "max_tokens": 24, "seed": 7})
    assert said.args[2] == "pane A: it is the draft"
    a, b = (p.run for p in controller.panes)
    assert "draft" not in a.stats and not any(a.trace.drafts)
    assert b.stats["draft"] == f"{a_path}@10" and b.stats["drafted"] > 0
    assert f"speculative ({a_path.name}@10)" in view.panes[1].stats.text()
    assert "drafted kept" in view.panes[1].stats.text()
    # Greedy with a draft is the target's own greedy reply.
    session = NanochatBackend.open(a_path, LoadOptions(step=20, device="cpu"))
    prompt = list(session.render([Message.of_text("user", PROMPT)], 24).ids)
    assert b.tokens == backend_helpers.reply_ids(
        session, prompt, SamplingParams(temperature=0.0, max_tokens=24)
    )

    # A third pane loads: it is offered too, and the choice stays with pane A.
    assert controller.add_pane()
    with qtbot.waitSignal(controller.pane_loaded, timeout=LOAD_MS):
        controller.load(2, *ckpts["b10"])
    assert len(pane_drafts(view)) == 3
    assert view.speed.currentText() == offered[0]
    # Pane A goes: what was pane B moves up to A, and the choice falls back to Off.
    assert controller.remove_pane(0)
    assert view.speed.currentText() == "Off" and controller.drafter is None and controller.draft == ""
    moved = offered[1].replace("Pane B", "Pane A")
    assert pane_drafts(view)[0] == moved
    # A pane unloaded is no longer offered, and a choice of it falls back to Off.
    view.speed.setCurrentIndex(speed_choices(view).index(f"Pane B's checkpoint ({ckpts['b10'][0].name}@10)"))
    assert controller.drafter is controller.panes[1]
    controller.unload(1)
    assert view.speed.currentText() == "Off" and controller.drafter is None
    assert pane_drafts(view) == [moved]


def test_a_draft_checkpoint_cut_short_after_it_was_picked_fails_in_one_line_and_the_drafter_answers(
    qtbot, controller, view, ckpts, tmp_path
):
    controller.settings.set("draft_k", 3)
    base = shutil.copytree(ckpts["a10"][0].parents[1], tmp_path / "base")
    a = base / ckpts["a10"][0].relative_to(ckpts["a10"][0].parents[1])
    load(qtbot, controller, (a, 10), (a, 20))
    view.speed.setCurrentIndex(speed_choices(view).index(f"Pane A's checkpoint ({a.name}@10)"))
    weights = a / "model_000010.pt"
    weights.write_bytes(weights.read_bytes()[:4096])  # the file A loaded is cut short on disk
    run(qtbot, controller, {"temperature": 0.8, "top_k": 0, "max_tokens": 16, "seed": 7})
    drafter, target = (p.run for p in controller.panes)
    assert not drafter.error and drafter.trace.ids  # A answers from the weights it holds
    line = view.panes[1].stats.text()
    assert target.error and line.startswith("⚠") and "\n" not in line
    assert "model_000010.pt" in line and "Traceback" not in line


HF_NANOCHAT = GOLDEN / "transformers" / "nanochat"


def test_a_checkpoint_of_another_family_is_offered_but_a_pane_that_cannot_read_it_answers_plainly(
    qtbot, controller, view, ckpts
):
    """A nanochat checkpoint beside transformers' NanoChat port (written by transformers): each is
    offered as a draft, a Hugging Face folder by its name alone (it has no steps), and the other
    pane, whose loader cannot read it, answers plainly and says why."""
    controller.settings.set("draft_k", 3)
    load(qtbot, controller, ckpts["a10"], (HF_NANOCHAT, 0))
    a_name = ckpts["a10"][0].name
    offered = pane_drafts(view)
    assert offered == [f"Pane A's checkpoint ({a_name}@10)", f"Pane B's checkpoint ({HF_NANOCHAT.name})"]
    plain = "Not every pane decodes speculatively"
    reasons = (
        (1, "a Hugging Face model drafts only with a Hugging Face checkpoint, not a nanochat one"),
        (0, "a nanochat model drafts only with a nanochat checkpoint, not a Hugging Face one"),
    )
    for drafter, (index, reason) in enumerate(reasons):
        view.speed.setCurrentIndex(speed_choices(view).index(offered[drafter]))
        with qtbot.waitSignal(
            controller.notice, check_params_cb=lambda _level, title, _msg: title == plain
        ) as said:
            run(qtbot, controller, {"temperature": 0.0, "top_k": 0, "max_tokens": 8, "seed": 7})
        assert said.args[2] == "; ".join(
            sorted([f"pane {'AB'[drafter]}: it is the draft", f"pane {'AB'[index]}: {reason}"])
        )
        for pane in controller.panes:
            assert not pane.run.error and pane.run.tokens and "draft" not in pane.run.stats
        assert "speculative" not in view.panes[index].stats.text()


KF_RUN = GOLDEN / "kempnerforge" / "dense-gqa-qknorm" / "run"


def test_a_kempnerforge_step_drafts_for_a_later_step_of_its_run_and_greedy_is_unchanged(
    qtbot, controller, view
):
    """Two steps of a run KempnerForge's own code wrote: step 120's checkpoint, named with its step,
    drafts for step 240, whose greedy reply is then the one it gives plainly."""
    controller.settings.set("draft_k", 3)
    load(qtbot, controller, (KF_RUN, 120), (KF_RUN, 240))
    offered = pane_drafts(view)
    assert offered == ["Pane A's checkpoint (run@120)", "Pane B's checkpoint (run@240)"]
    view.speed.setCurrentIndex(speed_choices(view).index(offered[0]))
    greedy = {"temperature": 0.0, "top_k": 0, "max_tokens": 16, "seed": 7}
    run(qtbot, controller, greedy)
    drafted = controller.panes[1].run
    assert not drafted.error and drafted.stats["draft"] == f"{KF_RUN}@120" and drafted.stats["drafted"] > 0
    assert "speculative (run@120)" in view.panes[1].stats.text()
    view.speed.setCurrentIndex(view.speed.findData(""))
    run(qtbot, controller, greedy)
    plain = controller.panes[1].run
    assert "draft" not in plain.stats and plain.tokens == drafted.tokens
