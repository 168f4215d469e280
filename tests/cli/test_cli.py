"""``nanoscope list / generate`` in-process (``desktop.cli.main.main``), plus one real
``python -m desktop`` run.

Expected token ids come from the independent reference forward (greedy) and the test's own tokenizer
encoding; the calculator trap checkpoint makes a reply that uses the calculator and then stops.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import REPO
from support.checkpoint_factory import (
    model_file,
    read_checkpoint,
    truncate_file,
    write_checkpoint,
    write_with_wrong_vocab,
)
from support.nanochat_engine_mimic import use_calculator, write_calculator_trap
from support.reference_model import reference_greedy
from support.tokenizer_factory import make_tiktoken_encoding, write_evil_pickle

from desktop.cli.main import main
from desktop.engine.kernels.device import pick_precision

ROOT = REPO
ENC = make_tiktoken_encoding(300)  # what write_checkpoint pickles for vocab 300
SP = ENC.encode_single_token
STOP = {SP("<|assistant_end|>"), SP("<|bos|>")}


def chat_prompt(text: str) -> list[int]:
    user = [SP("<|user_start|>"), *ENC.encode_ordinary(text), SP("<|user_end|>")]
    return [SP("<|bos|>"), *user, SP("<|assistant_start|>")]


def until_stop(ids: list[int]) -> list[int]:
    """nanochat's Engine stops after the first stop token; the CLI reports that token too."""
    end = next((i + 1 for i, t in enumerate(ids) if t in STOP), len(ids))
    return ids[:end]


