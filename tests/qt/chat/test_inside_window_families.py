"""Inside the model at a reply's token through the real window, for the other families (issue #45):
a Hugging Face folder transformers' ``save_pretrained`` wrote and a KempnerForge run its own code
trained (tests/golden/), each opened as a user does (File › Open folder…). Send, open the raw
tokens, click a reply token, then Inside: the lens's last layer is the reply's own probability and
the readout is the family's; pick a layer and a head, hover an earlier token, click it to move
there; restart: the same token's Inside view opens again from history, without the model."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.golden import GOLDEN, manifest
from support.window import WAIT, action, open_folder, open_window, send
from test_inside_window import open_and_check, open_inside, pick_hover_and_move, reopen

from desktop.engine.inside import InsideCache

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]
LONG = 60000

HF = GOLDEN / "transformers" / "llama-bf16"
KF = GOLDEN / "kempnerforge" / "dense-gqa-qknorm"
# (folder the user opens, its golden case, how the family's readout begins)
CASES = {
    "hf-llama": (HF, HF, "the residual stream each layer returns"),
    "kempnerforge": (
        KF / "run",
        KF,
        "the residual stream each block returns, read out through the final RMSNorm",
    ),
}


def prompt_of(case: Path) -> str:
    """A prompt the golden model was trained on (the chat one for a Hugging Face folder)."""
    m = manifest(case)
    expected = m["expected"]
    if isinstance(expected, dict):  # KempnerForge: per step
        return expected[str(m["latest"])][0]["text"]
    return next(c for c in expected if c["chat"])["text"]


@pytest.mark.parametrize("name", list(CASES))
def test_inside_a_reply_token_of_another_family_then_an_earlier_one_then_after_a_restart(
    qtbot, windows, loop, monkeypatch, name
):
    folder, case, readout = CASES[name]
    win = open_window(qtbot, fake=False)
    windows.append(win)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=LONG) as loaded:
        open_folder(qtbot, win, folder, monkeypatch)
    info = loaded.args[0]
    if name == "kempnerforge":
        assert info.family == "kempnerforge" and info.step == manifest(case)["latest"]
    else:
        assert info.family.startswith("hf") and Path(info.path) == case
    win.sampling.set_values({**win.sampling.values(), "temperature": 0.0, "max_tokens": 12})
    send(qtbot, win, prompt_of(case))
    action(win, "Raw tokens").trigger()
    reply = win.controller.path[-1][1]
    i = 3
    events = reply.tokens.events(len(reply.tokens))
    assert len(events) > i and not any(ev.continues for ev in events[: i + 1])
    assert reply.tokens.logprobs[i] is not None

    # Click a reply token, then Inside: the view at the position that predicted it, its last
    # layer the model's own distribution; the readout is this family's.
    source, position, view = open_and_check(qtbot, win, reply, i)
    inside = view.inside
    assert inside.family == info.family and inside.exact
    assert inside.readout.startswith(readout)
    assert view.readout.text() == f"Read out: {inside.readout}"
    assert view.note.text().startswith(f"{inside.kind} · ") and inside.family in inside.kind

    # Pick a layer and a head, hover an earlier token, click it to move there.
    j = pick_hover_and_move(qtbot, view, source)

    # Both positions are kept with the reply in history.
    conv_id, reply_id = win.controller.conv_id, win.controller.path[-1][0]
    stored = dict(win.controller.store.active_path(conv_id))[reply_id].meta["inside"]
    assert {p for p, _ in InsideCache.saved(stored)} >= {position, j}

    # Restart (no model loaded this time): the same token's Inside opens from history.
    win = reopen(qtbot, windows, conv_id, load=False)
    assert win.controller.model_info is None
    with qtbot.waitSignal(win.controller.inside.inside_ready, timeout=WAIT) as again:
        open_inside(qtbot, win, i)
    assert again.args[1] == position
    view = win.chat_page.inside_view
    assert view is not None and view.isVisible() and view.position == position
    assert view.inside.family == inside.family and view.inside.readout == inside.readout
    assert view.inside.produced == inside.produced
    assert view.inside.lens[-1].produced_prob == pytest.approx(inside.lens[-1].produced_prob)
    assert [x.produced_rank for x in view.inside.lens] == [x.produced_rank for x in inside.lens]
    assert view.inside.attention == inside.attention  # kept packed, bit for bit
