"""A run training beside the open window: nanochat's own base_train and KempnerForge's own
train.py (tests/upstream/, run as subprocesses by support/live_training.py) save steps while the
real window watches. Each new step appears in the picker and the Run tab within 10 s of its save
ending, no half-written file is ever offered, no error banner shows, a chat that follows the run
answers from the newest step, and a writer killed mid-save leaves its step shown as incomplete."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support.live_training import (
    kf_checkpoints,
    nanochat_checkpoints,
    start_kf_training,
    start_nanochat_training,
)
from support.window import WAIT, restart, send, start_with_base

from desktop.engine.runs.saving import INCOMPLETE, SAVED, SaveWatch
from desktop.engine.runs.timeline import RunReader
from desktop.qt.app.main_window import MainWindow
from desktop.qt.widgets.checkpoint_picker import FOLLOW

pytestmark = pytest.mark.slow
APPEARS_MS = 10_000  # a step is in the picker and the Run tab this soon after its save ended


class Witness:
    """Everything the window says while the run trains: every list the scans report (each
    listed step's files checked whole at that moment) and every notice."""

    def __init__(self, win: MainWindow, folder: Path, family: str) -> None:
        self.folder, self.family = folder, family
        self.half_written: list[tuple[int, str]] = []
        self.notices: list[tuple[str, str, str]] = []
        win.background.checkpoints_found.connect(self._listed)
        for source in (win.controller.notice, win.chat_page.notice):
            source.connect(lambda *args: self.notices.append(args))

    def _listed(self, entries: list) -> None:
        for entry in entries:
            if Path(entry.path) == self.folder:
                # A fresh watch reads the files as they are now: a listed step must be whole.
                fresh = SaveWatch()
                states = (
                    fresh.nanochat(self.folder)
                    if self.family == "nanochat"
                    else fresh.kempnerforge(self.folder)
                )
                whole = {s.step for s in states if s.state == SAVED}
                self.half_written += [
                    (step, "listed before whole") for step in entry.steps if step not in whole
                ]

    def errors(self) -> list[tuple[str, str, str]]:
        return [n for n in self.notices if n[0] == "error"]


def steps_listed(win: MainWindow, folder: Path) -> list[int]:
    entry = next((e for e in win.picker.entries if Path(e.path) == folder), None)
    return list(entry.steps) if entry is not None else []


def run_tab_steps(win: MainWindow) -> list[int]:
    timeline = win.run_page.session.timeline
    return [p.step for p in timeline.points] if timeline is not None else []


def follow_latest(qtbot, win: MainWindow, folder: Path) -> None:
    """The user picks "Latest (follows)" in the Step list and presses Load."""
    assert win.picker.select(folder, FOLLOW) and win.picker.following()
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        qtbot.mouseClick(win.picker.load_btn, Qt.MouseButton.LeftButton)


def choose_run(qtbot, win: MainWindow, folder: Path) -> None:
    win.tabs.setCurrentWidget(win.run_page)
    view = win.run_page.run_view
    view.choose_run(folder)
    qtbot.waitUntil(
        lambda: bool(run_tab_steps(win)) and not view.status.text().startswith("Reading"), timeout=WAIT
    )
    win.tabs.setCurrentIndex(0)


def lands(qtbot, win: MainWindow, run, folder: Path, step: int) -> None:
    """Let the writer save ``step``; it is in the picker and the Run tab within APPEARS_MS."""
    run.allow(step)
    run.wait_saved(step)  # the runner marks it once save_checkpoint (or DCP's finish) returned
    saved = time.monotonic()
    qtbot.waitUntil(
        lambda: step in steps_listed(win, folder) and step in run_tab_steps(win), timeout=APPEARS_MS
    )
    print(f"step {step} listed {time.monotonic() - saved:.2f} s after its save ended")


def first_step_saved(qtbot, windows, monkeypatch, run) -> tuple[MainWindow, Path]:
    """The run saves step 10, then the app starts on its base dir; the window and the run's folder."""
    run.allow(10)
    run.wait_saved(10)
    win = start_with_base(qtbot, windows, monkeypatch, run.folder, fake=False)
    return win, nanochat_checkpoints(run.folder)


@pytest.fixture
def nanochat_run(tmp_path) -> Iterator:
    run = start_nanochat_training(tmp_path / "base", steps=(10, 20, 30), hold=True)
    yield run
    run.stop()


def test_a_nanochat_run_saving_steps_while_the_window_is_open(
    qtbot, windows, loop, monkeypatch, nanochat_run
):
    run = nanochat_run
    win, folder = first_step_saved(qtbot, windows, monkeypatch, run)
    witness = Witness(win, folder, "nanochat")
    assert win.picker.current() == (folder, 10)
    choose_run(qtbot, win, folder)
    follow_latest(qtbot, win, folder)

    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
        lands(qtbot, win, run, folder, 20)
    assert loaded.args[0].step == 20  # the chat follows: step 20 answers from now on
    assert witness.notices[-1][1] == "base/d2 step 20 saved"
    win.sampling.set_values({"max_tokens": 8})
    send(qtbot, win, "Once upon a time")
    assert win.controller.path[-1][1].meta["step"] == 20

    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        lands(qtbot, win, run, folder, 30)
    send(qtbot, win, "The little dog")
    assert win.controller.path[-1][1].meta["step"] == 30  # the newest step answered
    run.finish()

    assert run_tab_steps(win) == [10, 20, 30]
    assert [win.picker.step.itemData(i) for i in range(win.picker.step.count())] == [FOLLOW, 30, 20, 10]
    assert witness.half_written == [] and witness.errors() == []
    assert not (win.banner.level == "error" and win.banner.isVisible())
    meta = json.loads((folder / "meta_000030.json").read_text())
    assert meta["step"] == 30

    again = restart(qtbot, windows, fake=False)  # the user quits and starts the app again
    with qtbot.waitSignal(again.controller.model_loaded, timeout=WAIT) as loaded:
        again.start()
    assert loaded.args[0].step == 30 and again.picker.following() and again.controller.following.on


def test_a_nanochat_writer_killed_mid_save_leaves_its_step_incomplete(
    qtbot, windows, loop, monkeypatch, tmp_path
):
    run = start_nanochat_training(tmp_path / "base", steps=(10, 20, 30), kill_mid_save_at=20)
    try:
        run.wait_killed()
    finally:
        run.stop()
    folder = nanochat_checkpoints(run.folder)
    win = start_with_base(qtbot, windows, monkeypatch, run.folder, fake=False)
    witness = Witness(win, folder, "nanochat")
    # Just killed: as far as anyone can tell it is still saving; unchanged for give_up_s, it never will.
    entry = next(e for e in win.picker.entries if Path(e.path) == folder)
    assert entry.steps == [10] and [(s.step, s.reason) for s in entry.unsaved] == [
        (20, "model_000020.pt is cut short")
    ]
    labels = [win.picker.step.itemText(i) for i in range(win.picker.step.count())]
    assert labels == ["Latest (follows)", "step 20 · saving…", "step 10"]
    win.background.saves.give_up_s = 1.0
    win.background.look_again()
    qtbot.waitUntil(lambda: "step 20 · incomplete" in picker_labels(win), timeout=WAIT)
    index = picker_labels(win).index("step 20 · incomplete")
    assert win.picker.step.itemData(index, Qt.ItemDataRole.ToolTipRole) == "model_000020.pt is cut short"
    assert not win.picker.step.model().item(index).isEnabled()  # shown, never opened
    unsaved = next(e for e in win.picker.entries if Path(e.path) == folder).unsaved
    assert [(s.step, s.state) for s in unsaved] == [(20, INCOMPLETE)]
    assert win.controller.model_info.step == 10 and witness.errors() == []
    choose_run(qtbot, win, folder)  # the Run tab says so too
    status = win.run_page.run_view.status.text()
    assert "1 saved steps" in status and "step 20 · incomplete: model_000020.pt is cut short" in status


def picker_labels(win: MainWindow) -> list[str]:
    return [win.picker.step.itemText(i) for i in range(win.picker.step.count())]


def test_a_kempnerforge_run_saving_steps_with_dcp_while_the_window_is_open(
    qtbot, windows, loop, monkeypatch, tmp_path
):
    base = tmp_path / "base"
    run = start_kf_training(base / "kf", steps=(10, 20, 30), hold=True)
    try:
        folder = kf_checkpoints(run.folder)
        run.allow(10)
        run.wait_saved(10)
        win = start_with_base(qtbot, windows, monkeypatch, base, fake=False)
        witness = Witness(win, folder, "kempnerforge")
        follow_latest(qtbot, win, folder)
        assert win.controller.model_info.step == 10 and win.controller.model_info.family == "kempnerforge"
        choose_run(qtbot, win, folder)
        for step in (20, 30):
            with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
                lands(qtbot, win, run, folder, step)
            assert loaded.args[0].step == step
        run.finish()
        win.sampling.set_values({"max_tokens": 8})
        send(qtbot, win, "hello")
        assert win.controller.path[-1][1].meta["step"] == 30
        assert run_tab_steps(win) == [10, 20, 30]
        assert witness.half_written == [] and witness.errors() == []
    finally:
        run.stop()


def test_a_kempnerforge_writer_killed_before_dcp_metadata_leaves_its_step_incomplete(
    qtbot, windows, loop, monkeypatch, tmp_path
):
    base = tmp_path / "base"
    run = start_kf_training(base / "kf", steps=(10, 20, 30), kill_mid_save_at=20)
    try:
        run.wait_killed()
    finally:
        run.stop()
    folder = kf_checkpoints(run.folder)
    win = start_with_base(qtbot, windows, monkeypatch, base, fake=False)
    win.background.saves.give_up_s = 1.0
    win.picker.select(folder, 10)
    win.background.look_again()
    qtbot.waitUntil(lambda: "step 20 · incomplete" in picker_labels(win), timeout=WAIT)
    entry = next(e for e in win.picker.entries if Path(e.path) == folder)
    assert entry.steps == [10]
    assert [(s.step, s.reason) for s in entry.unsaved] == [
        (20, "step_20 has no .metadata yet (DCP writes it last)")
    ]


def test_a_compare_pane_that_follows_answers_from_the_newest_step(
    qtbot, windows, loop, monkeypatch, nanochat_run
):
    run = nanochat_run
    win, folder = first_step_saved(qtbot, windows, monkeypatch, run)
    view, compare = win.compare_view, win.compare
    win.tabs.setCurrentWidget(view)
    pane = view.panes[0]
    pane.checkpoint.setCurrentIndex(pane.checkpoint.findData(str(folder)))
    pane.step.setCurrentIndex(pane.step.findData(FOLLOW))
    with qtbot.waitSignal(compare.pane_loaded, timeout=WAIT):
        qtbot.mouseClick(pane.load_btn, Qt.MouseButton.LeftButton)
    assert compare.panes[0].loaded_key == (folder, 10) and pane.following()
    said: list[tuple[str, str, str]] = []
    compare.notice.connect(lambda *args: said.append(args))
    with qtbot.waitSignal(compare.pane_loaded, timeout=WAIT) as loaded:
        lands(qtbot, win, run, folder, 20)
    assert loaded.args[1].step == 20 and pane.following()  # still "Latest", now step 20
    assert said[0][:2] == ("info", "Pane A: base/d2 step 20 saved") and "follows" in said[0][2]
    view.max_tokens.setValue(6)
    with qtbot.waitSignal(compare.busy_changed, timeout=WAIT, check_params_cb=lambda busy: not busy):
        view.input.editor.setPlainText("Once upon a time")
        qtbot.keyClick(view.input.editor, Qt.Key.Key_Return)
    assert compare.panes[0].run.model["step"] == 20  # the newest step answered
    assert win.controller.model_info.step == 10  # the chat did not ask to follow: it stays


EXPERIMENT = Path(__file__).parents[2] / "golden" / "nanochat-experiment" / "pr800" / "experiments" / "golden"


def test_an_experiments_curves_grow_as_its_log_grows_and_its_stages_land(
    qtbot, windows, loop, monkeypatch, tmp_path
):
    base = tmp_path / "base"
    tag = base / "experiments" / "golden" / "d2"
    shutil.copytree(
        EXPERIMENT, base / "experiments" / "golden", ignore=shutil.ignore_patterns("sft*", "*_000060.*")
    )
    log = (EXPERIMENT / "d2" / "base_train.log").read_text().splitlines(keepends=True)
    (tag / "base_train.log").write_text("".join(log[:37]))  # evaluated up to step 30, its save
    win = start_with_base(qtbot, windows, monkeypatch, base)
    folder = tag / "base"
    choose_run(qtbot, win, folder)
    timeline = win.run_page.session.timeline
    assert [p.step for p in timeline.points] == [30] and len(timeline.line("val_bpb")) == 4

    with open(tag / "base_train.log", "a") as f:  # training goes on: its log grows
        f.write("".join(log[37:60]))
    qtbot.waitUntil(lambda: len(win.run_page.session.timeline.line("val_bpb")) == 6, timeout=APPEARS_MS)
    with open(tag / "base_train.log", "a") as f:
        f.write("".join(log[60:]))
    for name in ("model_000060.pt", "meta_000060.json"):  # save_checkpoint's order
        shutil.copyfile(EXPERIMENT / "d2" / "base" / name, folder / name)
    qtbot.waitUntil(lambda: run_tab_steps(win) == [30, 60], timeout=APPEARS_MS)
    assert len(win.run_page.session.timeline.line("val_bpb")) == 7

    shutil.copytree(EXPERIMENT / "d2" / "sft", tag / "sft")  # the next stage saves
    shutil.copyfile(EXPERIMENT / "d2" / "sft.log", tag / "sft.log")
    qtbot.waitUntil(lambda: run_tab_steps(win) == [30, 60, 150], timeout=APPEARS_MS)
    timeline = win.run_page.session.timeline
    assert [s for _, s in timeline.stages] == ["base", "sft"] and timeline.problems == ()
    assert timeline == RunReader(folder).read()  # what a fresh read of the whole run says


HF = Path(__file__).parents[2] / "golden" / "transformers" / "llama-sharded"


def test_a_hugging_face_folder_appears_once_whole_and_not_while_being_written(
    qtbot, windows, loop, monkeypatch, tmp_path
):
    base = tmp_path / "base"
    base.mkdir()
    win = start_with_base(qtbot, windows, monkeypatch, base)
    target = base / "llama-sharded"
    shutil.copytree(HF, target, ignore=shutil.ignore_patterns("model-00006-*"))
    last = "model-00006-of-00006.safetensors"
    data = (HF / last).read_bytes()
    (target / last).write_bytes(data[: len(data) // 2])  # save_pretrained is writing its last shard
    qtbot.waitUntil(win.background.saves.pending, timeout=WAIT)  # seen, and waited for
    assert all(Path(e.path) != target for e in win.picker.entries)
    (target / last).write_bytes(data)
    qtbot.waitUntil(lambda: any(Path(e.path) == target for e in win.picker.entries), timeout=APPEARS_MS)
