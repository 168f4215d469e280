"""The bundled demo checkpoint: loads through the real engine, fits its budget, and uses its calculator."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from desktop.engine.chat_format import render_conversation
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, Part
from desktop.engine.sampling import SamplingParams
from desktop.engine.session import ChatSession
from desktop.engine.tokenizer import SPECIAL_TOKENS, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "resources" / "demo"
CKPT = DEMO / "chatsft_checkpoints" / "demo"
MAX_BYTES = 10_000_000


@pytest.fixture(scope="module")
def session() -> ChatSession:
    return ChatSession.open(CKPT)


@pytest.fixture(scope="module")
def train_demo():
    """packaging/train_demo.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("train_demo", ROOT / "packaging" / "train_demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_demo"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("train_demo", None)


def test_demo_fits_in_ten_megabytes() -> None:
    files = [f for f in DEMO.rglob("*") if f.is_file()]
    assert files
    assert sum(f.stat().st_size for f in files) <= MAX_BYTES


def test_demo_has_nanochat_layout_and_meta() -> None:
    models = sorted(CKPT.glob("model_*.pt"))
    assert len(models) == 1
    step = int(models[0].stem.split("_")[1])
    assert models[0].name == f"model_{step:06d}.pt"
    meta = json.loads((CKPT / f"meta_{step:06d}.json").read_text(encoding="utf-8"))
    assert meta["step"] == step
    assert {"val_bpb", "val_loss", "user_config"} <= set(meta)
    assert set(meta["model_config"]) == {
        "sequence_len",
        "vocab_size",
        "n_layer",
        "n_head",
        "n_kv_head",
        "n_embd",
        "window_pattern",
    }


def test_demo_tokenizer_ends_with_nanochat_specials() -> None:
    tok = load_tokenizer(DEMO / "tokenizer" / "tokenizer.pkl")
    V = tok.vocab_size
    assert [tok.special_name(i) for i in range(V - 9, V)] == list(SPECIAL_TOKENS)
    assert tok.special_name(V - 10) is None
    text = "What is 12 times 7? There are 3 r in strawberry."
    assert tok.decode(tok.encode(text)) == text


def test_demo_loads_as_current_nanochat(session: ChatSession) -> None:
    info = session.info()
    assert info["era"] == "E7"
    assert session.chat_mode
    assert info["vocab_size"] == session.tok.vocab_size


def test_twelve_times_seven_goes_through_the_calculator(session: ChatSession) -> None:
    prompt = session.render([Message.of_text("user", "What is 12 times 7?")], 64).ids
    events = list(session.generate(prompt, SamplingParams(temperature=0.0, max_tokens=64), reuse_cache=False))
    specials = [(e.special, e.forced) for e in events if e.special is not None]
    # The model writes the call; the engine forces the calculator's result; the model ends the turn.
    assert specials == [
        ("<|python_start|>", False),
        ("<|python_end|>", False),
        ("<|output_start|>", True),
        ("<|output_end|>", True),
        ("<|assistant_end|>", False),
    ]
    call = "".join(e.text for e in events if e.kind == PYTHON and e.special is None)
    output = [e for e in events if e.kind == PYTHON_OUTPUT and e.special is None]
    assert eval(call, {"__builtins__": {}}) == 12 * 7  # the expression itself, evaluated by Python
    assert "".join(e.text for e in output) == str(12 * 7)
    assert output and all(e.forced for e in output)
    reply = "".join(e.text for e in events if e.kind == TEXT)
    assert str(12 * 7) in reply
    assert not any(e.forced for e in events if e.kind == TEXT)


def test_training_render_matches_the_engine_and_masks_like_nanochat(train_demo) -> None:
    tok = load_tokenizer(DEMO / "tokenizer" / "tokenizer.pkl")
    messages = [
        Message.of_text("user", "How much is 100 divided by 4?"),
        Message(
            role="assistant",
            parts=[
                Part(PYTHON, "100/4"),
                Part(PYTHON_OUTPUT, str(100 / 4)),
                Part(TEXT, "100 divided by 4 is 25.0."),
            ],
        ),
        Message.of_text("user", "hi"),
        Message.of_text("assistant", "Hello!"),
    ]
    example = train_demo.render_chat(tok, messages)
    assert example.ids == render_conversation(tok, messages)
    trained = [
        tok.special_name(i) or tok.decode([i]) for i, m in zip(example.ids, example.mask, strict=True) if m
    ]
    expected = [
        "<|python_start|>",
        *(tok.decode([i]) for i in tok.encode("100/4")),
        "<|python_end|>",
        *(tok.decode([i]) for i in tok.encode("100 divided by 4 is 25.0.")),
        "<|assistant_end|>",
        *(tok.decode([i]) for i in tok.encode("Hello!")),
        "<|assistant_end|>",
    ]
    assert trained == expected


def test_bpe_trainer_merges_the_most_frequent_pair_first_and_round_trips(train_demo) -> None:
    texts = ["abab abab cdcd", "ababab xy"]
    ranks = train_demo.train_bpe(texts, 260)
    assert ranks == train_demo.train_bpe(texts, 260)
    assert sorted(ranks.values()) == list(range(len(ranks)))
    assert all(ranks[bytes([b])] == b for b in range(256))
    split = train_demo.regex.compile(train_demo.SPLIT_PATTERN)
    pairs: Counter[bytes] = Counter()
    for chunk in (c for t in texts for c in split.findall(t)):
        raw = chunk.encode()
        pairs.update(raw[i : i + 2] for i in range(len(raw) - 1))
    assert ranks[pairs.most_common(1)[0][0]] == 256
    enc = train_demo.build_encoding(ranks)
    assert enc.decode(enc.encode_ordinary("abab cdcd zz")) == "abab cdcd zz"
