"""Checkpoints written by the C++ fork's own code (apstenku123/nanochat @ 7e9ffe4) load as the fork
wrote them, and Nanoscope reproduces the ids its own code generates.

``python -m tools.golden fork`` wrote every case with the fork's ``GPT``, ``init_weights``,
``save_checkpoint``, ``build_model`` and tokenizers (golden.json names the commit of each file):

* ``tests/golden/fork/<variant>/``: the ``tokenizer.pkl`` path (its ``RustBPETokenizer``, the
  upstream chat and calculator tokens). These also go through every check of
  test_golden_nanochat.py (``support.golden.CASES`` holds them): greedy and seeded ids, the
  calculator, ``nanoscope generate``, the base checkpoint, a stop mid-reply;
* ``tests/golden/fork/cpp/<variant>/``: the fork's default path, its ``CppTokenizer`` over a
  ``tokenizer.json`` trained by its own ``scripts/tok_train_cpp.py``; no chat tokens, so a prompt
  is ``<BOS>`` + text as the fork's C++ eval builds it, and a reply ends at ``<EOS>``. The shared
  helpers assume the upstream tokens, so these cases are checked here.

At 7e9ffe4 the fork's Engine cannot run on a CPU (its KV cache is bfloat16), so every case is
held to its full-forward ``GPT.generate`` (``compare_with``): that has no stop tokens and no
tools, so ids are compared up to the first token where the Engine, and Nanoscope, end the row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.backend_helpers import stream
from support.golden import GOLDEN, MAX_NEW, against_engine, assert_files_as_written, manifest
from test_golden_nanochat import sampling

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.nanochat.backend import NanochatBackend

FORK = GOLDEN / "fork"
PKL = sorted(p.parent for p in FORK.glob("*/golden.json"))
CPP = sorted(p.parent for p in FORK.glob("cpp/*/golden.json"))
ALL = PKL + CPP
VARIANTS = {"plain", "engram", "mhc", "engram-mhc-mtp-swiglu", "cpp/engram-swiglu"}


def name(case: Path) -> str:
    return case.relative_to(FORK).as_posix()


def until_stop(ids: list[int], stops: list[int]) -> list[int]:
    """Up to and with the first stop token (GPT.generate runs on past it, the Engine does not)."""
    ends = [i for i, t in enumerate(ids) if t in stops]
    return ids[: ends[0] + 1] if ends else ids


def open_case(case: Path, source: str = "chatsft") -> NanochatBackend:
    m = manifest(case)
    step = m["step"] if source == "chatsft" else m["base_step"]
    return NanochatBackend.open(
        case / f"{source}_checkpoints" / m["tag"],
        LoadOptions(step=step, device="cpu", dtype="float32", base_dir=case),
    )


def test_every_variant_is_written_by_the_forks_own_commit():
    assert {name(c) for c in ALL} >= VARIANTS
    for case in ALL:
        m = manifest(case)
        assert m["upstream"] == "apstenku123/nanochat" and m["commit"].startswith("7e9ffe4"), name(case)
        tokenizer = m["tokenizer"].split()[0]  # "tokenizer/tokenizer.json (CppTokenizer)"
        assert (case / tokenizer).is_file() and (tokenizer.endswith(".json") == (case in CPP)), name(case)
        if not against_engine(m):  # why not the Engine: recorded by the writer, case by case
            assert all("cannot run on a CPU" in c["engine"] for c in m["cases"]), name(case)


@pytest.mark.parametrize("case", ALL, ids=[name(c) for c in ALL])
def test_the_files_are_the_ones_the_generator_wrote(case):
    assert_files_as_written(case)


@pytest.fixture(scope="module", params=ALL, ids=[name(c) for c in ALL])
def opened(request) -> tuple[Path, dict, NanochatBackend]:
    case: Path = request.param
    backend = open_case(case)
    yield case, manifest(case), backend
    backend.close()


def csv(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def test_nanoscope_reads_the_config_the_fork_wrote(opened):
    """Classified as the fork, with the features its GPTConfig had; the MTP head is in the file
    (training only) and accepted, never built."""
    case, m, backend = opened
    fc, cfg = m["config"], backend.loaded.config
    assert backend.info().family == "nanochat-fork" and cfg.era == "fork"
    assert cfg.vocab_size == fc["vocab_size"] and cfg.n_layer == fc["n_layer"]
    if fc["engram_enabled"]:
        layers = {i % fc["n_layer"] for i in csv(fc["engram_layers"])}
        assert (set(cfg.engram_layers), list(cfg.engram_orders)) == (layers, csv(fc["engram_ngram_orders"]))
    else:
        assert cfg.engram_layers == ()
    assert cfg.mhc == fc["mhc_enabled"]
    assert cfg.swiglu == (fc["activation"] == "swiglu")
    written = case / "chatsft_checkpoints" / m["tag"] / f"model_{m['step']:06d}.pt"
    saved = torch.load(written, map_location="cpu", weights_only=True)
    assert any(k.startswith("mtp.") for k in saved) == fc["mtp_enabled"] == cfg.has_mtp
    assert not any(k.startswith("mtp.") for k in backend.model.state_dict())


def test_decoding_computes_the_forward_the_ids_were_recorded_from(opened):
    """Why the full forward is the reference: Nanoscope's one-token-at-a-time decode gives the
    logits of a full forward over the sequence so far (as GPT.generate runs it) within float noise,
    far below the smallest recorded greedy gap; for Engram too (it keeps the last z's, where the
    fork's Engine would average zeros), and for mHC, pooled over the current chunk as the fork's
    Engine pools it, since its weights are uniform."""
    _case, m, backend = opened
    model, worst = backend.model, 0.0
    threads = torch.get_num_threads()
    # ~160 forwards of a 64-wide model: one thread, or a busy second core stalls every product
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for c in m["cases"]:
                seq, n = c["prompt_ids"] + c["naive_greedy"], len(c["prompt_ids"])
                cache = KVCache(model.config, 1, len(seq), model.device, model.compute_dtype)
                steps = [model(torch.tensor([seq[:n]]), cache, last_only=True)[0, -1]]
                steps += [model(torch.tensor([[t]]), cache, last_only=True)[0, -1] for t in seq[n:-1]]
                for i, logits in enumerate(steps):
                    full = model(torch.tensor([seq[: n + i]]))[0, -1]
                    worst = max(worst, float((full - logits).abs().max()))
    finally:
        torch.set_num_threads(threads)
    smallest_gap = min(g for c in m["cases"] for g in c["greedy_top2_gaps"])
    assert worst < 1e-4 and worst < smallest_gap / 100, (worst, smallest_gap)


# --- the tokenizer.json cases (the fork's default tokenizer path) ---------------------------------


@pytest.fixture(scope="module", params=CPP, ids=[name(c) for c in CPP])
def cpp_opened(request) -> tuple[dict, NanochatBackend]:
    backend = open_case(request.param)
    yield manifest(request.param), backend
    backend.close()


def test_the_forks_tokenizer_json_is_used_for_completion(cpp_opened):
    m, backend = cpp_opened
    info = backend.info()
    assert info.tokenizer_kind == "cpp" and Path(info.tokenizer).name == "tokenizer.json"
    assert not info.capabilities.chat  # no chat tokens: completion only
    # the committed file's id 19 is <RESERVED_19>, which stands in for <TOOL_RESULT>, with a warning
    assert any("<RESERVED_19>" in w for w in info.warnings)
    for c in m["cases"]:
        assert set(backend.tok.stop_ids) == set(c["stop_ids"])
        # <BOS> + text, as the fork's C++ eval prompts its Engine (tokenizer(prompt, prepend=...))
        assert list(backend.render(c["text"], None).ids) == c["prompt_ids"]


def test_greedy_ids_equal_the_forks_own(cpp_opened):
    m, backend = cpp_opened
    for c in m["cases"]:
        events = [ev for ev in stream(backend, c["prompt_ids"], sampling("0.0|None|42")) if not ev.continues]
        want = until_stop(c["naive_greedy"], c["stop_ids"])
        assert [ev.id for ev in events] == want, c["text"]
        assert want[-1] in c["stop_ids"]  # the reply ended at <EOS>, inside the recorded ids
        assert not any(ev.forced for ev in events)  # the fork's tool calls run nothing by default


def test_seeded_samples_equal_the_forks_own(cpp_opened):
    m, backend = cpp_opened
    for c in m["cases"]:
        for key, want in c["naive_sampled"].items():
            if key.split("|")[1] != "None":
                continue  # GPT.generate's top-k draws from the whole masked vocabulary, Nanoscope
                # (and the Engine) from the k survivors: the same seed picks differently
            got = [ev.id for ev in stream(backend, c["prompt_ids"], sampling(key)) if not ev.continues]
            assert got == until_stop(want, c["stop_ids"]), f"{c['text']} {key}"


@pytest.mark.parametrize("case", CPP, ids=[name(c) for c in CPP])
def test_nanoscope_generate_encodes_the_prompt_and_reproduces_the_greedy_ids(case, capsys, monkeypatch):
    m = manifest(case)
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(case))
    c = m["cases"][0]
    argv = [
        "generate",
        f"sft/{m['tag']}/{m['step']}",
        "--prompt",
        c["text"],
        "--temperature",
        "0",
        "--max-tokens",
        str(MAX_NEW),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--json",
    ]
    assert cli.main(argv) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert done["prompt_ids"] == c["prompt_ids"]
    assert done["ids"] == until_stop(c["naive_greedy"], c["stop_ids"])


@pytest.mark.parametrize("case", CPP, ids=[name(c) for c in CPP])
def test_the_base_checkpoint_loads_with_the_tokenizer_json_too(case):
    m = manifest(case)
    backend = open_case(case, "base")
    try:
        assert backend.info().step == m["base_step"] and backend.info().tokenizer_kind == "cpp"
        ids = [ev.id for ev in stream(backend, m["cases"][1]["prompt_ids"][:4], sampling("0.0|None|1"))]
        assert ids  # its ids are not recorded, only that it runs
    finally:
        backend.close()
