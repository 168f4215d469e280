"""KempnerForge runs (spec §3): written by DCP itself from KempnerForge's model
restated in ``kf_reference``, loaded with no distributed init, and checked against the
reference's own forward and ``generate()``.
"""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path

import pytest
import torch
from support.kf_reference import (
    EOS,
    MarkerOnLoad,
    RefConfig,
    generate,
    make_model,
    write_run,
    write_step,
    write_tokenizer,
    write_toml,
)

from desktop.engine.backend import GenerationStats, LoadOptions, Prompt
from desktop.engine.errors import CheckpointError, NanoscopeError, TokenizerError, UnsupportedFormatError
from desktop.engine.kempnerforge.backend import KempnerForgeBackend
from desktop.engine.kernels import gemv
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

CONFIGS = {
    # rmsnorm, SwiGLU, GQA, qk-norm, untied, the multiplier rule for the FFN size
    "gqa-qknorm": RefConfig(
        n_heads=4, n_kv_heads=2, qk_norm=True, ffn_dim_multiplier=1.3, rope_theta=500000.0
    ),
    # layernorm (weight and bias), gelu with two matrices, tied embeddings, an explicit FFN size
    "layernorm-gelu-tied": RefConfig(
        norm_type="layernorm", activation="gelu", tie_embeddings=True, ffn_hidden_dim=48
    ),
    # relu, MHA, a norm_eps of its own
    "relu-mha": RefConfig(activation="relu", n_layers=3, norm_eps=1e-6, ffn_hidden_dim=40),
}
PROMPT = "Once upon a time there was"
# The files of the gpt2 hub repo that decide its tokenizer: no eos_token, the GPT-2 class names it.
GPT2_LIKE = {"tokenizer_config.json": {"model_max_length": 1024}, "config.json": {"model_type": "gpt2"}}


def failure(exc_type: type[NanoscopeError], call, *args, **kwargs) -> str:
    with pytest.raises(exc_type) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


def open_cpu(target: Path, **kwargs) -> KempnerForgeBackend:
    backend = open_backend(target, LoadOptions(device="cpu", **kwargs))
    assert isinstance(backend, KempnerForgeBackend)
    return backend


def reply_ids(backend, prompt, **params) -> list[int]:
    events = backend.stream(prompt, SamplingParams(**params), threading.Event())
    return [ev.id for ev in events if not ev.continues]


def reference_reply(model, prompt_ids, max_new, eos_id, **kw) -> list[int]:
    out = generate(model, torch.tensor([list(prompt_ids)]), max_new, eos_token_id=eos_id, **kw)
    return out[0, len(prompt_ids) :].tolist()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok"))


# --- the numbers -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_greedy_ids_equal_the_reference(tmp_path, tokenizer_dir, name):
    run, ref = write_run(tmp_path, CONFIGS[name], tokenizer=tokenizer_dir)
    backend = open_cpu(run)
    prompt = backend.render(PROMPT, None)
    ids = torch.tensor([list(prompt.ids)])
    with torch.no_grad():
        assert torch.equal(backend.model(ids), ref(ids))
    eos = backend.tok.eos_id
    assert reply_ids(backend, prompt, temperature=0.0, max_tokens=20) == reference_reply(
        ref, prompt.ids, 20, eos, temperature=0
    )


