"""A marker's hover text on the Run tab says what the step's files state: stage and step, tokens,
its numbers, its config changes (escaped: a config value is text, never markup) and its size."""

from __future__ import annotations

import json
import math
import shutil

from support import REPO

from desktop.engine.runs.timeline import Point, Timeline, timeline_of
from desktop.qt.run.parts import PlainLogAxis, against_tokens, point_tip

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"


def test_a_markers_hover_text_says_what_the_steps_files_state(tmp_path):
    run = tmp_path / "base_checkpoints" / "d4"
    shutil.copytree(DEMO, run)
    meta = json.loads((run / "meta_002400.json").read_text())
    meta["model_config"]["window_pattern"] = "L<b>"  # a config change, with markup in it
    meta["total_batch_size"] = 1024
    (run / "meta_002400.json").write_text(json.dumps(meta))
    last = timeline_of(run).points[-1]
    tip = point_tip(last)
    assert "base · step 2,400" in tip and f"{2400 * 1024:,} tokens" in tip
    assert f"val_bpb = {meta['val_bpb']:.6g}" in tip
    assert "model_config.window_pattern: SSSL → L&lt;b&gt;" in tip  # escaped, not markup
    assert f"{last.file_bytes / 1e6:.1f} MB" in tip


def test_log_ticks_are_plain_numbers_and_only_1_2_5_between_decades(qapp):
    axis = PlainLogAxis("left")
    values = [math.log10(m * 10.0**e) for e in (-3, -2) for m in range(1, 10)]
    shown = [s for s in axis.logTickStrings(values, 1.0, 1.0) if s]
    assert shown == ["0.001", "0.002", "0.005", "0.01", "0.02", "0.05"]


def test_a_curve_against_tokens_uses_each_stages_tokens_per_step(tmp_path):
    def point(stage: str, step: int, x: int, tokens: int | None) -> Point:
        return Point(stage, step, x, tmp_path, {}, tokens, 0)

    points = (
        point("base", 50, 50, 50_000),
        point("base", 100, 100, 100_000),  # 1,000 tokens a step
        point("sft", 20, 120, 200),  # 10 tokens a step, counted from the stage's start
        point("rl", 5, 205, None),  # no tokens stated: its values have no place
    )
    timeline = Timeline("t", points, stages=((0, "base"), (100, "sft"), (200, "rl")))
    line = [(25.0, 1.0), (110.0, 2.0), (120.0, 3.0), (210.0, 4.0)]
    assert against_tokens(timeline, line) == [(25_000.0, 1.0), (100.0, 2.0), (200.0, 3.0)]
