"""The Run tab through the real window: a user picks a run, sees its saved steps on a timeline,
clicks one to chat with it, and Shift-clicks three to race them in Compare."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from support import REPO
from support.eval_bundle import make_bundle
from support.golden import GOLDEN
from support.window import start_with_base

from desktop.engine.runs.bits_per_byte import bpb_sweep
from desktop.engine.runs.checked_answers import answer_sweep, bundled_problems
from desktop.engine.runs.core_bundle import core_scores, core_sweep, read_examples, read_tasks
from desktop.engine.runs.grading import accuracy, what_flipped
from desktop.engine.runs.multiple_choice import mc_sweep, read_questions
from desktop.engine.runs.report import cell
from desktop.engine.runs.timeline import timeline_of
from desktop.qt.run.view import CORE_LITE

pytestmark = pytest.mark.gui
WAIT = 60000
DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"


def show_run(qtbot, win, folder: Path):
    view = win.run_page.run_view
    win.tabs.setCurrentWidget(win.run_page)
    with qtbot.waitSignal(win.background.timeline_ready, timeout=WAIT):
        view.choose_run(folder)
    return view


def test_a_run_on_its_timeline_opens_a_step_in_chat_and_races_three_in_compare(
    qtbot,
    windows,
    loop,
    monkeypatch,
):
    base = GOLDEN / "nanochat" / "E7"
    win = start_with_base(qtbot, windows, monkeypatch, base, fake=False)
    sft = base / "chatsft_checkpoints" / "d2"
    qtbot.waitUntil(lambda: win.run_page.run_view.runs.count() >= 2, timeout=WAIT)

    view = show_run(qtbot, win, sft)  # the tag's base and SFT stages, one timeline
    want = timeline_of(sft)
    assert [(p.stage, p.step) for p in view.timeline.points] == [(p.stage, p.step) for p in want.points]
    assert "2 saved steps" in view.status.text()
    first = view.timeline.points[0]
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
        view.click_point(first, Qt.KeyboardModifier.NoModifier)
    assert (Path(loaded.args[0].path), loaded.args[0].step) == (first.path, first.step)
    assert win.tabs.currentIndex() == 0 and win.picker.current() == (first.path, first.step)

    view = show_run(qtbot, win, DEMO)
    assert [p.step for p in view.timeline.points] == [p.step for p in timeline_of(DEMO).points]
    assert view.curve.currentText() == "val_bpb"
    for point in view.timeline.points[1:]:
        view.click_point(point, Qt.KeyboardModifier.ShiftModifier)
    assert view.compare_btn.isEnabled() and view.compare_btn.text() == "Compare 3"
    compare = win.compare_view.controller
    qtbot.mouseClick(view.compare_btn, Qt.MouseButton.LeftButton)
    assert win.tabs.currentWidget() is win.compare_view
    wanted = [(DEMO, p.step) for p in view.timeline.points[1:]]
    qtbot.waitUntil(lambda: [p.loaded_key for p in compare.panes[:3]] == wanted, timeout=WAIT)


def test_sample_prompts_fill_a_table_of_steps_and_stop_stops(
    qtbot,
    windows,
    loop,
    monkeypatch,
):
    win = start_with_base(qtbot, windows, monkeypatch, GOLDEN / "nanochat" / "E7", fake=False)
    view = show_run(qtbot, win, DEMO)
    sweep = win.run_page.sample_sweep
    # Every step, then Stop once the first answer is in: the sweep ends early and says nothing wrong.
    first: list = []

    def stop_after_the_first(sample) -> None:
        first.append(sample)
        if len(first) == 1:
            qtbot.mouseClick(view.sample_btn, Qt.MouseButton.LeftButton)  # it reads "Stop sampling"

    sweep.sample.connect(stop_after_the_first)
    with qtbot.waitSignal(sweep.finished, timeout=WAIT) as ended:
        qtbot.mouseClick(view.sample_btn, Qt.MouseButton.LeftButton)
    assert ended.args == [""] and 1 <= len(first) < 7 * len(view.timeline.points)
    assert view.sample_btn.text() == "Sample prompts"
    sweep.sample.disconnect(stop_after_the_first)

    # Two marked steps, to the end: seven prompts down, two steps across, every cell filled.
    for point in (view.timeline.points[0], view.timeline.points[-1]):
        view.click_point(point, Qt.KeyboardModifier.ShiftModifier)
    with qtbot.waitSignal(sweep.finished, timeout=WAIT) as ended:
        qtbot.mouseClick(view.sample_btn, Qt.MouseButton.LeftButton)
    assert ended.args == [""]
    table = view.table
    assert table.isVisible() and (table.rowCount(), table.columnCount()) == (7, 2)
    steps = [f"sft {p.step}" for p in (view.timeline.points[0], view.timeline.points[-1])]
    assert [table.horizontalHeaderItem(i).text() for i in range(2)] == steps
    assert all(table.item(r, c) is not None for r in range(7) for c in range(2))


def test_a_kempnerforge_run_shows_its_logged_loss_opens_a_step_and_races_both(
    qtbot,
    windows,
    loop,
    monkeypatch,
):
    win = start_with_base(qtbot, windows, monkeypatch, GOLDEN / "nanochat" / "E7", fake=False)
    run = next((GOLDEN / "kempnerforge").glob("*/run"))
    view = show_run(qtbot, win, run)
    names = [view.curve.itemText(i) for i in range(view.curve.count())]
    assert "train/loss" in names and "smoothed/loss" in names
    view.curve.setCurrentText("train/loss")
    want = timeline_of(run)
    xs, ys = view.scatter.getData()
    assert list(xs) == [float(p.step) for p in want.points]
    # the loss falls from 5.6 to 0.1: drawn on a log scale, markers on the values the logger wrote
    assert view.plot.getPlotItem().ctrl.logYCheck.isChecked()
    assert [10**y for y in ys] == pytest.approx([want.value_at(p, "train/loss") for p in want.points])
    first = view.timeline.points[0]
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
        view.click_point(first, Qt.KeyboardModifier.NoModifier)
    assert (Path(loaded.args[0].path), loaded.args[0].step) == (run, first.step)

    view = show_run(qtbot, win, run)
    for point in view.timeline.points:
        view.click_point(point, Qt.KeyboardModifier.ShiftModifier)
    qtbot.mouseClick(view.compare_btn, Qt.MouseButton.LeftButton)
    compare = win.compare_view.controller
    wanted = [(run, p.step) for p in view.timeline.points]
    qtbot.waitUntil(lambda: [p.loaded_key for p in compare.panes[:2]] == wanted, timeout=WAIT)


def test_a_report_card_holds_the_curves_every_step_and_what_the_sweep_said(
    qtbot,
    windows,
    loop,
    monkeypatch,
    tmp_path,
):
    win = start_with_base(qtbot, windows, monkeypatch, GOLDEN / "nanochat" / "E7", fake=False)
    view = show_run(qtbot, win, DEMO)
    chosen = view.curve.currentText()
    last = view.timeline.points[-1]
    view.click_point(last, Qt.KeyboardModifier.ShiftModifier)
    with qtbot.waitSignal(win.run_page.sample_sweep.finished, timeout=WAIT):
        qtbot.mouseClick(view.sample_btn, Qt.MouseButton.LeftButton)
    out = tmp_path / "card"
    with qtbot.waitSignal(win.run_page.run_report.finished, timeout=WAIT) as done:
        view.report_to(out)
    assert str(out / "report.md") in done.args[0] and view.report_btn.isEnabled()
    card = (out / "report.md").read_text(encoding="utf-8")
    metrics = [view.curve.itemText(i) for i in range(view.curve.count())]
    for metric in metrics:  # each curve drawn to a PNG the card shows
        assert f"![{metric}]({metric}.png)" in card
        assert (out / f"{metric}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert view.curve.currentText() == chosen  # the user's curve is still the one shown
    digest = hashlib.sha256((DEMO / f"model_{last.step:06d}.pt").read_bytes()).hexdigest()
    assert f"`{digest}`" in card
    assert len(view.session.said) == 7
    for (
        stage,
        step,
        prompt,
        text,
    ) in view.session.said:  # the sweep's answers: prompts down, the marked step across
        assert (stage, step) == (last.stage, last.step)
        assert f"| {cell(prompt)} | {cell(text)} |" in card


QUESTIONS = [
    {"question": "What is 12 times 7?", "choices": ["74", "84", "94"], "answer": 1},
    {"question": "How many e are in elephant?", "choices": ["1", "2", "3", "4"], "answer": "C"},
    {"question": "Is the sky blue?", "choices": ["yes", "no"], "answer": 0},
]


def test_multiple_choice_fills_the_table_draws_a_curve_and_a_flip_opens_compare(
    qtbot,
    windows,
    loop,
    monkeypatch,
    tmp_path,
):
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS) + "not json\n", encoding="utf-8")
    win = start_with_base(qtbot, windows, monkeypatch, GOLDEN / "nanochat" / "E7", fake=False)
    view = show_run(qtbot, win, DEMO)
    points = view.timeline.points[:2]
    for point in points:
        view.click_point(point, Qt.KeyboardModifier.ShiftModifier)
    # what the engine says the same steps answer, asked directly
    questions, _ = read_questions(data)
    answers = list(mc_sweep(points, questions))
    scores = accuracy(answers)
    keys = [(p.stage, p.step) for p in points]
    want = what_flipped(answers, *keys)
    assert want.lost or want.gained  # the demo's steps 300 and 1000 part on this set

    with qtbot.waitSignal(win.run_page.graded_sweep.finished, timeout=WAIT) as ended:
        view.evaluate("mc", data)
    assert ended.args == [""] and view.eval_btn.text() == "Evaluate" and view.eval_btn.menu() is not None
    task = f"multiple choice: {data.name}"
    table = view.evals.table
    assert [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())] == [task]
    assert [table.item(r, 0).text() for r in range(table.rowCount())] == [f"{scores[k]:.1%}" for k in keys]
    view.curve.setCurrentText(task)  # the scores are a curve on the timeline, markers on them
    assert view.timeline.line(task) == [(float(p.x), scores[(p.stage, p.step)]) for p in points]
    flips = view.evals.flips
    assert flips.count() == len(want.lost) + len(want.gained)
    first = flips.item(0)
    line = first.data(Qt.ItemDataRole.UserRole)
    assert line == (list(want.lost) + list(want.gained))[0]

    flips.itemClicked.emit(first)
    assert win.tabs.currentWidget() is win.compare_view
    asked = next(q for q in questions if q.line == line)
    assert win.compare_view.input.editor.toPlainText() == asked.text()
    compare = win.compare_view.controller
    qtbot.waitUntil(
        lambda: [p.loaded_key for p in compare.panes[:2]] == [(DEMO, p.step) for p in points], timeout=WAIT
    )

    # Bits per byte of a text joins the same table as a second task, and the timeline as a curve.
    win.tabs.setCurrentWidget(win.run_page)
    text = tmp_path / "text.txt"
    text.write_text((REPO / "README.md").read_text(encoding="utf-8")[:1500], encoding="utf-8")
    with qtbot.waitSignal(win.run_page.bits_sweep.finished, timeout=WAIT) as ended:
        view.evaluate("bpb", text)
    assert ended.args == [""]
    measured = {
        (r.stage, r.step): r.bits_per_byte for r in bpb_sweep(points, text.read_text(encoding="utf-8"))
    }
    bits = f"bits per byte: {text.name}"
    assert view.session.scores[bits] == pytest.approx(measured)
    column = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())].index(bits)
    assert [table.item(r, column).text() for r in range(2)] == [f"{measured[k]:.4f}" for k in keys]
    assert [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())] == [task, bits]
    xs, ys = zip(*view.timeline.line(bits), strict=True)
    assert list(xs) == [float(p.x) for p in points]
    assert list(ys) == pytest.approx([measured[(p.stage, p.step)] for p in points])

    # The bundled problems, each reply checked: a third column, and what flipped between the steps.
    with qtbot.waitSignal(win.run_page.graded_sweep.finished, timeout=WAIT) as ended:
        view.evaluate("answers", None)
    assert ended.args == [""]
    checked = list(answer_sweep(points, bundled_problems()))
    assert view.session.scores["arithmetic and spelling"] == accuracy(checked)
    flipped = what_flipped(checked, *keys)
    assert view.evals.flips.count() == len(flipped.lost) + len(flipped.gained)

    # Asked again, the same steps are read back from the kept results, with the same scores.
    assert "kept results" not in view.status.text()
    with qtbot.waitSignal(win.run_page.graded_sweep.finished, timeout=WAIT):
        view.evaluate("mc", data)
    assert f"{len(points)} of {len(points)} steps read from kept results" in view.status.text()
    assert view.session.scores[task] == scores


def test_an_experiment_run_shows_its_logged_curves_opens_a_step_and_races_three(
    qtbot,
    windows,
    loop,
    monkeypatch,
):
    """nanochat's experiment layout (PR #800), the golden experiment its branch wrote: the Run tab
    lists its tag, draws the stage logs' val_bpb with the saved steps on it, and says its commit."""
    from support.golden import EXPERIMENT_CASES, manifest

    case = EXPERIMENT_CASES[0]
    m = manifest(case)
    win = start_with_base(qtbot, windows, monkeypatch, case, fake=False)
    tag = f"{m['experiment']}/{m['tag']}"
    qtbot.waitUntil(lambda: win.run_page.run_view.runs.findText(tag) >= 0, timeout=WAIT)
    folder = win.run_page.run_view.runs.itemData(win.run_page.run_view.runs.findText(tag))

    view = show_run(qtbot, win, folder)
    want = timeline_of(folder)
    assert [(p.stage, p.step) for p in view.timeline.points] == [(p.stage, p.step) for p in want.points]
    assert view.curve.currentText() == "val_bpb"
    drawn = view.plot.listDataItems()[0]  # the curve, then the saved steps' markers
    assert list(zip(drawn.xData, drawn.yData, strict=True)) == want.line("val_bpb")
    assert len(drawn.xData) > len(want.points)  # the logs' evaluations between the saves
    assert f"commit {m['commit'][:7]}" in view.status.text()

    first = view.timeline.points[0]
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT) as loaded:
        view.click_point(first, Qt.KeyboardModifier.NoModifier)
    assert (Path(loaded.args[0].path), loaded.args[0].step) == (first.path, first.step)
    assert win.tabs.currentIndex() == 0 and win.picker.current() == (first.path, first.step)

    win.tabs.setCurrentWidget(win.run_page)
    for point in view.timeline.points:
        view.click_point(point, Qt.KeyboardModifier.ShiftModifier)
    assert view.compare_btn.text() == "Compare 3"
    compare = win.compare_view.controller
    qtbot.mouseClick(view.compare_btn, Qt.MouseButton.LeftButton)
    assert win.tabs.currentWidget() is win.compare_view
    wanted = [(p.path, p.step) for p in view.timeline.points]
    qtbot.waitUntil(lambda: [p.loaded_key for p in compare.panes[:3]] == wanted, timeout=WAIT)