def expected_greedy(ckpt: Path, era: str, prompt: list[int], n: int, step: int | None = None) -> list[int]:
    sd, meta = read_checkpoint(ckpt, step)
    return until_stop(reference_greedy(sd, meta["model_config"], era, prompt, n))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A nanochat base dir: base/d4 (E7), chatsft/d4 (E7, steps 5 and 20), chatsft/d2 (calculator trap)."""
    root = tmp_path_factory.mktemp("nanochat")
    write_checkpoint(root, "E7", phase="base", step=40, seed=1)
    write_checkpoint(root, "E7", phase="chatsft", step=5, seed=2)
    write_checkpoint(root, "E7", phase="chatsft", step=20, seed=3)
    chain = [SP("<|assistant_start|>"), SP("<|python_start|>"), *ENC.encode_ordinary("7*6")]
    chain.append(SP("<|python_end|>"))
    successors = dict(itertools.pairwise(chain)) | {SP("<|output_end|>"): SP("<|assistant_end|>")}
    write_calculator_trap(root, successors, phase="chatsft", step=3)
    return root


@pytest.fixture
def nanochat_env(base, monkeypatch) -> Path:
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(base))
    return base


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def generate_json(capsys, *argv: str) -> tuple[list[dict], dict, str]:
    code, out, err = run_cli(capsys, "generate", *argv, "--json", "--device", "cpu")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    return lines[:-1], lines[-1], err


def tokens_arg(ids: list[int]) -> str:
    return ",".join(map(str, ids))


# ---------------------------------------------------------------------------------------------------
# list


def test_list_json(capsys, nanochat_env):
    code, out, err = run_cli(capsys, "list", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["base_dir"] == str(nanochat_env)
    found = {(c["source"], c["tag"]): c for c in data["checkpoints"]}
    assert set(found) == {("base", "d4"), ("sft", "d4"), ("sft", "d2")}
    assert found[("sft", "d4")]["steps"] == [5, 20]
    assert found[("sft", "d4")]["path"] == str(nanochat_env / "chatsft_checkpoints" / "d4")
    latest = found[("sft", "d4")]["latest"]
    sd, _ = read_checkpoint(nanochat_env / "chatsft_checkpoints" / "d4", 20)
    assert latest["step"] == 20 and latest["era"] == "E7" and latest["error"] == ""
    assert latest["params"] == sum(t.numel() for t in sd.values())
    assert found[("sft", "d2")]["latest"]["era"] == "E0"


def test_list_base_dir_option_and_text_output(capsys, base, tmp_path):
    code, out, _ = run_cli(capsys, "list", "--base-dir", str(base))
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 3
    assert any(str(base / "chatsft_checkpoints" / "d4") in ln and "E7" in ln for ln in lines)
    code, out, _ = run_cli(capsys, "list", "--base-dir", str(tmp_path / "empty"))
    assert code == 0 and "no checkpoints" in out


def test_list_reports_a_broken_checkpoint_and_goes_on(capsys, tmp_path):
    good = write_checkpoint(tmp_path, "E2", phase="base", tokenizer=None)
    bad = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer=None)
    truncate_file(model_file(bad))
    code, out, _ = run_cli(capsys, "list", "--json", "--base-dir", str(tmp_path))
    assert code == 0
    by_path = {c["path"]: c["latest"] for c in json.loads(out)["checkpoints"]}
    assert by_path[str(good)]["error"] == "" and by_path[str(good)]["era"] == "E2"
    assert str(model_file(bad)) in by_path[str(bad)]["error"]
    code, out, _ = run_cli(capsys, "list", "--base-dir", str(tmp_path))
    assert code == 0 and str(model_file(bad)) in out


# ---------------------------------------------------------------------------------------------------
# generate


def test_generate_tokens_json_with_the_calculator(capsys, base):
    ckpt = base / "chatsft_checkpoints" / "d2"
    prompt = chat_prompt("What is 7*6?")
    tokens, done, _ = generate_json(capsys, str(ckpt), "--tokens", tokens_arg(prompt), "--temperature", "0")
    result_ids = ENC.encode_ordinary(str(use_calculator("7*6")))
    calc = [SP("<|output_start|>"), *result_ids, SP("<|output_end|>")]
    head = [SP("<|python_start|>"), *ENC.encode_ordinary("7*6"), SP("<|python_end|>")]
    expected = [*head, *calc, SP("<|assistant_end|>")]
    assert [t["id"] for t in tokens] == expected
    assert done["ids"] == expected  # the stop token is reported
    assert [t["forced"] for t in tokens] == [False] * len(head) + [True] * len(calc) + [False]
    assert "".join(t["text"] for t in tokens if t["id"] in result_ids) == "42"
    assert all(set(t) == {"id", "text", "forced"} for t in tokens)
    assert done["done"] is True and done["prompt_tokens"] == len(prompt)
    assert (done["device"], done["dtype"], done["era"]) == ("cpu", "float32", "E0")
    assert done["ttft_ms"] >= 0 and done["decode_tok_s"] >= 0


def test_generate_prompt_completes_text(capsys, base):
    ckpt = base / "base_checkpoints" / "d4"
    text = "The quick brown fox"
    prompt = [SP("<|bos|>"), *ENC.encode_ordinary(text)]
    _, done, _ = generate_json(capsys, str(ckpt), "--prompt", text, "--temperature", "0", "--max-tokens", "6")
    assert done["prompt_tokens"] == len(prompt)
    assert done["ids"] == expected_greedy(ckpt, "E7", prompt, 6)


def test_generate_chat_renders_one_user_turn(capsys, base):
    ckpt = base / "chatsft_checkpoints" / "d4"
    args = ("--chat", "Hello there!", "--temperature", "0", "--max-tokens", "6")
    _, done, _ = generate_json(capsys, str(ckpt), *args)
    prompt = chat_prompt("Hello there!")
    assert done["prompt_tokens"] == len(prompt)
    assert done["ids"] == expected_greedy(ckpt, "E7", prompt, 6)


def test_generate_plain_text_output(capsys, base):
    ckpt = base / "chatsft_checkpoints" / "d2"
    prompt = tokens_arg(chat_prompt("7*6?"))
    args = ("--tokens", prompt, "--temperature", "0", "--device", "cpu")
    code, out, _ = run_cli(capsys, "generate", str(ckpt), *args)
    assert code == 0
    assert "7*6" in out and "42" in out


@pytest.mark.parametrize(
    ("spec", "extra", "step"),
    [("sft", [], 20), ("sft/d4", [], 20), ("sft/d4/5", [], 5), ("sft/d4", ["--step", "5"], 5)],
)
def test_source_tag_step_resolution(capsys, nanochat_env, spec, extra, step):
    ckpt = nanochat_env / "chatsft_checkpoints" / "d4"
    prompt = chat_prompt("Which step are you?")
    expected = expected_greedy(ckpt, "E7", prompt, 8, step)
    other = expected_greedy(ckpt, "E7", prompt, 8, {5: 20, 20: 5}[step])
    assert expected != other  # the two steps really answer differently
    args = ("--tokens", tokens_arg(prompt), "--temperature", "0", "--max-tokens", "8")
    _, done, _ = generate_json(capsys, spec, *extra, *args)
    assert done["ids"] == expected


def test_source_picks_the_largest_model_tag(capsys, nanochat_env):
    # "sft" holds d2 (the trap) and d4: nanochat's find_largest_model picks d4 (spec §1.1).
    _, done, _ = generate_json(capsys, "sft", "--tokens", tokens_arg(chat_prompt("hi")), "--max-tokens", "2")
    assert done["era"] == "E7"


def test_warning_past_sequence_len(capsys, base):
    ckpt = base / "chatsft_checkpoints" / "d4"
    _, done, err = generate_json(
        capsys, str(ckpt), "--chat", "hi", "--max-tokens", "80", "--temperature", "0"
    )
    warnings = [ln for ln in err.splitlines() if ln.startswith("nanoscope: warning:")]
    assert any("sequence_len" in ln and "64" in ln for ln in warnings), err
    assert 0 < len(done["ids"]) <= 80


def test_generate_options_reach_the_sampler(capsys, base):
    ckpt = str(base / "chatsft_checkpoints" / "d4")
    prompt = tokens_arg(chat_prompt("Tell me something."))
    runs = {}
    for seed in ("1", "1", "2"):
        args = ("--tokens", prompt, "--temperature", "1.0", "--top-k", "50", "--seed", seed)
        args += ("--max-tokens", "12")
        runs.setdefault(seed, []).append(generate_json(capsys, ckpt, *args)[1]["ids"])
    assert runs["1"][0] == runs["1"][1]  # same seed, same tokens
    assert runs["1"][0] != runs["2"][0]


# ---------------------------------------------------------------------------------------------------
# errors: one line on stderr, exit code 2, no traceback


def assert_one_error_line(code: int, err: str, *names: object) -> str:
    assert code == 2
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("nanoscope: error:")
    for name in names:
        assert str(name) in lines[0]
    return lines[0]


def _generate(capsys, ckpt: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(
        capsys, "generate", str(ckpt), "--chat", "hi", "--max-tokens", "2", "--device", "cpu", *extra
    )


def test_error_truncated_model(capsys, tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft")
    truncate_file(model_file(ckpt))
    code, out, err = _generate(capsys, ckpt)
    assert_one_error_line(code, err, model_file(ckpt))
    assert out == ""


def test_error_wrong_vocab(capsys, tmp_path):
    ckpt = write_with_wrong_vocab(tmp_path, "E7", phase="chatsft")
    code, _, err = _generate(capsys, ckpt)
    assert "vocab_size" in assert_one_error_line(code, err, model_file(ckpt))


def test_error_missing_tokenizer(capsys, tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer=None)
    code, _, err = _generate(capsys, ckpt)
    assert "tokenizer" in assert_one_error_line(code, err, tmp_path / "tokenizer")


@pytest.mark.parametrize("disguised", [False, True])
def test_error_evil_tokenizer_pickle(capsys, tmp_path, disguised):
    marker = tmp_path / "pwned"
    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer=None)
    evil = write_evil_pickle(tmp_path / "tokenizer" / "tokenizer.pkl", marker, disguised=disguised)
    code, _, err = _generate(capsys, ckpt)
    assert_one_error_line(code, err, evil)
    assert not marker.exists()


def test_error_chat_without_chat_tokens(capsys, tmp_path):
    ckpt = write_checkpoint(tmp_path, "fork", phase="sft")  # the fork's C++ tokenizer.json
    code, _, err = _generate(capsys, ckpt)
    assert "chat tokens" in assert_one_error_line(code, err, tmp_path / "tokenizer" / "tokenizer.json")


def test_error_token_ids_out_of_range(capsys, base):
    ckpt = base / "chatsft_checkpoints" / "d4"
    code, _, err = run_cli(capsys, "generate", str(ckpt), "--tokens", "1,2,300", "--device", "cpu")
    assert "300" in assert_one_error_line(code, err)
    code, _, err = run_cli(capsys, "generate", str(ckpt), "--tokens", "1,x", "--device", "cpu")
    assert_one_error_line(code, err, "--tokens")


def test_error_unknown_source(capsys, nanochat_env):
    code, _, err = run_cli(capsys, "generate", "rl", "--chat", "hi")
    assert_one_error_line(code, err, "rl", nanochat_env)
    code, _, err = run_cli(capsys, "generate", "nothing-like-this", "--chat", "hi")
    assert_one_error_line(code, err, "nothing-like-this")


def test_error_invalid_sampling_value(capsys, base):
    ckpt = base / "chatsft_checkpoints" / "d4"
    code, _, err = _generate(capsys, ckpt, "--top-p", "0")
    assert "top_p" in assert_one_error_line(code, err)


# ---------------------------------------------------------------------------------------------------
# the real entry point


def test_python_dash_m_desktop_generate(capsys, base):
    ckpt = base / "chatsft_checkpoints" / "d2"
    prompt = tokens_arg(chat_prompt("What is 7*6?"))
    gen_args = [str(ckpt), "--tokens", prompt, "--temperature", "0"]
    _, in_process, _ = generate_json(capsys, *gen_args)
    command = [sys.executable, "-m", "desktop", "generate", *gen_args, "--json", "--device", "cpu"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = [json.loads(ln) for ln in result.stdout.splitlines() if ln.strip()]
    assert lines[-1]["done"] is True
    assert lines[-1]["ids"] == in_process["ids"] == [t["id"] for t in lines[:-1]]
    assert lines[-1]["ids"][-1] == SP("<|assistant_end|>")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="only Linux can lack a display")
def test_the_window_without_a_screen_is_one_line_and_the_smoke_test_runs_offscreen(tmp_path):
    """Over ssh or in a container Qt would abort with a paragraph about plugins."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    home = ["--home", str(tmp_path / "home")]
    command = [sys.executable, "-m", "desktop", *home]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    line = assert_one_error_line(result.returncode, result.stderr, "DISPLAY")
    assert "nanoscope generate" in line
    smoke = subprocess.run(
        [*command, "--smoke-test"], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env
    )
    assert smoke.returncode == 0, smoke.stderr
    assert smoke.stdout.startswith("SMOKE OK"), smoke.stdout


