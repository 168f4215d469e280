"""Naming a draft (``--draft``, ``StreamOptions.draft``), checking its tokenizer by content, the
self-draft sharing the model's tensors, the few-row product the verifying pass uses, and the
command line's flags."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from desktop.cli.main import EXIT_ERROR, main
from desktop.engine.backend import LoadOptions
from desktop.engine.decode.drafts import DraftSpec, check_same_tokenizer, parse_draft
from desktop.engine.errors import NanoscopeError, TokenizerError
from desktop.engine.kernels.gemv import FEW_ROWS, few_rows
from desktop.engine.kernels.tuning import tuner_for
from desktop.engine.nanochat.tokenizer import load_tokenizer
from desktop.engine.registry import open_backend

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "resources" / "demo" / "chatsft_checkpoints" / "demo"
DEMO_TOKENIZER = ROOT / "resources" / "demo" / "tokenizer" / "tokenizer.pkl"
GOLDEN = ROOT / "tests" / "golden"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("int8", DraftSpec("int8", "int8")),
        ("fp16", DraftSpec("fp16", "float16")),
        ("BF16", DraftSpec("BF16", "bfloat16")),
        ("auto", DraftSpec("auto", "auto")),
        ("mtp", DraftSpec("mtp", head=True)),
        ("/runs/d20@300", DraftSpec("/runs/d20@300", "auto", Path("/runs/d20"), 300)),
        ("int8:/runs/d12", DraftSpec("int8:/runs/d12", "int8", Path("/runs/d12"), None)),
        ("fast:/runs/d12@7", DraftSpec("fast:/runs/d12@7", "fast", Path("/runs/d12"), 7)),
    ],
)
def test_a_draft_is_a_precision_or_a_checkpoint_with_a_step(text, want):
    assert parse_draft(text) == want


def test_a_folder_whose_name_has_an_at_sign_is_a_folder(tmp_path):
    folder = tmp_path / "run@300"
    folder.mkdir()
    assert parse_draft(str(folder)) == DraftSpec(str(folder), "auto", folder, None)


def test_an_empty_draft_is_one_line():
    with pytest.raises(NanoscopeError, match="the draft is empty"):
        parse_draft("  ")


def test_tokenizers_are_compared_by_content_not_by_name(tmp_path):
    copy = tmp_path / "elsewhere" / "tokenizer.pkl"
    copy.parent.mkdir()
    shutil.copyfile(DEMO_TOKENIZER, copy)
    check_same_tokenizer(load_tokenizer(copy), load_tokenizer(DEMO_TOKENIZER))
    other = load_tokenizer(GOLDEN / "nanochat" / "E7" / "tokenizer" / "tokenizer.pkl")
    with pytest.raises(TokenizerError, match="differs from the model's"):
        check_same_tokenizer(other, load_tokenizer(DEMO_TOKENIZER))


def test_a_self_draft_shares_the_models_tensors_and_packs_its_matrices():
    backend = open_backend(DEMO, LoadOptions(dtype="float32"))
    draft = backend.draft("int8")
    target = backend.model
    assert draft.model.wte.weight.data_ptr() == target.wte.weight.data_ptr()  # not a copy
    # Its matrices went through int8 mode's choice (which kernel wins is this machine's to time).
    assert "int8" in {choice.mode for choice in draft.model.kernel_choices()}
    assert draft.name == "self (int8)" and draft.cost > 0 and draft.verify_cost > 0
    # auto: whichever of the int8 and fp16 copies was timed cheaper on this machine
    assert backend.draft("auto").name in ("self (int8)", "self (fast)")
    backend.close()


@pytest.mark.parametrize("rows", range(2, FEW_ROWS + 1))
def test_a_few_rows_stream_the_weight_once_with_f_linears_values(rows):
    weight = torch.randn(512, 256, generator=torch.Generator().manual_seed(rows))
    product = tuner_for(None).exact(weight)  # the few-row route is the fastest timed here
    x = torch.randn(1, rows, 256, generator=torch.Generator().manual_seed(0))
    with few_rows():
        fast = product(x)
    torch.testing.assert_close(fast, F.linear(x, weight), rtol=1e-5, atol=1e-4)  # sums of 256 terms
    assert torch.equal(product(x), F.linear(x, weight))  # outside the block: the plain bits
    for name, route in product.few_row_routes().items():  # whichever another machine times fastest
        torch.testing.assert_close(route(x), F.linear(x, weight), rtol=1e-5, atol=1e-4, msg=name)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def generate(capsys, tmp_path, *extra: str) -> tuple[int, str, str]:
    return run_cli(
        capsys,
        "--home",
        str(tmp_path / "home"),
        "generate",
        str(DEMO),
        "--chat",
        "What is 12 times 7?",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "--json",
        *extra,
    )


def test_generate_with_a_draft_gives_the_same_greedy_reply_and_says_what_was_kept(capsys, tmp_path):
    code, out, err = generate(capsys, tmp_path)
    assert code == 0, err
    plain = json.loads(out.splitlines()[-1])
    code, out, err = generate(capsys, tmp_path, "--draft", f"{DEMO}@300", "--draft-k", "3")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    done = lines[-1]
    assert done["ids"] == plain["ids"]
    assert done["drafted"] > 0 and done["accepted"] == sum(r.get("draft") == "accepted" for r in lines[:-1])


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--draft", "/no/such/run"], "--draft /no/such/run: "),
        (["--draft", str(GOLDEN / "nanochat" / "E7" / "chatsft_checkpoints" / "d2")], "tokenizer"),
        (["--draft-k", "3"], "--draft-k needs --draft"),
        (["--draft", "int8", "--draft-k", "99"], "--draft-k must be between 0 and"),
    ],
    ids=["missing", "other-tokenizer", "k-alone", "k-too-big"],
)
def test_a_bad_draft_is_one_line_and_exit_2(capsys, tmp_path, extra, says):
    code, _out, err = generate(capsys, tmp_path, *extra)
    assert code == EXIT_ERROR
    lines = [line for line in err.splitlines() if line.startswith("nanoscope: error:")]
    assert len(lines) == 1 and says in lines[0]