def test_core_on_the_base_dirs_eval_bundle_fills_the_table_and_a_curve_and_is_kept(
    qtbot,
    windows,
    loop,
    monkeypatch,
    tmp_path,
):
    """Evaluate › CORE: nanochat's eval_bundle (in its layout) under $NANOCHAT_BASE_DIR, scored
    on two marked demo steps as the engine scores it directly; asked again, read back."""
    base = tmp_path / "base"
    shutil.copytree(DEMO.parent.parent, base)  # the demo's base dir, with an eval_bundle beside it
    bundle = make_bundle(base)
    win = start_with_base(qtbot, windows, monkeypatch, base, fake=False)
    run = base / "chatsft_checkpoints" / "demo"
    view = show_run(qtbot, win, run)
    points = view.timeline.points[:2]
    for point in points:
        view.click_point(point, Qt.KeyboardModifier.ShiftModifier)
    tasks, _ = read_tasks(bundle)
    lite = CORE_LITE
    answers = [a for task in tasks for a in core_sweep(points, task, read_examples(task, lite)[0])]
    want = core_scores(answers, tasks)
    assert len(want) == 2

    with qtbot.waitSignal(win.run_page.core_sweep.finished, timeout=WAIT) as ended:
        core_action(view).trigger()
    assert ended.args == [""]
    title = f"CORE (lite {lite})"
    assert view.session.scores[title] == pytest.approx(want)
    table = view.evals.table
    headers = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    column = headers.index(title)
    # CORE reads as nanochat prints it: a number, not a share.
    assert [table.item(r, column).text() for r in range(2)] == [
        f"{want[(p.stage, p.step)]:.4f}" for p in points
    ]
    xs, ys = zip(*view.timeline.line(title), strict=True)
    assert list(xs) == [float(p.x) for p in points]
    assert list(ys) == pytest.approx([want[(p.stage, p.step)] for p in points])

    with qtbot.waitSignal(win.run_page.core_sweep.finished, timeout=WAIT):
        core_action(view).trigger()
    assert f"{len(points)} of {len(points)} steps read from kept results" in view.status.text()
    assert view.session.scores[title] == pytest.approx(want)


def test_core_without_an_eval_bundle_says_where_it_looked(
    qtbot,
    windows,
    loop,
    monkeypatch,
    tmp_path,
):
    win = start_with_base(qtbot, windows, monkeypatch, GOLDEN / "nanochat" / "E7", fake=False)
    view = show_run(qtbot, win, DEMO)
    with qtbot.waitSignal(win.run_page.core_sweep.finished, timeout=WAIT) as ended:
        core_action(view).trigger()
    assert "no eval_bundle (core.yaml)" in ended.args[0] and "eval_bundle" in view.status.text()
    assert view.eval_btn.text() == "Evaluate"


def core_action(view):
    return next(a for a in view.eval_menu.actions() if a.text().startswith("CORE, lite"))
