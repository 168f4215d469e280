"""Hugging Face safetensors directories (NanoChat port and Llama) against transformers itself.

Fixtures are written by transformers (``save_pretrained``); the reference numbers are its own
``generate`` and ``apply_chat_template`` on the same directory. Error paths use hand-edited files.
"""

from __future__ import annotations

import itertools
import json
import struct
import threading
from pathlib import Path

import pytest
import torch
from support.backend_helpers import reply_ids, stream
from support.hf_factory import LLAMA_TEMPLATE, load_reference, reference_greedy, write_hf_model

from desktop.cli.main import main
from desktop.engine.backend import LoadOptions
from desktop.engine.chat_template import ChatTemplate, message_dicts
from desktop.engine.decode.generation import Specials
from desktop.engine.decode.sampling import sample_next
from desktop.engine.discovery import discover, summarize
from desktop.engine.errors import CheckpointError, NanoscopeError, TokenizerError, UnsupportedFormatError
from desktop.engine.export.hf_export import CHAT_TEMPLATE, SAMPLE_CONVERSATION
from desktop.engine.hf.backend import HFBackend
from desktop.engine.kernels import gemv
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, Message
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
TEXT = "The quick brown fox asked the assistant"

# name -> (model_type, chat template, config overrides)
VARIANTS = {
    "nanochat": ("nanochat", CHAT_TEMPLATE, {}),
    "nanochat-mha": ("nanochat", CHAT_TEMPLATE, {"num_key_value_heads": 4, "final_logit_softcapping": 20.0}),
    "llama": ("llama", LLAMA_TEMPLATE, {}),
    "llama-tied-bias": (
        "llama",
        None,
        {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True},
    ),
    "llama3-rope": (
        "llama",
        LLAMA_TEMPLATE,
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "linear-rope": (
        "llama",
        None,
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}},
    ),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        name: write_hf_model(root / name, kind, chat_template=template, seed=i, **overrides)
        for i, (name, (kind, template, overrides)) in enumerate(VARIANTS.items())
    }


def open_hf(directory: Path) -> HFBackend:
    backend = open_backend(directory, LoadOptions(device="cpu"))
    assert isinstance(backend, HFBackend)
    return backend


@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_ids_equal_transformers_generate(models, name):
    model, tokenizer = load_reference(models[name])
    backend = open_hf(models[name])
    prompt = backend.render(TEXT, None)
    assert list(prompt.ids) == tokenizer(TEXT)["input_ids"]  # completion: the tokenizer's own encoding
    expected = reference_greedy(model, list(prompt.ids), GREEDY.max_tokens)
    assert reply_ids(backend, prompt, GREEDY) == expected
    # And the logits of one forward agree to float32 rounding.
    ids = torch.tensor([list(prompt.ids)])
    with torch.no_grad():
        reference = model(ids).logits.float()
    torch.testing.assert_close(backend.model(ids), reference, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["nanochat", "llama"])
def test_chat_template_gives_transformers_ids(models, name):
    _, tokenizer = load_reference(models[name])
    backend = open_hf(models[name])
    conversation = (
        list(SAMPLE_CONVERSATION)
        if name == "nanochat"
        else [
            Message.of_text("user", "  What is 12 times 7?"),
            Message.of_text("assistant", "It is 84."),
            Message.of_text("user", "Thanks!"),
        ]
    )
    prompt = backend.render(conversation, None)
    expected = tokenizer.apply_chat_template(
        message_dicts(conversation), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert list(prompt.ids) == list(expected)
    assert backend.info().capabilities.chat


def test_info_describes_the_model(models, monkeypatch, several_threads):
    monkeypatch.setattr(gemv, "MIN_SPLIT_BYTES", 1)  # the tiny test matrices are timed like real ones
    info = open_hf(models["llama"]).info()
    reference, _ = load_reference(models["llama"])
    assert info.family == "hf-llama" and info.era == "hf-llama"
    assert info.parameters == sum(p.numel() for p in reference.parameters())
    assert info.context_length == 128 and info.vocab_size == 400
    assert info.capabilities.logprobs and info.capabilities.scoring
    assert open_hf(models["nanochat"]).info().family == "hf-nanochat"
    # every matrix shape's kernel, as chosen by timing on this machine, for the status bar
    shapes = {(int(n), int(k)) for n, k in (line.split(" ")[0].split("×") for line in info.kernels)}
    assert (info.vocab_size, reference.config.hidden_size) in shapes
    assert all(" exact: " in line for line in info.kernels)


def test_seeded_sampling_follows_the_engine_sampler(models):
    """Temperature and top-k sampling draw from one Generator per reply, as sampling.py does for
    nanochat: restated here over transformers' logits, token by token."""
    model, _ = load_reference(models["nanochat"])
    backend = open_hf(models["nanochat"])
    prompt = backend.render(TEXT, None)
    params = SamplingParams(temperature=0.9, top_k=20, max_tokens=12, seed=7)
    rng = torch.Generator().manual_seed(7)
    ids, expected = list(prompt.ids), []
    for _ in range(params.max_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[:, -1, :].float()
        token = int(sample_next(logits, rng, params)[0, 0])
        expected.append(token)
        ids.append(token)
        if token == 4:
            break
    assert reply_ids(backend, prompt, params) == expected


def test_score_matches_transformers_logprobs(models):
    model, _ = load_reference(models["llama"])
    backend = open_hf(models["llama"])
    prompt = backend.render(TEXT, None)
    reply = [10, 20, 30]
    result = backend.score(prompt, reply)
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt.ids) + reply])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    start = len(prompt.ids) - 1
    expected = [float(logprobs[start + i, t]) for i, t in enumerate(reply)]
    assert result["token_logprobs"] == pytest.approx(expected, abs=1e-4)


