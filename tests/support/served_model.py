"""A real OpenAI-compatible server for the tests: ``transformers serve`` on 127.0.0.1 with a tiny
Llama made here by ``save_pretrained`` (random weights, a small byte-level BPE tokenizer with a
chat template), started once per test session and stopped when the session ends.

The model sits in a private Hugging Face cache folder, so the server lists it under
``/v1/models`` and loads it offline; nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

MODEL = "nanoscope/tiny-llama"
START_TIMEOUT_S = 180.0
REVISION = "0" * 40
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user_start|>{{ m['content'] }}<|user_end|>"
    "{% elif m['role'] == 'assistant' %}<|assistant_start|>{{ m['content'] }}<|assistant_end|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant_start|>{% endif %}"
)
CORPUS = "hello world, the quick brown fox jumps over the lazy dog. héllo wörld ünïcode 日本語 "


@dataclass
class Served:
    url: str
    model: str
    model_dir: Path  # the same weights and tokenizer, for a local reference


def write_tiny_model(out: Path) -> None:
    """A 2-layer Llama and its tokenizer, saved as a Hugging Face model folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|assistant_end|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(out)


def local_greedy(served: Served, text: str | list[dict[str, str]], n: int) -> str:
    """The same model and chat template run in this process by transformers: the reference.
    ``text``: one user message, or a whole conversation as OpenAI-style messages."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(served.model_dir)
    model = AutoModelForCausalLM.from_pretrained(served.model_dir)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}] if isinstance(text, str) else text,
        add_generation_prompt=True,
        return_tensors="pt",
    )
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=n, do_sample=False)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    # transformers serve's DecodeStream never sends a character still unfinished when the reply
    # stops (the random tiny model often ends inside one; a full decode shows it as U+FFFD), and
    # it gives neither ids nor bytes a client could restore it from (tests/engine/remote/
    # test_reply_ends.py restores it where a server gives the bytes).
    return text.removesuffix("\ufffd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_served: Served | None = None
_failure: str | None = None


def served_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Served:
    """The running server (started on first use), or a skip with the reason it could not start."""
    global _served, _failure
    if _served is not None:
        return _served
    if _failure is not None:
        pytest.skip(_failure)
    try:
        _served = _start(request, tmp_path_factory.mktemp("served"))
    except Exception as exc:  # any reason: the tests that need a real server skip with it
        _failure = f"transformers serve could not start: {exc}"
        pytest.skip(_failure)
    return _served


def _start(request: pytest.FixtureRequest, root: Path) -> Served:
    if shutil.which("transformers", path=str(Path(sys.executable).parent)) is None:
        raise RuntimeError("no `transformers` command (pip install 'transformers[serving]>=5')")
    cache = root / "hub"
    org, name = MODEL.split("/")
    repo = cache / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    write_tiny_model(snapshot)
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "TRANSFORMERS_VERBOSITY": "error"}
    log = (root / "serve.log").open("wb")
    command = [str(Path(sys.executable).parent / "transformers"), "serve", MODEL, "--device", "cpu"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()

    request.config.add_cleanup(stop)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (root / "serve.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"it exited with {proc.returncode}: {' '.join(tail)}")
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return Served(url, MODEL, snapshot)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no answer on {url} within {START_TIMEOUT_S:g} s")
