"""``nanoscope export MODEL --hf OUT``: nanochat checkpoints as transformers NanoChat folders.

Each export is loaded back by transformers itself and by Nanoscope's HF backend; logits, greedy
ids, tokenizer encodings and chat ids are compared with the source checkpoint's.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from support.backend_helpers import reply_ids
from support.checkpoint_factory import _rewrite, write_checkpoint
from support.golden import GOLDEN
from support.hf_factory import load_reference, reference_greedy

from desktop.cli.main import main
from desktop.engine.backend import LoadOptions
from desktop.engine.chat_template import message_dicts
from desktop.engine.errors import CheckpointError, NanoscopeError, UnsupportedFormatError
from desktop.engine.export import hf_export as export_hf
from desktop.engine.export.hf_export import SAMPLE_CONVERSATION, export_to_hf
from desktop.engine.hf.tokenizer_convert import SAMPLE_TEXTS
from desktop.engine.messages import Message
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.nanochat.chat_format import render_for_completion
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

# nanochat rounds E0-E5 rotary tables to bf16; the port computes them in float32. On these tiny
# random models that moves logits by well under this (measured: 7e-3 on E0); documented in
# docs/FORMATS.md.
SOURCE_TOLERANCE = 0.05


def export(capsys, checkpoint: Path, out: Path) -> dict:
    capsys.readouterr()
    code = main(["export", str(checkpoint), "--hf", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def e0(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("e0")
    return base, write_checkpoint(base, "E0", phase="chatsft")


def test_export_round_trips_exactly(e0, tmp_path, capsys):
    base, checkpoint = e0
    out = tmp_path / "hf"
    report = export(capsys, checkpoint, out)
    # float32 and rms_norm_eps = float32's eps: the port computes the same numbers.
    assert report["max_diff_exact"] == 0.0
    assert report["max_diff_transformers"] == 0.0
    assert report["max_diff_source"] < SOURCE_TOLERANCE
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]

    model, tokenizer = load_reference(out)
    source = NanochatBackend.open(checkpoint, LoadOptions(device="cpu", dtype="float32", base_dir=base))
    exported = open_backend(out, LoadOptions(device="cpu"))
    # The tokenizer encodes as tokenizer.pkl does, in transformers and in Nanoscope.
    for text in SAMPLE_TEXTS:
        assert tokenizer.encode(
            text, add_special_tokens=False, split_special_tokens=True
        ) == source.tok.encode(text)
    # The chat template gives nanochat's own chat ids, calculator parts included.
    expected = render_for_completion(source.tok, list(SAMPLE_CONVERSATION), None).ids
    rendered = tokenizer.apply_chat_template(
        message_dicts(SAMPLE_CONVERSATION), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert list(rendered) == expected == list(exported.render(list(SAMPLE_CONVERSATION), None).ids)
    # Logits: transformers and the HF backend agree with the source within the recorded tolerance.
    prompt = source.render([Message.of_text("user", "What is 12 times 7?")], None)
    ids = torch.tensor([list(prompt.ids)])
    with torch.no_grad():
        reference = model(ids).logits.float()
    torch.testing.assert_close(exported.model(ids), reference, rtol=0, atol=0)
    assert float((reference - source.model(ids)).abs().max()) < SOURCE_TOLERANCE
    # Greedy ids: the HF backend's equal transformers' generate on the export.
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    assert reply_ids(exported, prompt, greedy) == reference_greedy(model, list(prompt.ids), 16)
    config = json.loads((out / "config.json").read_text())
    assert config["rms_norm_eps"] == torch.finfo(torch.float32).eps
    assert config["architectures"] == ["NanoChatForCausalLM"]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [
        tokenizer.convert_tokens_to_ids("<|assistant_end|>"),
        tokenizer.convert_tokens_to_ids("<|bos|>"),
    ]


def test_identity_lambdas_with_full_attention_export(tmp_path, capsys):
    """E2 with window pattern L and resid/x0 lambdas still 1/0 is an E0 model in E2 clothes."""
    checkpoint = write_checkpoint(
        tmp_path, "E2", phase="base", meta_overrides={"model_config": {"window_pattern": "L"}}
    )

    def identity(sd):
        sd["resid_lambdas"].fill_(1.0)
        sd["x0_lambdas"].fill_(0.0)

    _rewrite(checkpoint, identity)
    report = export(capsys, checkpoint, tmp_path / "hf")
    assert (
        report["era"] == "E2" and report["max_diff_exact"] == 0.0 and report["max_diff_transformers"] == 0.0
    )


@pytest.mark.parametrize(
    ("era", "reason"),
    [
        ("E1", "trained residual lambdas"),
        ("E2", "sliding-window attention"),
        ("E3", "value embeddings"),
        ("E4", "bigram"),
        ("E6", "q/k gain"),
        ("E7", "smear and backout"),
        ("fork", "fork checkpoint"),
    ],
)
def test_eras_the_port_cannot_represent_are_refused(tmp_path, era, reason):
    checkpoint = write_checkpoint(tmp_path, era, phase="base")
    out = tmp_path / "hf"
    with pytest.raises(UnsupportedFormatError) as info:
        export_to_hf(checkpoint, out, LoadOptions(base_dir=tmp_path))
    assert reason in str(info.value) and "\n" not in str(info.value)
    assert not out.exists()


def test_cli_refusal_is_one_line(tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path, "E7", phase="base")
    capsys.readouterr()
    assert main(["export", str(checkpoint), "--hf", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "smear and backout" in err


def test_a_non_empty_output_folder_is_refused(e0, tmp_path):
    base, checkpoint = e0
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(Exception, match="not an empty folder"):
        export_to_hf(checkpoint, out, LoadOptions(base_dir=base))
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("make_out", "says"),
    [
        (lambda tmp: _dangling(tmp), "a link to nothing"),
        (lambda tmp: _below_a_file(tmp), "cannot write the export here"),
        (lambda tmp: Path("/proc/nanoscope-export"), "cannot write the export here"),
    ],
    ids=["dangling-link", "below-a-file", "proc"],
)
def test_an_unusable_output_is_refused_before_the_checkpoint_is_read(tmp_path, capsys, make_out, says):
    out = make_out(tmp_path)
    empty = tmp_path / "no-checkpoint-here"  # OUT is checked first: loading this would fail second
    empty.mkdir()
    assert main(["export", str(empty), "--hf", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"nanoscope: error: {out}: {says}")
    assert "unexpected" not in err


def _dangling(tmp: Path) -> Path:
    (tmp / "link").symlink_to(tmp / "nowhere")
    return tmp / "link"


def _below_a_file(tmp: Path) -> Path:
    (tmp / "file").write_text("")
    return tmp / "file" / "out"


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_check_leaves_nothing_behind(e0, tmp_path, monkeypatch, existing):
    base, checkpoint = e0
    out = tmp_path / "hf"
    if existing:
        out.mkdir()
    monkeypatch.setattr(export_hf, "EXACT_TOLERANCE", -1.0)  # every comparison now fails
    with pytest.raises(CheckpointError, match="logits differ"):
        export_to_hf(checkpoint, out, LoadOptions(base_dir=base))
    assert (out.is_dir() and not any(out.iterdir())) if existing else not out.exists()


def test_cli_text_output_states_the_differences(e0, tmp_path, capsys):
    _base, checkpoint = e0
    capsys.readouterr()
    assert main(["export", str(checkpoint), "--hf", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and "Max logit difference" in out and "transformers 0.00e+00" in out


# ---------------------------------------------------------------------------------------------------
# File › Export to Hugging Face… in the window


@pytest.fixture
def window(qtbot):
    from desktop.qt.app.app import build, shutdown

    win = build()
    qtbot.addWidget(win)
    win.show()
    yield win
    shutdown(win)


def _start_export(window, monkeypatch, checkpoint: Path, out: Path) -> None:
    """Pick ``checkpoint`` (its latest step), then File › Export to Hugging Face… into ``out``."""
    from PySide6.QtGui import QAction
    from PySide6.QtWidgets import QFileDialog

    from desktop.engine.discovery import CheckpointEntry
    from desktop.engine.nanochat.checkpoint import model_steps

    steps = model_steps(checkpoint)
    window.picker.set_entries([CheckpointEntry("folder", checkpoint.name, checkpoint, steps)])
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *_args, **_kw: str(out))
    next(a for a in window.findChildren(QAction) if a.text() == "Export to Hugging Face…").trigger()


def _export_from_menu(qtbot, window, monkeypatch, checkpoint: Path, out: Path) -> tuple[str, str, str]:
    with qtbot.waitSignal(window.hf_export.done, timeout=120000) as done:
        _start_export(window, monkeypatch, checkpoint, out)
    return tuple(done.args)


@pytest.mark.gui
def test_menu_export_runs_off_the_gui_thread_and_reports_in_the_banner(
    qtbot, window, e0, tmp_path, monkeypatch
):
    _base, checkpoint = e0
    out = tmp_path / "from-menu"
    level, title, message = _export_from_menu(qtbot, window, monkeypatch, checkpoint, out)
    assert (level, title) == ("info", "Export to Hugging Face") and "Max logit difference" in message
    assert window.banner.message.text() == message and (out / "model.safetensors").is_file()


@pytest.mark.gui
def test_menu_export_refusal_shows_the_reason(qtbot, window, tmp_path, monkeypatch):
    checkpoint = write_checkpoint(tmp_path, "E7", phase="base")
    level, _title, message = _export_from_menu(qtbot, window, monkeypatch, checkpoint, tmp_path / "out")
    assert level == "error" and "smear and backout" in message and "\n" not in message
    assert window.banner.level == "error"


def test_a_stopped_export_keeps_nothing_of_what_it_wrote(tmp_path):
    """Stop (quitting the app) while the weights are written: the export ends at its next stage,
    and the folder it made goes, with the files it had written."""
    case = GOLDEN / "nanochat" / "E0"
    out, cancel, stages = tmp_path / "hf", threading.Event(), []

    def progress(_percent: int, stage: str) -> None:
        stages.append(stage)
        if stage == "Writing safetensors":
            cancel.set()

    with pytest.raises(NanoscopeError, match="stopped"):
        export_to_hf(case / "chatsft_checkpoints" / "d2", out, LoadOptions(base_dir=case), progress, cancel)
    assert stages[-1] == "Writing safetensors" and not out.exists()


@pytest.mark.gui
def test_quitting_mid_export_stops_it_and_keeps_nothing(qtbot, tmp_path, monkeypatch):
    """File › Export to Hugging Face…, then quit at once: the export's thread has ended when the
    window has closed (a daemon thread left in torch code aborts the interpreter's exit), and the
    new folder is gone."""
    from desktop.qt.app.app import build, shutdown

    win = build()
    qtbot.addWidget(win)
    win.show()
    case, out = GOLDEN / "nanochat" / "E0", tmp_path / "quit-mid-export"
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(case))
    _start_export(win, monkeypatch, case / "chatsft_checkpoints" / "d2", out)
    assert win.hf_export.running()
    shutdown(win)
    assert not win.hf_export.running() and not out.exists()