def test_no_template_means_completion_mode(models):
    backend = open_hf(models["llama-tied-bias"])
    assert not backend.info().capabilities.chat
    with pytest.raises(TokenizerError, match="no chat template"):
        backend.render([Message.of_text("user", "hi")], None, chat=True)
    prompt = backend.render([Message.of_text("user", "hi")], None)
    assert list(prompt.ids) == backend.tok.encode_completion("hi")


def test_old_turns_make_room_for_the_reply(models):
    backend = open_hf(models["nanochat"])
    long = "the quick brown fox " * 12
    turns = [Message.of_text("system", "Be brief.")]
    for _ in range(4):
        turns += [Message.of_text("user", long), Message.of_text("assistant", long)]
    turns.append(Message.of_text("user", "and now?"))
    prompt = backend.render(turns, max_tokens=32)
    assert prompt.dropped_turns > 0 and prompt.tokens <= 128 - 32
    assert prompt.messages[0].role == "system" and prompt.messages[-1].plain_text() == "and now?"


# ---------------------------------------------------------------------------------------------------
# the calculator on the NanoChat port's template


def _chain(tokenizer, steps: list[str]):
    """Weights that make greedy decoding follow ``steps`` (token texts or special names): every
    block adds nothing, so the logits depend on the last token alone, and the head points each
    token's embedding at the next one."""
    ids = [
        tokenizer.convert_tokens_to_ids(s) if s.startswith("<|") else tokenizer.encode(s)[0] for s in steps
    ]

    def edit(model):
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.fc2.weight.zero_()
        embed = torch.nn.functional.normalize(torch.randn_like(model.model.embed_tokens.weight), dim=-1)
        model.model.embed_tokens.weight.copy_(embed)
        head = torch.zeros_like(model.lm_head.weight)
        for a, b in itertools.pairwise(ids):
            head[b] += embed[a] * 40.0
        model.lm_head.weight.copy_(head)

    return edit


