"""The Compare session without Qt: checkpoints opened into panes, their load states, one round of
replies token by token (divergence and diff), saving, reopening from history and coming back
after a restart. Plain pytest: the session is driven the way the Qt controller drives it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.config.settings import SCHEMA_VERSION, Settings
from desktop.engine.backend import ModelInfo
from desktop.engine.messages import TokenEvent
from desktop.engine.params import SamplingParams
from desktop.session.compare.analysis import MAX_PANES, MIN_PANES
from desktop.session.compare.panes import NOT_LOADED, PaneState
from desktop.session.compare.session import CompareSession
from desktop.store import HistoryStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    s = HistoryStore(tmp_path / "history.sqlite3")
    yield s
    s.close()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "chatsft_checkpoints" / "demo"
    folder.mkdir(parents=True)
    return folder


def info_of(path: Path, step: int) -> ModelInfo:
    return ModelInfo(
        family="nanochat",
        path=str(path),
        name=f"sft/{path.name} · step {step:,}",
        source="sft",
        tag=path.name,
        step=step,
        parameters=1000,
        context_length=64,
        device="cpu",
        device_name="CPU",
        precision="float32",
        tokenizer="tok.pkl",
        vocab_size=100,
    )


def recorder(session: CompareSession) -> list[tuple]:
    seen: list[tuple] = []
    for name in session.events.names():
        getattr(session.events, name).connect(lambda *args, name=name: seen.append((name, *args)))
    return seen


def load(session: CompareSession, index: int, path: Path, step: int) -> None:
    """What the controller tells the session while a pane's slot loads ``path`` at ``step``."""
    session.set_loading(index, (path, step), 0, "loading")
    session.set_loaded(index, info_of(path, step))


def stream(session: CompareSession, pane: PaneState, ids: list[int]) -> None:
    for i in ids:
        session.add_token(pane, TokenEvent(i, f"<{i}>", False, "text"))


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def test_open_checkpoints_gives_each_pane_exactly_its_step(store, run_dir):
    session = CompareSession(store)
    seen = recorder(session)
    steps = [300, 1000, 2400]
    used = session.open_checkpoints([(run_dir, s) for s in steps])
    assert used == [0, 1, 2] and len(session.panes) == 3
    assert [p.picked for p in session.panes] == [(run_dir, s) for s in steps]
    assert [p.status for p in session.panes] == ["picked"] * 3
    assert all(p.headline() == NOT_LOADED for p in session.panes)
    assert ("pane_added", 2) in seen
    assert {e[1] for e in seen if e[0] == "pane_changed"} == {0, 1, 2}
    # More than four: the first four; fewer than two: two panes, the first holding the one.
    session.open_checkpoints([(run_dir, s) for s in range(1, 7)])
    assert [p.picked for p in session.panes] == [(run_dir, s) for s in range(1, MAX_PANES + 1)]
    session.open_checkpoints([(str(run_dir), 5)])
    assert len(session.panes) == MIN_PANES and session.panes[0].picked == (run_dir, 5)


def test_a_panes_status_follows_its_load_and_names_the_step_that_answers(store, run_dir):
    session = CompareSession(store)
    pane = session.panes[0]
    session.pick(0, run_dir, 1000)
    session.set_loading(0, (run_dir, 1000), 40, "reading weights")
    assert pane.status == "loading" and not pane.pick_is_loaded
    assert pane.headline() == "Loading step 1,000… reading weights"
    session.set_loaded(0, info_of(run_dir, 1000))
    assert pane.status == "loaded" and pane.pick_is_loaded and pane.headline() == "step 1,000"
    session.pick(0, run_dir, 2400)  # picked, not loaded: the loaded step still answers
    assert pane.status == "switch" and not pane.pick_is_loaded
    assert pane.headline() == "step 1,000 answers · step 2,400 picked: Load to switch"
    session.set_unloaded(0)
    assert pane.status == "picked" and pane.info is None and pane.headline() == NOT_LOADED
    session.set_loading(0, (run_dir, 2400))
    session.set_load_failed(0, "no such file")
    assert pane.status == "failed" and pane.headline() == "⚠ no such file"
    session.pick(0, run_dir, 300)  # a new pick clears the old failure
    assert pane.status == "picked"


