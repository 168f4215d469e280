"""The Inside view widget (issue #45) over a golden nanochat model's numbers: the lens table and
strip, the head grid and the tokens shaded by a head's weights, the attribution, and a position
kept in history shown again without the model."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication
from support.golden import GOLDEN, manifest

from desktop.engine.backend import LoadOptions
from desktop.engine.inside import inspect_all
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.qt.widgets.inside_view import InsideView
from desktop.session.conversation import ReplyInside

pytestmark = pytest.mark.gui
CASE = GOLDEN / "nanochat" / "E7"


@pytest.fixture(scope="module")
def source():
    m = manifest(CASE)
    backend = NanochatBackend.open(
        CASE / "chatsft_checkpoints" / m["tag"], LoadOptions(step=m["step"], device="cpu", base_dir=CASE)
    )
    ids = [*m["cases"][1]["prompt_ids"], *(7 * i + 3 for i in range(10))]  # a prompt, then a "reply"
    cache = inspect_all(backend, ids)
    cache.reply_start = 16
    cache.labels = [backend.token_label(i) for i in range(backend.model.config.vocab_size)]
    backend.close()
    return cache


def test_the_view_shows_a_positions_lens_attention_and_attribution(qtbot, source):
    reply = ReplyInside.of_cache(source)
    view = InsideView(reply, 20)
    qtbot.addWidget(view)
    view.show()
    inside = source.at(20)
    assert view.lens.rowCount() == source.n_layer
    last = inside.lens[-1]
    assert view.lens.item(source.n_layer - 1, 7).text() == f"{last.produced_prob:.4f}"
    assert view.strip.probs == [x.produced_prob for x in inside.lens]
    assert "Read out:" in view.readout.text() and "exact" in view.note.text()
    view.grid.picked.emit(1, 1)
    view.pick(1, 1)
    assert view.weight(3) == inside.attention[1][1][3]
    qtbot.mouseMove(view.tokens, view.tokens.chip(3).center())
    qtbot.waitUntil(lambda: f"{inside.attention[1][1][3]:.4f}" in view.tokens.toolTip())
    with qtbot.waitSignal(view.position_changed) as moved:
        qtbot.mouseClick(view.tokens, Qt.MouseButton.LeftButton, pos=view.tokens.chip(3).center())
    assert moved.args == [3] and view.inside.position == 3 and (view.layer, view.head) == (1, 1)
    a = view.inside.attribution
    assert view.attribution.rowCount() == len(a.terms)
    assert "residual" in view.residual.text() and view.attribution.isColumnHidden(2)
    view.heads_btn.click()
    assert not view.attribution.isColumnHidden(2)
    assert any(view.attribution.item(r, 2).text().startswith("h0") for r in range(len(a.terms)))


def test_kept_positions_open_without_the_model_and_others_say_so(qtbot, source):
    reply = ReplyInside.of_cache(source)
    reply.at(20)
    kept = ReplyInside.of_meta(json.loads(json.dumps(reply.to_meta())))
    assert kept is not None and kept.live is None
    view = InsideView(kept, 20)
    qtbot.addWidget(view)
    assert view.inside == source.at(20)
    assert view.tokens.labels[:20] == [view._label(t) for t in source.ids[:20]]
    assert not view.show_position(5)
    assert "not computed" in view.missing.text() and view.content.isHidden()


def test_approximate_numbers_say_so_and_a_theme_switch_redraws(qtbot, source):
    from dataclasses import replace

    from desktop.qt.widgets import palette, theme

    reply = ReplyInside.of_cache(source)
    exact = reply.at(20)
    fast = replace(exact, exact=False, note="fast (16-bit) mode: the numbers are approximate")
    reply.saved[(20, exact.produced)] = fast
    view = InsideView(reply, 20)
    qtbot.addWidget(view)
    assert "approximate: fast (16-bit) mode" in view.note.text() and view.note.isVisibleTo(view)
    before = view.attribution.item(0, 1).foreground().color().name()
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    theme.apply_theme(app, "dark")
    try:
        qtbot.waitUntil(lambda: view.attribution.item(0, 1).foreground().color().name() != before)
        want = palette.DARK.success if exact.attribution.terms[0].value >= 0 else palette.DARK.error
        assert view.attribution.item(0, 1).foreground().color().name() == QColor(want).name()
    finally:
        theme.apply_theme(app, "light")