def test_calculator_runs_on_the_port(tmp_path):
    from transformers import AutoTokenizer

    probe = write_hf_model(tmp_path / "probe", "nanochat", chat_template=CHAT_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(probe)
    assert [len(tokenizer.encode(s)) for s in ("1", "+", "2", "3")] == [1, 1, 1, 1]
    steps = ["<|assistant_start|>", "<|python_start|>", "1", "+", "2", "<|python_end|>"]
    steps_after = ["<|output_end|>", "<|assistant_end|>"]
    directory = write_hf_model(
        tmp_path / "calc",
        "nanochat",
        chat_template=CHAT_TEMPLATE,
        edit=_chain(tokenizer, steps + steps_after),
    )
    backend = open_hf(directory)
    sp = Specials.of(backend.tok)
    assert sp.python_start == tokenizer.convert_tokens_to_ids("<|python_start|>")
    prompt = backend.render([Message.of_text("user", "What is 1+2?")], None)
    assert prompt.ids[-1] == tokenizer.convert_tokens_to_ids("<|assistant_start|>")
    reply = Message("assistant")
    events = [ev for ev in stream(backend, prompt, SamplingParams(temperature=0.0, max_tokens=16))]
    for ev in events:
        reply.add_event(ev)
    forced = [ev.special or ev.text for ev in events if ev.forced]
    assert forced == ["<|output_start|>", "3", "<|output_end|>"]
    assert [(p.kind, p.text) for p in reply.parts if p.kind in (PYTHON, PYTHON_OUTPUT)] == [
        (PYTHON, "1+2"),
        (PYTHON_OUTPUT, "3"),
    ]
    assert events[-1].special == "<|assistant_end|>"


# ---------------------------------------------------------------------------------------------------
# hostile templates


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ raise_exception.__globals__['json'] }}",
        "{% set ns = namespace(__class__=1) %}{{ ns }}",
        "{{ messages.append(1) }}",
    ],
)
def test_hostile_template_is_refused_in_one_line(tmp_path, source):
    template = ChatTemplate(source, tmp_path / "chat_template.jinja", {})
    with pytest.raises(TokenizerError) as info:
        template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    message = str(info.value)
    assert "\n" not in message and "chat_template.jinja" in message