def test_a_round_streams_tokens_into_divergence_and_a_diff(store, run_dir):
    session = CompareSession(store)
    seen = recorder(session)
    load(session, 0, run_dir, 1000)
    load(session, 1, run_dir, 2400)
    session.set_diff_pair(0, 1)
    session.begin_round("hello", SamplingParams(temperature=0.8, seed=7))
    a, b = session.panes
    for pane in (a, b):
        session.start_run(pane, SamplingParams(temperature=0.8, seed=7))
    assert session.busy and session.comparable()
    ids_a, ids_b = [5, 6, 7, 8], [5, 6, 9]
    stream(session, a, ids_a)
    stream(session, b, ids_b[:2])
    assert session.divergence is None  # they agree so far
    stream(session, b, ids_b[2:])
    assert session.divergence == first_difference(ids_a, ids_b)
    assert ("divergence_changed", session.divergence) in seen
    assert session.finish_run(a, {"new_tokens": len(ids_a)})
    assert session.diff() is None  # not while a pane replies
    assert session.finish_run(b, {"new_tokens": len(ids_b)})
    assert not session.finish_run(b, {})  # a late second end changes nothing
    assert not session.busy
    pair_a, pair_b, spans = [e[1] for e in seen if e[0] == "diff_changed"][-1]
    assert (pair_a, pair_b) == (0, 1)
    changed_a = {i for s in spans for i in range(s.a_start, s.a_end)}
    changed_b = {i for s in spans for i in range(s.b_start, s.b_end)}
    assert changed_a == set(range(2, len(ids_a)))
    assert changed_b == {2}
    assert a.run.model["step"] == 1000 and b.run.model["step"] == 2400  # who replied
    assert "diverge" in session.divergence_status()


def test_different_seeds_mark_no_divergence(store, run_dir):
    session = CompareSession(store)
    load(session, 0, run_dir, 1)
    load(session, 1, run_dir, 2)
    session.begin_round("hello", SamplingParams(temperature=1.0, seed=1))
    a, b = session.panes
    session.start_run(a, SamplingParams(temperature=1.0, seed=1))
    session.start_run(b, SamplingParams(temperature=1.0, seed=2))
    stream(session, a, [1, 2])
    stream(session, b, [3, 4])
    session.finish_run(a, {})
    session.finish_run(b, {})
    assert not session.comparable() and session.divergence is None
    assert session.divergence_status().startswith("Different seeds")


def answered(store: HistoryStore, run_dir: Path) -> CompareSession:
    session = CompareSession(store)
    load(session, 0, run_dir, 1000)
    load(session, 1, run_dir, 2400)
    session.set_overrides(1, {"temperature": 0.6, "top_k": None})
    session.begin_round("hello", SamplingParams(temperature=0.0, seed=3), "be brief")
    for pane, ids in zip(session.panes, ([1, 2, 3], [1, 2, 4]), strict=True):
        session.start_run(pane, SamplingParams(temperature=0.0, seed=3))
        stream(session, pane, ids)
        session.finish_run(pane, {"new_tokens": len(ids)})
    return session


def test_save_marks_the_result_saved_until_the_next_round(store, run_dir):
    session = answered(store, run_dir)
    seen = recorder(session)
    assert not session.saved
    conv_id = session.save("parallel")
    assert conv_id is not None and session.saved and session.conv_id == conv_id
    assert ("saved", conv_id) in seen
    assert store.conversation_meta(conv_id)["kind"] == "compare"
    session.begin_round("again", SamplingParams())
    assert not session.saved and not session.has_result()
    assert session.save("parallel") is None  # nothing to save


def test_a_saved_comparison_reopens_with_its_replies_picks_and_overrides(store, run_dir):
    first = answered(store, run_dir)
    conv_id = first.save("parallel")
    assert conv_id is not None
    again = CompareSession(store)
    seen = recorder(again)
    assert again.open_comparison(conv_id)
    assert again.prompt == "hello" and again.system_prompt == "be brief" and again.saved
    assert [p.run.tokens for p in again.panes] == [p.run.tokens for p in first.panes]
    assert [p.picked for p in again.panes] == [(run_dir, 1000), (run_dir, 2400)]
    assert [p.info for p in again.panes] == [None, None]  # picked, not loaded
    assert again.panes[1].overrides == {"temperature": 0.6}
    assert again.divergence == first.divergence == 2
    assert ("opened", "hello", again.shared) in seen