def test_products_timed_on_this_machine_keep_the_reference_bits(
    tmp_path, tokenizer_dir, monkeypatch, several_threads
):
    """With every matrix big enough to be split across threads (as real ones are), the routes the
    tuner picks still give KempnerForge's logits bit for bit, and the kernels are listed."""
    monkeypatch.setattr(gemv, "MIN_SPLIT_BYTES", 1)
    run, ref = write_run(tmp_path, CONFIGS[sorted(CONFIGS)[0]], tokenizer=tokenizer_dir)
    backend = open_cpu(run)
    prompt = backend.render(PROMPT, None)
    one_row = torch.tensor([list(prompt.ids)[:1]])  # one row: the products take the timed routes
    with torch.no_grad():
        assert torch.equal(backend.model(one_row), ref(one_row))
    eos = backend.tok.eos_id
    assert reply_ids(backend, prompt, temperature=0.0, max_tokens=12) == reference_reply(
        ref, prompt.ids, 12, eos, temperature=0
    )
    shapes = {line.split(" ")[0] for line in backend.info().kernels}
    vocab, dim = backend.model.output.shape
    assert f"{vocab}×{dim}" in shapes


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.8, 20, 1.0), (1.3, 0, 0.9), (0.7, 50, 0.8)]
)
def test_seeded_sampling_equals_generate_after_manual_seed(
    tmp_path, tokenizer_dir, name, temperature, top_k, top_p
):
    run, ref = write_run(tmp_path, CONFIGS[name], tokenizer=tokenizer_dir)
    backend = open_cpu(run)
    prompt = backend.render(PROMPT, None)
    for seed in (0, 1234):
        torch.manual_seed(seed)
        want = reference_reply(
            ref, prompt.ids, 24, backend.tok.eos_id, temperature=temperature, top_k=top_k, top_p=top_p
        )
        got = reply_ids(
            backend, prompt, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, max_tokens=24
        )
        assert got == want


def test_bfloat16_follows_the_reference_cast_to_bfloat16(tmp_path, tokenizer_dir):
    run, ref = write_run(tmp_path, CONFIGS["gqa-qknorm"], tokenizer=tokenizer_dir)
    ref = ref.to(torch.bfloat16)
    backend = open_cpu(run, dtype="bfloat16")
    assert backend.info().precision == "bfloat16"
    prompt = backend.render(PROMPT, None)
    ids = torch.tensor([list(prompt.ids)])
    with torch.no_grad():
        assert torch.equal(backend.model(ids), ref(ids))
    torch.manual_seed(7)
    want = reference_reply(ref, prompt.ids, 16, backend.tok.eos_id, temperature=0.9, top_k=30)
    assert reply_ids(backend, prompt, temperature=0.9, top_k=30, seed=7, max_tokens=16) == want


def test_pipeline_stages_merge(tmp_path, tokenizer_dir):
    cfg = RefConfig(n_layers=3, n_kv_heads=2)
    run, ref = write_run(tmp_path, cfg, stages=2, tokenizer=tokenizer_dir)
    assert sorted(p.name for p in (run / "step_10").iterdir() if p.is_dir()) == ["pp0", "pp1"]
    backend = open_cpu(run)
    assert "2 pipeline stages" in backend.info().era
    prompt = backend.render(PROMPT, None)
    ids = torch.tensor([list(prompt.ids)])
    with torch.no_grad():
        assert torch.equal(backend.model(ids), ref(ids))


def test_chunk_appended_to_the_cache_equals_a_fresh_prefill(tmp_path, tokenizer_dir):
    """KempnerForge's own cache masks a multi-token append top-left; ours uses the offset mask."""
    run, _ = write_run(tmp_path, CONFIGS["gqa-qknorm"], tokenizer=tokenizer_dir)
    backend = open_cpu(run)
    first = backend.render(PROMPT, None)
    reply = reply_ids(backend, first, temperature=0.0, max_tokens=6)
    follow = backend.tok.encode(" and then the fox said")
    ids = (*first.ids, *reply, *follow)
    longer = Prompt((), ids, len(ids), 64)
    stats = GenerationStats()
    events = backend.stream(
        longer, SamplingParams(temperature=0.0, max_tokens=10), threading.Event(), stats=stats
    )
    cached = [ev.id for ev in events if not ev.continues]
    assert stats.prefilled_tokens == len(follow) + 1  # the prompt and reply before were in the cache
    assert reply_ids(open_cpu(run), longer, temperature=0.0, max_tokens=10) == cached


def test_the_reply_stops_at_max_seq_len_and_says_so(tmp_path, tokenizer_dir):
    limit = 24
    run, ref = write_run(tmp_path, RefConfig(max_seq_len=limit), tokenizer=tokenizer_dir)
    backend = open_cpu(run)
    prompt = backend.render(PROMPT, None)
    assert prompt.tokens < limit
    stats = GenerationStats()
    events = list(backend.stream(prompt, SamplingParams(temperature=0.0), threading.Event(), stats=stats))
    ids = [e.id for e in events if not e.continues]
    if stats.stopped != "stop_token":
        assert stats.stopped == "context"
        assert len(ids) == limit - prompt.tokens
    assert ids == reference_reply(ref, prompt.ids, limit - prompt.tokens, backend.tok.eos_id, temperature=0)