def test_hostile_template_file_stops_the_prompt_not_the_app(models, tmp_path, capsys):
    directory = write_hf_model(tmp_path / "evil", "llama")
    (directory / "chat_template.jinja").write_text("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    capsys.readouterr()
    code = main(["generate", str(directory), "--chat", "hi", "--device", "cpu", "--max-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Python internals" in err


def test_template_syntax_error_is_one_line(tmp_path):
    with pytest.raises(TokenizerError, match="does not compile"):
        ChatTemplate("{% for m in messages %}", tmp_path / "t.jinja", {})


# ---------------------------------------------------------------------------------------------------
# broken directories: one readable line each


def _rewrite_safetensors(directory: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


BROKEN = {
    "missing key": (
        lambda d: _rewrite_safetensors(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
        CheckpointError,
        "missing model.layers.1.mlp.up_proj.weight",
    ),
    "unexpected key": (
        lambda d: _rewrite_safetensors(d, lambda t: t.update(extra=torch.zeros(2))),
        CheckpointError,
        "unexpected extra",
    ),
    "wrong shape": (
        lambda d: _rewrite_safetensors(d, lambda t: t.update({"model.norm.weight": torch.ones(65)})),
        CheckpointError,
        "model.norm.weight has shape [65]",
    ),
    "nan": (
        lambda d: _rewrite_safetensors(
            d, lambda t: t["model.layers.0.self_attn.q_proj.weight"].__setitem__((0, 0), float("nan"))
        ),
        CheckpointError,
        "non-finite",
    ),
    "integer weights": (
        lambda d: _rewrite_safetensors(
            d, lambda t: t.update({"model.norm.weight": torch.ones(64, dtype=torch.int32)})
        ),
        UnsupportedFormatError,
        "I32",
    ),
    "unknown model_type": (
        lambda d: _edit_config(d, model_type="gpt_neox"),
        UnsupportedFormatError,
        "'gpt_neox'",
    ),
    "unknown rope scaling": (
        lambda d: _edit_config(d, rope_parameters={"rope_type": "yarn", "factor": 4.0}),
        UnsupportedFormatError,
        "rope scaling 'yarn'",
    ),
    "bad activation": (
        lambda d: _edit_config(d, hidden_act="gelu"),
        UnsupportedFormatError,
        "hidden_act 'gelu'",
    ),
    "absurd size": (lambda d: _edit_config(d, hidden_size=1 << 30), CheckpointError, "beyond any real model"),
    "bad json": (lambda d: (d / "config.json").write_text("{oops"), CheckpointError, "not valid JSON"),
    "truncated": (
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:5000]),
        CheckpointError,
        "outside the file",
    ),
    "huge header": (
        lambda d: (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}"),
        CheckpointError,
        "header length",
    ),
    "no tokenizer": (lambda d: (d / "tokenizer.json").unlink(), TokenizerError, "tokenizer.json"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_directory_gives_one_line(tmp_path, case):
    directory = write_hf_model(tmp_path / "m", "llama")
    breaker, error, fragment = BROKEN[case]
    breaker(directory)
    with pytest.raises(error) as info:
        open_backend(directory, LoadOptions(device="cpu"))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_sharded_weights_load_and_a_missing_shard_is_named(tmp_path):
    from transformers import LlamaForCausalLM

    directory = write_hf_model(tmp_path / "whole", "llama")
    model = LlamaForCausalLM.from_pretrained(directory)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((directory / name).read_bytes())
    shards = sorted(sharded.glob("*.safetensors"))
    assert len(shards) > 1 and (sharded / "model.safetensors.index.json").is_file()
    whole, split = open_hf(directory), open_hf(sharded)
    prompt = whole.render(TEXT, None)
    assert reply_ids(split, prompt, GREEDY) == reply_ids(whole, prompt, GREEDY)
    shards[-1].unlink()
    with pytest.raises(CheckpointError, match=f"shard {shards[-1].name} is missing"):
        open_backend(sharded, LoadOptions(device="cpu"))


def test_cancel_stops_after_the_current_token(models):
    backend = open_hf(models["llama"])
    cancel = threading.Event()
    events = []
    for ev in stream(
        backend, backend.render(TEXT, None), SamplingParams(temperature=0.0, max_tokens=20), cancel=cancel
    ):
        events.append(ev)
        cancel.set()
    assert len([e for e in events if not e.continues]) == 1


# ---------------------------------------------------------------------------------------------------
# CLI and discovery


def test_cli_generate_json_gives_transformers_ids(models, capsys):
    model, tokenizer = load_reference(models["nanochat"])
    code = main(
        [
            "generate",
            str(models["nanochat"]),
            "--chat",
            "What is 12 times 7?",
            "--json",
            "--device",
            "cpu",
            "--temperature",
            "0",
            "--max-tokens",
            "10",
        ]
    )
    out = capsys.readouterr().out.strip().splitlines()
    done = json.loads(out[-1])
    expected_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 times 7?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert code == 0 and done["prompt_ids"] == list(expected_prompt)
    assert done["ids"] == reference_greedy(model, list(expected_prompt), 10)
    assert done["era"] == "hf-nanochat"


def test_cli_tokenizer_flag_is_refused_for_hf(models, capsys, tmp_path):
    code = main(
        ["generate", str(models["llama"]), "--prompt", "x", "--tokenizer", str(tmp_path), "--device", "cpu"]
    )
    assert code == 2 and "own tokenizer.json" in capsys.readouterr().err


def test_discovery_lists_hf_directories_from_headers(models, tmp_path):
    entries = discover(tmp_path / "nothing", [models["llama"].parent])
    found = {e.path: e for e in entries}
    assert models["llama"] in found and found[models["llama"]].source == "hf"
    summary = summarize(models["llama"], found[models["llama"]].steps[-1])
    reference, _ = load_reference(models["llama"])
    assert summary.error == "" and summary.era == "hf-llama"
    assert summary.params == sum(p.numel() for p in reference.parameters())
    assert summary.sequence_len == 128 and summary.vocab_size == 400 and summary.stored_dtype == "float32"


def test_discovery_reports_a_broken_hf_directory(tmp_path):
    directory = write_hf_model(tmp_path / "m", "llama")
    _edit_config(directory, model_type="mamba")
    summary = summarize(directory, 0)
    assert "model_type 'mamba'" in summary.error


def test_cli_list_shows_the_hf_family(tmp_path, capsys):
    write_hf_model(tmp_path / "base" / "tiny-llama", "llama")
    assert main(["list", "--base-dir", str(tmp_path / "base")]) == 0
    out = capsys.readouterr().out
    assert "hf-llama" in out and "tiny-llama" in out


def test_nanochat_loader_still_refuses_hf(models):
    from desktop.engine.nanochat.loader import load_model

    with pytest.raises(NanoscopeError, match="Hugging Face"):
        load_model(models["llama"])


def test_discovery_finds_hub_cache_snapshots(models, tmp_path):
    """A watched Hugging Face hub cache lists each downloaded snapshot as org/name@revision."""
    import shutil

    snapshot = tmp_path / "hub" / "models--karpathy--nanochat-d32" / "snapshots" / "0123456789abcdef"
    shutil.copytree(models["nanochat"], snapshot)
    entries = [e for e in discover(tmp_path / "nothing", [tmp_path / "hub"]) if e.source == "hf"]
    assert [(e.tag, e.path) for e in entries] == [("karpathy/nanochat-d32@0123456", snapshot)]
    assert open_hf(snapshot).info().name == "karpathy/nanochat-d32@0123456"