def test_the_session_comes_back_after_a_restart(store, run_dir, tmp_path):
    settings_file = tmp_path / "settings.json"
    session = answered(store, run_dir)
    session.add_pane()
    session.pick(2, run_dir, 300)  # picked, never loaded
    settings = Settings(settings_file)
    session.persist(settings, "parallel")  # quit: the unsaved result goes to history
    assert session.saved
    settings.save()

    back = CompareSession(store)
    back.restore(Settings(settings_file))
    assert [p.picked for p in back.panes] == [(run_dir, 1000), (run_dir, 2400), (run_dir, 300)]
    assert back.panes[1].overrides == {"temperature": 0.6}
    assert back.conv_id == session.conv_id and back.prompt == "hello"
    assert [p.run.tokens for p in back.panes[:2]] == [p.run.tokens for p in session.panes[:2]]


def test_quitting_mid_reply_keeps_what_was_said(store, run_dir, tmp_path):
    session = CompareSession(store)
    load(session, 0, run_dir, 1)
    session.begin_round("hello", SamplingParams(temperature=0.0))
    session.start_run(session.panes[0], SamplingParams(temperature=0.0))
    stream(session, session.panes[0], [4, 5])
    settings = Settings(tmp_path / "settings.json")
    session.persist(settings, "parallel")
    assert not session.busy and session.saved
    back = CompareSession(store)
    back.restore(settings)
    assert back.panes[0].run.tokens == [4, 5]
    assert back.panes[0].run.stats["stopped"] == "cancelled"


def test_nothing_to_restore_leaves_two_empty_panes(store, tmp_path):
    settings = Settings(tmp_path / "settings.json")
    CompareSession(store).persist(settings, "parallel")
    back = CompareSession(store)
    back.restore(settings)
    assert len(back.panes) == MIN_PANES and all(p.status == "empty" for p in back.panes)
    assert back.conv_id is None and not back.has_result()
    # A kept conversation and a checkpoint folder that are gone since are left out.
    gone = [{"dir": str(tmp_path / "gone"), "step": 1}]
    settings.set("compare_session", {"panes": gone, "conversation": 999})
    again = CompareSession(store)
    again.restore(settings)
    assert all(p.picked is None for p in again.panes) and again.conv_id is None


def test_a_hand_broken_compare_setting_falls_back_to_the_default_with_a_warning(store, tmp_path):
    settings_file = tmp_path / "settings.json"
    broken = {"panes": [{"dir": 3, "step": "x"}]}
    doc = {"schema_version": SCHEMA_VERSION, "compare_session": broken}
    settings_file.write_text(json.dumps(doc), encoding="utf-8")
    settings = Settings(settings_file)
    assert settings.get("compare_session") == {"panes": [], "conversation": None}
    assert any("compare_session" in w for w in settings.warnings)
    with pytest.raises(ValueError):
        settings.set("compare_session", {"panes": [], "conversation": True})
    back = CompareSession(store)
    back.restore(settings)
    assert len(back.panes) == MIN_PANES and all(p.picked is None for p in back.panes)


def test_each_pane_says_which_draft_it_streams_with_or_why_not_and_keeps_it_saved(store, run_dir):
    """Pane A's checkpoint drafts for the others: A's reply says why it decoded plainly, B's
    names its draft; the engine's own word on a draft that drafted nothing is kept; all of it
    comes back with the saved comparison."""
    session = CompareSession(store)
    load(session, 0, run_dir, 1000)
    load(session, 1, run_dir, 2400)
    session.choose_draft(pane=0)
    session.begin_round("hello", SamplingParams(temperature=0.8, seed=7))
    a, b = session.panes
    for pane in (a, b):
        session.start_run(pane, SamplingParams(temperature=0.8, seed=7))
    plain = "decoded plainly: it is the draft"
    assert "draft" not in a.run.reply.meta and a.run.reply.meta["draft_skipped"] == plain
    assert b.run.reply.meta["draft"] == f"{run_dir}@1000" and "draft_skipped" not in b.run.reply.meta
    stream(session, a, [5, 6])
    stream(session, b, [5, 7])
    not_paying = "demo · step 1,000 not faster on this CPU: drafted nothing"
    session.finish_run(a, {"new_tokens": 2})
    session.finish_run(b, {"new_tokens": 2, "drafted": 0, "draft_skipped": not_paying})
    assert a.run.stats["draft_skipped"] == plain and "draft" not in a.run.stats
    assert b.run.stats["draft"] == f"{run_dir}@1000" and b.run.stats["draft_skipped"] == not_paying
    conv_id = session.save("parallel")
    assert conv_id is not None
    again = CompareSession(store)
    assert again.open_comparison(conv_id)
    assert [p.run.stats for p in again.panes] == [a.run.stats, b.run.stats]