# ---------------------------------------------------------------------------------------------------
# bench and devices

BENCH_FIGURES = (
    "load_s",
    "ttft_ms",
    "prefill_tok_s",
    "decode_tok_s",
    "bytes_per_step",
    "copy_gbs",
    "read_gbs",
    "matvec_gbs",
    "mbu_matvec",
    "rss_after_load_mb",
    "rss_budget_mb",
    "peak_rss_mb",
    "kv_cache_mb",
    "stream_start_rss_mb",
    "stream_peak_rss_mb",
    "stream_rss_budget_mb",
    "turn_ttft_cached_ms",
    "turn_ttft_full_ms",
)


@pytest.mark.parametrize(("dtype", "name"), [("float32", "float32"), ("fast", None)])
def test_bench_reports_every_figure_and_ends_with_json(capsys, base, dtype, name):
    ckpt = base / "chatsft_checkpoints" / "d4"
    args = ["bench", str(ckpt), "--prompt-tokens", "8", "--new-tokens", "4", "--repeats", "1"]
    code, out, err = run_cli(capsys, *args, "--dtype", dtype, "--top-k", "5", "--temperature", "0.5")
    assert code == 0, err
    lines = out.strip().splitlines()
    result = json.loads(lines[-1])
    assert len(lines) > len(BENCH_FIGURES)  # the readable table comes first
    for key in BENCH_FIGURES:
        assert result[key] > 0, key
    assert result["prompt_tokens"] == 8 and result["new_tokens"] == 4
    assert (result["temperature"], result["top_k"]) == (0.5, 5)
    assert result["dtype"] == (name or pick_precision(torch.device("cpu"), "fast").name)
    assert result["peak_rss_mb"] >= result["rss_after_load_mb"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_error_device_not_available(capsys, base):
    ckpt = base / "chatsft_checkpoints" / "d4"
    code, _, err = _generate(capsys, ckpt, "--device", "cuda")
    assert "CUDA" in assert_one_error_line(code, err)


def test_generate_compiled_says_why_when_the_steps_stay_eager(capsys):
    """--compiled asked of a model whose steps are not compiled (here exact mode of a Hugging
    Face folder written by transformers): the reply is made, and one warning says why."""
    golden = REPO / "tests" / "golden" / "transformers" / "llama-bf16"
    _, done, err = generate_json(capsys, str(golden), "--prompt", "hi", "--max-tokens", "3", "--compiled")
    assert done["step_compiled"] is False and done["ids"]
    warned = [line for line in err.splitlines() if "--compiled" in line]
    assert warned == [
        "nanoscope: warning: --compiled: only fast and int8 mode of a nanochat checkpoint on a CPU "
        "compile their steps"
    ]