# --- safety ------------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", ["open", "system"])
def test_a_metadata_pickle_that_would_write_a_file_is_refused(tmp_path, tokenizer_dir, payload):
    import os

    run, _ = write_run(tmp_path, RefConfig(), tokenizer=tokenizer_dir)
    marker = tmp_path / "PWNED"

    class Shell:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = MarkerOnLoad(marker) if payload == "open" else Shell()
    (run / "step_10" / ".metadata").write_bytes(pickle.dumps(evil))
    message = failure(CheckpointError, open_cpu, run)
    assert "refused to unpickle" in message and ".metadata" in message
    assert not marker.exists()
    from desktop.engine.discovery import summarize

    assert "refused to unpickle" in summarize(run, 10).error
    assert not marker.exists()


def test_train_state_is_never_opened(tmp_path, tokenizer_dir):
    run, _ = write_run(tmp_path, RefConfig(), tokenizer=tokenizer_dir)
    open_cpu(run)
    assert not (run / "TRAIN_STATE_WAS_UNPICKLED").exists()


# --- config, tokenizer and layout --------------------------------------------------------------


def test_a_hub_id_resolves_from_the_local_cache(tmp_path, tokenizer_dir, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    snapshot = cache / "models--acme--tiny-tok" / "snapshots" / "0123abcd"
    write_tokenizer(snapshot)
    for name, content in GPT2_LIKE.items():  # as the gpt2 repo's files are
        (snapshot / name).write_text(json.dumps(content))
    (cache / "models--acme--tiny-tok" / "refs").mkdir(parents=True)
    (cache / "models--acme--tiny-tok" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cfg = RefConfig()
    run, _ = write_run(tmp_path, cfg, toml=False)
    write_toml(run / "train.toml", cfg, "acme/tiny-tok")
    backend = open_cpu(run)
    assert Path(backend.info().tokenizer) == snapshot / "tokenizer.json"
    assert backend.tok.eos_id == backend.tok.special_id(EOS)


def test_a_hub_id_that_is_not_cached_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-home"))
    cfg = RefConfig()
    run, _ = write_run(tmp_path, cfg, toml=False)
    write_toml(run / "train.toml", cfg, "acme/not-downloaded")
    message = failure(TokenizerError, open_cpu, run)
    assert "acme/not-downloaded" in message and "not in the local Hugging Face cache" in message
    assert "--tokenizer" in message


def test_a_missing_toml_gets_a_clear_message_and_config_fixes_it(tmp_path, tokenizer_dir):
    cfg = RefConfig()
    run, ref = write_run(tmp_path, cfg, toml=False)
    message = failure(CheckpointError, open_cpu, run)
    assert "do not store the model config" in message and "--config" in message
    elsewhere = write_toml(tmp_path / "elsewhere.toml", cfg, str(tokenizer_dir))
    backend = open_cpu(run, config=elsewhere)
    ids = torch.tensor([list(backend.render(PROMPT, None).ids)])
    with torch.no_grad():
        assert torch.equal(backend.model(ids), ref(ids))


def test_a_missing_tokenizer_gets_a_clear_message_and_tokenizer_fixes_it(tmp_path, tokenizer_dir):
    cfg = RefConfig()
    run, _ = write_run(tmp_path, cfg, toml=False)
    write_toml(run / "train.toml", cfg, str(tmp_path / "no-such-tokenizer"))
    message = failure(TokenizerError, open_cpu, run)
    assert "no-such-tokenizer" in message and "--tokenizer" in message
    assert open_cpu(run, tokenizer=tokenizer_dir).tok.path == tokenizer_dir / "tokenizer.json"


@pytest.mark.parametrize(
    ("extra_model", "extra", "field"),
    [
        ("num_experts = 8\nmoe_top_k = 2\n", "", "model.num_experts"),
        ("", '\n[vision_encoder]\ntype = "random"\n\n[vlm]\narch = "joint_decoder"\n', "[vlm]"),
        ('model_type = "mot"\n', "", "model.model_type"),
    ],
)
def test_moe_and_vlm_configs_are_refused_naming_the_field(tmp_path, tokenizer_dir, extra_model, extra, field):
    cfg = RefConfig()
    run, _ = write_run(tmp_path, cfg, toml=False)
    toml = write_toml(run / "train.toml", cfg, str(tokenizer_dir), extra=extra)
    toml.write_text(toml.read_text().replace("[model]\n", "[model]\n" + extra_model, 1))
    message = failure(UnsupportedFormatError, open_cpu, run)
    assert field in message and "not supported" in message


def test_a_toml_that_does_not_fit_the_weights_lists_the_difference(tmp_path, tokenizer_dir):
    cfg = RefConfig()
    run, _ = write_run(tmp_path, cfg, toml=False)
    write_toml(run / "train.toml", RefConfig(qk_norm=True), str(tokenizer_dir))
    message = failure(CheckpointError, open_cpu, run)
    assert "missing layers.0.attention.k_norm.weight" in message and "train.toml" in message
    write_toml(run / "train.toml", RefConfig(ffn_hidden_dim=64), str(tokenizer_dir))
    message = failure(CheckpointError, open_cpu, run)
    assert "layers.0.mlp.down_proj.weight [32, 256] (expected [32, 64])" in message


def test_steps_latest_and_step_directories(tmp_path, tokenizer_dir):
    run, last = write_run(tmp_path, RefConfig(), steps=(5, 10, 20), tokenizer=tokenizer_dir)
    assert open_cpu(run).info().step == 20
    (run / "latest").unlink()
    (run / "latest").symlink_to("step_10")
    assert open_cpu(run).info().step == 10
    assert open_cpu(run, step=5).info().step == 5
    backend = open_cpu(run / "step_20")
    assert backend.info().step == 20 and backend.info().path == str(run)
    prompt = backend.render(PROMPT, None)
    ids = torch.tensor([list(prompt.ids)])
    with torch.no_grad():
        assert torch.equal(backend.model(ids), last(ids))
    assert "available: 5, 10, 20" in failure(CheckpointError, open_cpu, run, step=7)
    (run / "step_30").mkdir()  # an unfinished save: no .metadata
    assert open_cpu(run).info().step == 10
    assert "incomplete" in failure(CheckpointError, open_cpu, run / "step_30")


def test_chat_is_refused_and_completion_keeps_the_end_of_a_long_text(tmp_path, tokenizer_dir):
    from desktop.engine.messages import Message

    run, _ = write_run(tmp_path, RefConfig(max_seq_len=32), tokenizer=tokenizer_dir)
    backend = open_cpu(run)
    assert not backend.info().capabilities.chat
    assert "no chat template" in failure(
        TokenizerError, backend.render, [Message.of_text("user", "hi")], 8, chat=True
    )
    long = " ".join(["the quick brown fox"] * 20)
    prompt = backend.render(long, 8)
    assert prompt.truncated and prompt.tokens == 32 - 8
    assert list(prompt.ids) == backend.tok.encode_prompt(long)[-24:]


TEMPLATE = (
    "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def test_a_chat_template_renders_to_the_ids_of_apply_chat_template(tmp_path):
    transformers = pytest.importorskip("transformers")
    from desktop.engine.messages import Message

    tok = write_tokenizer(tmp_path / "tok")
    (tok / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "chat_template": TEMPLATE}))
    run, _ = write_run(tmp_path, RefConfig(max_seq_len=64), tokenizer=tok)
    backend = open_cpu(run)
    assert backend.info().capabilities.chat
    turns = [("user", "Once upon a time"), ("assistant", "there was a fox."), ("user", "And then?")]
    messages = [Message.of_text(role, text) for role, text in turns]  # type: ignore[arg-type]
    prompt = backend.render(messages, None)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tok))
    want = theirs.apply_chat_template(
        [{"role": r, "content": t} for r, t in turns],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert list(prompt.ids) == list(want)
    short = backend.render(messages, 48)  # room for a reply: the oldest pair goes
    assert short.dropped_turns == 2 and short.tokens <= 64 - 16
    assert reply_ids(backend, prompt, temperature=0.0, max_tokens=4)


@pytest.mark.parametrize(
    "files",
    [
        {},  # eos_token in tokenizer_config.json
        GPT2_LIKE,  # the gpt2 hub files: the tokenizer class names <|endoftext|>
        {"tokenizer_config.json": {"model_max_length": 1024}},  # no EOS at all
        {"tokenizer_config.json": {"model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer"}},
    ],
)
def test_encoding_and_eos_match_autotokenizer(tmp_path, files):
    transformers = pytest.importorskip("transformers")
    from desktop.engine.kempnerforge.tokenizer import KFTokenizer

    directory = write_tokenizer(tmp_path / "tok")
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content))
    ours = KFTokenizer(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    for text in (PROMPT, "  spaced  out\n\nlines", "emoji 🙂 and <|endoftext|> inline"):
        assert ours.encode_prompt(text) == theirs.encode(text)
    assert ours.eos_id == theirs.eos_token_id
    assert ours.stop_ids == ({theirs.eos_token_id} if theirs.eos_token_id is not None else set())


# --- discovery and the command line ------------------------------------------------------------


def test_discovery_lists_every_step_and_summarises_without_weights(tmp_path, tokenizer_dir):
    from desktop.engine.discovery import discover, summarize

    run, ref = write_run(tmp_path, CONFIGS["gqa-qknorm"], steps=(5, 10), tokenizer=tokenizer_dir)
    (run / "step_10" / "__0_0.distcp").write_bytes(b"")  # no weight is read for a summary
    entries = [e for e in discover(tmp_path / "nanochat", [tmp_path]) if e.source == "kempnerforge"]
    assert [(e.path, e.steps) for e in entries] == [(run, [5, 10])]
    s = summarize(run, 10)
    assert s.error == ""
    assert s.params == sum(p.numel() for p in ref.parameters())
    assert (s.vocab_size, s.n_embd, s.n_layer, s.sequence_len) == (320, 32, 2, 64)
    assert s.stored_dtype == "float32" and s.kv_bytes_per_token == 2 * 2 * 16 * 4


def test_cli_generate_gives_the_reference_ids(tmp_path, tokenizer_dir, capsys):
    from desktop.cli.main import main

    cfg = CONFIGS["gqa-qknorm"]
    run, ref = write_run(tmp_path, cfg, toml=False)
    toml = write_toml(tmp_path / "train.toml", cfg, str(tokenizer_dir))
    home = ["--home", str(tmp_path / "home")]
    args = ["generate", str(run), "--prompt", PROMPT, "--max-tokens", "12", "--json"]
    assert main([*home, *args, "--temperature", "0"]) != 0  # no TOML next to the run
    capsys.readouterr()
    assert main([*home, *args, "--temperature", "0", "--config", str(toml)]) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    eos = write_tokenizer_eos(tokenizer_dir)
    assert done["ids"] == reference_reply(ref, done["prompt_ids"], 12, eos, temperature=0)
    # the TOML is remembered for this run; a step directory is the same run
    step_args = ["generate", str(run / "step_10"), "--prompt", PROMPT, "--max-tokens", "12", "--json"]
    assert main([*home, *step_args, "--temperature", "0.9", "--top-k", "40", "--seed", "5"]) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    torch.manual_seed(5)
    assert done["ids"] == reference_reply(ref, done["prompt_ids"], 12, eos, temperature=0.9, top_k=40)


def write_tokenizer_eos(tokenizer_dir: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).token_to_id(EOS)


# --- hand-built DCP variants (written with DCP's own metadata classes) -------------------------


def rewrite_metadata(step_dir: Path, edit) -> None:
    """Load the metadata this test's own dcp.save wrote, let ``edit`` change it, write it back."""
    with open(step_dir / ".metadata", "rb") as f:
        md = pickle.load(f)  # our own file, just written by dcp.save
    edit(md)
    with open(step_dir / ".metadata", "wb") as f:
        pickle.dump(md, f)


def split_into_chunks(
    step_dir: Path, key: str, tensor: torch.Tensor, *, dim: int, at: int, file: str
) -> None:
    """Store ``key`` as two chunks split at ``at`` along ``dim``, in another .distcp ``file`` (as
    the ranks of a sharded save would)."""
    import io

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    parts = tensor.split([at, tensor.shape[dim] - at], dim=dim)
    blobs, chunks, offset = b"", [], 0
    for i, part in enumerate(parts):
        buffer = io.BytesIO()
        torch.save(part.contiguous(), buffer)
        offsets = [0] * tensor.dim()
        offsets[dim] = 0 if i == 0 else at
        chunks.append((torch.Size(offsets), torch.Size(part.shape), offset, len(buffer.getvalue())))
        blobs += buffer.getvalue()
        offset += len(buffer.getvalue())
    (step_dir / file).write_bytes(blobs)

    def edit(md) -> None:
        entry = md.state_dict_metadata[key]
        entry.chunks = [ChunkStorageMetadata(offsets=o, sizes=s) for o, s, _, _ in chunks]
        for index in [i for i in md.storage_data if i.fqn == key]:
            del md.storage_data[index]
        for o, _, start, length in chunks:
            md.storage_data[MetadataIndex(key, o)] = _StorageInfo(file, start, length)

    rewrite_metadata(step_dir, edit)


def test_sharded_tensors_are_assembled_from_their_chunks(tmp_path, tokenizer_dir):
    cfg = CONFIGS["gqa-qknorm"]
    run, ref = write_run(tmp_path, cfg, tokenizer=tokenizer_dir)
    sd, step = ref.state_dict(), run / "step_10"
    q, up = "layers.0.attention.q_proj.weight", "layers.1.mlp.up_proj.weight"
    split_into_chunks(step, f"model.{q}", sd[q], dim=0, at=14, file="__1_0.distcp")
    split_into_chunks(step, f"model.{up}", sd[up], dim=1, at=9, file="__2_0.distcp")
    ids = torch.tensor([list(open_cpu(run).render(PROMPT, None).ids)])
    with torch.no_grad():
        assert torch.equal(open_cpu(run).model(ids), ref(ids))


def test_storage_outside_the_checkpoint_or_past_the_file_end_is_refused(tmp_path, tokenizer_dir):
    run, _ = write_run(tmp_path, RefConfig(), tokenizer=tokenizer_dir)
    step = run / "step_10"

    def escape(md) -> None:
        for info in md.storage_data.values():
            info.relative_path = "../../../outside.distcp"

    original = (step / ".metadata").read_bytes()
    rewrite_metadata(step, escape)
    assert "not a file in the checkpoint" in failure(CheckpointError, open_cpu, run)
    (step / ".metadata").write_bytes(original)
    from desktop.engine.kempnerforge.dcp_metadata import read_dcp_metadata

    storage = read_dcp_metadata(step).storage
    model_end = max(i.offset + i.length for (key, _), i in storage.items() if key.startswith("model."))
    data = (step / "__0_0.distcp").read_bytes()
    (step / "__0_0.distcp").write_bytes(data[: model_end - 10])
    assert "truncated" in failure(CheckpointError, open_cpu, run)


def test_optimizer_records_are_never_read(tmp_path, tokenizer_dir):
    from desktop.engine.kempnerforge.dcp_metadata import read_dcp_metadata

    run, ref = write_run(tmp_path, RefConfig(), tokenizer=tokenizer_dir)
    step = run / "step_10"
    meta = read_dcp_metadata(step)
    data = bytearray((step / "__0_0.distcp").read_bytes())
    optimizer = [item for (key, _), item in meta.storage.items() if key.startswith("optimizer.")]
    assert optimizer
    for item in optimizer:
        data[item.offset : item.offset + item.length] = b"\xff" * item.length
    (step / "__0_0.distcp").write_bytes(bytes(data))
    ids = torch.tensor([list(open_cpu(run).render(PROMPT, None).ids)])
    with torch.no_grad():
        assert torch.equal(open_cpu(run).model(ids), ref(ids))


def test_non_finite_weights_and_too_little_memory_are_refused(tmp_path, tokenizer_dir, monkeypatch):
    from desktop.engine.errors import OutOfMemoryError
    from desktop.engine.kempnerforge import backend as kempnerforge

    run, _ = write_run(tmp_path, RefConfig(), tokenizer=tokenizer_dir)
    monkeypatch.setattr(kempnerforge, "available_ram", lambda: 1000)
    message = failure(OutOfMemoryError, open_cpu, run)
    assert "of RAM as float32" in message and "1000 B is free" in message
    monkeypatch.undo()
    model = make_model(RefConfig(), seed=3)
    with torch.no_grad():
        model.layers["1"].mlp.down_proj.weight[0, 0] = float("nan")
    write_step(run, model, 20)
    assert "non-finite" in failure(CheckpointError, open_cpu, run)


def test_the_remembered_config_is_found_from_a_step_directory(tmp_path):
    from desktop.engine.kempnerforge.config import ConfigMemory

    run = tmp_path / "run"
    (run / "step_5").mkdir(parents=True)
    toml = tmp_path / "train.toml"
    toml.write_text("[model]\n")
    memory = ConfigMemory(tmp_path / "cache" / "kf.json")
    assert memory.get(run) is None
    memory.remember(run, toml)
    assert memory.get(run / "step_5") == toml.resolve()
    assert memory.get(run / "latest") == toml.resolve()
    (tmp_path / "cache" / "kf.json").write_text("{not json")
    assert memory.get(run) is None


def test_the_tokenizer_json_post_processor_decides_as_in_autotokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    from desktop.engine.kempnerforge.tokenizer import KFTokenizer

    directory = write_tokenizer(tmp_path / "tok")
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": EOS, "bos_token": EOS, "add_bos_token": True, "add_eos_token": True})
    )
    ours = KFTokenizer(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    assert ours.encode_prompt(PROMPT) == theirs.encode(PROMPT)


def test_nanoscope_list_shows_the_runs(tmp_path, tokenizer_dir, capsys):
    from desktop.cli.main import main

    run, _ = write_run(tmp_path / "base", RefConfig(), steps=(5, 10), tokenizer=tokenizer_dir)
    assert main(["--home", str(tmp_path / "home"), "list", "--base-dir", str(tmp_path / "base")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "kempnerforge" in x)
    assert "tiny" in line and "[5, 10]" in line and "KempnerForge dense" in line and str(run) in line


def test_hostile_toml_and_tokenizer_files_get_one_line(tmp_path, tokenizer_dir):
    cfg = RefConfig()
    run, _ = write_run(tmp_path, cfg, toml=False)
    deep = run / "deep.toml"
    deep.write_text("a = " + "[" * 50_000 + "]" * 50_000)
    assert "nested deeper than 64 levels" in failure(CheckpointError, open_cpu, run, config=deep)
    tok = write_tokenizer(tmp_path / "tok")
    (tok / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    write_toml(run / "train.toml", cfg, str(tok))
    assert "tokenizer_config.json" in failure(TokenizerError, open_cpu, run)


def test_a_distribution_that_cannot_be_sampled_takes_its_most_likely_token(tmp_path, tokenizer_dir):
    """KempnerForge's multinomial would raise on the NaN of an overflowing temperature."""
    run, ref = write_run(tmp_path, RefConfig(), tokenizer=tokenizer_dir)
    backend = open_cpu(run)
    prompt = backend.render(PROMPT, None)
    stats = GenerationStats()
    params = SamplingParams(temperature=1e-300, max_tokens=8)  # logits / t overflow to inf: softmax is NaN
    got = [ev.id for ev in backend.stream(prompt, params, threading.Event(), stats=stats) if not ev.continues]
    assert got == reference_reply(ref, prompt.ids, 8, backend.tok.eos_id, temperature=0)
    assert stats.greedy_fallbacks == len(got)
