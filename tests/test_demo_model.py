"""The bundled demo model and its trainer (tools/demo).

The shipped files: they load through the app's own backend, hold several steps of one run, fit
their budget, and answer follow-up questions in one chat. The trainer: it renders chats exactly
like the engine and masks them like nanochat, its tokenizer is nanochat's format, and a tiny run
of it writes the same bytes twice and gives files the engine loads.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
from pathlib import Path

import pytest
import torch

from desktop.engine.backend import LoadOptions, StreamOptions
from desktop.engine.calculator import calculate
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message
from desktop.engine.nanochat.chat_format import render_conversation
from desktop.engine.nanochat.checkpoint import load_state_dict, model_steps
from desktop.engine.nanochat.special_tokens import SPECIAL_TOKENS
from desktop.engine.nanochat.tokenizer import load_tokenizer
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend
from tools.demo.data import ChatMaker, messages
from tools.demo.examples import render_chat
from tools.demo.grading import ask, final_number
from tools.demo.settings import PRESETS

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "resources" / "demo"
CKPT = DEMO / "chatsft_checkpoints" / "demo"
TOKENIZER = DEMO / "tokenizer" / "tokenizer.pkl"
MAX_BYTES = 16_000_000  # several steps; the app bundle and the repo carry all of them


@pytest.fixture(scope="module")
def backend():
    b = open_backend(CKPT, LoadOptions())
    yield b
    b.close()


def test_demo_fits_its_budget() -> None:
    files = [f for f in DEMO.rglob("*") if f.is_file()]
    assert files
    assert sum(f.stat().st_size for f in files) <= MAX_BYTES


def test_demo_ships_several_steps_of_one_run_in_nanochat_layout() -> None:
    steps = model_steps(CKPT)
    assert len(steps) >= 3
    metas = [json.loads((CKPT / f"meta_{step:06d}.json").read_text(encoding="utf-8")) for step in steps]
    assert [m["step"] for m in metas] == steps
    assert all(m["model_config"] == metas[0]["model_config"] for m in metas)
    assert all(m["user_config"] == metas[0]["user_config"] for m in metas)
    assert set(metas[0]["model_config"]) == {
        "sequence_len",
        "vocab_size",
        "n_layer",
        "n_head",
        "n_kv_head",
        "n_embd",
        "window_pattern",
    }
    assert metas[0]["model_config"]["sequence_len"] >= 1024
    # Compare's step sweep needs a visibly worse early step.
    assert metas[0]["val_loss"] > 1.5 * metas[-1]["val_loss"]


def test_demo_ships_a_smaller_depth_of_its_miniseries_as_a_draft() -> None:
    """The draft for speculative decoding: the same data, seed and tokenizer, fewer layers."""
    draft = CKPT.parent / "demo-d2"
    (step,) = model_steps(draft)
    meta = json.loads((draft / f"meta_{step:06d}.json").read_text(encoding="utf-8"))
    target = json.loads((CKPT / f"meta_{model_steps(CKPT)[-1]:06d}.json").read_text(encoding="utf-8"))
    assert meta["model_config"]["n_layer"] < target["model_config"]["n_layer"]
    same = {k: v for k, v in target["model_config"].items() if k != "n_layer"}
    assert {k: meta["model_config"][k] for k in same} == same
    data = ("seed", "conversations", "max_exchanges", "documents", "vocab_size")
    assert all(meta["user_config"][k] == target["user_config"][k] for k in data)
    assert {k: v for k, v in meta["user_config"].items() if k != "trainer"} == PRESETS["draft"].for_meta()


def test_matrices_are_stored_in_bfloat16_and_scalars_in_float32() -> None:
    sd = load_state_dict(CKPT / f"model_{model_steps(CKPT)[-1]:06d}.pt")
    assert {t.dtype for t in sd.values() if t.ndim >= 2} == {torch.bfloat16}
    assert {t.dtype for t in sd.values() if t.ndim < 2} == {torch.float32}


def test_demo_tokenizer_ends_with_nanochat_specials() -> None:
    tok = load_tokenizer(TOKENIZER)
    V = tok.vocab_size
    assert [tok.special_name(i) for i in range(V - 9, V)] == list(SPECIAL_TOKENS)
    assert tok.special_name(V - 10) is None
    text = "What is 12 times 7? There are 3 r in strawberry."
    assert tok.decode(tok.encode(text)) == text


def test_every_step_loads_as_current_nanochat() -> None:
    for step in model_steps(CKPT):
        b = open_backend(CKPT, LoadOptions(step=step))
        info = b.info()
        b.close()
        assert (info.era, info.step, info.capabilities.chat) == ("E7", step, True)


def test_twelve_times_seven_goes_through_the_calculator(backend) -> None:
    prompt = backend.render([Message.of_text("user", "What is 12 times 7?")], 64)
    params = SamplingParams(temperature=0.0, max_tokens=64)
    events = list(backend.stream(prompt, params, threading.Event(), StreamOptions(reuse_cache=False)))
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
    assert calculate(call) == 12 * 7
    assert "".join(e.text for e in output) == str(12 * 7)
    assert output and all(e.forced for e in output)
    reply = "".join(e.text for e in events if e.kind == TEXT)
    assert str(12 * 7) in reply
    assert not any(e.forced for e in events if e.kind == TEXT)


# Questions in the shape of the ones that broke down in the old 256-token demo's tenth turn, in
# one chat with the model's own replies as history; the last two refer to the previous result.
# Each pairs the question with the Python expression of its answer.
FOLLOW_UPS = (
    ("What is 12 times 7?", "12*7"),
    ("How many s are in mississippi?", "'mississippi'.count('s')"),
    ("What is 23 plus 19?", "23+19"),
    ("What is 50 minus 8?", "50-8"),
    ("How much is 144 divided by 12?", "144/12"),
    ("What is 7 times 8?", "7*8"),
    ("What is 99 plus 1?", "99+1"),
    ("What is 64 divided by 8?", "64/8"),
    ("Add 2 to that.", "64/8+2"),
    ("Multiply that by 3.", "(64/8+2)*3"),
)


def test_a_long_chat_keeps_answering_follow_ups(backend) -> None:
    history: list[Message] = []
    for question, expr in FOLLOW_UPS:
        reply = ask(backend, history, question)
        expected = calculate(expr)
        outputs = [p.text for p in reply.parts if p.kind == PYTHON_OUTPUT]
        assert outputs == [str(expected)], (question, reply.parts)
        assert final_number(reply.plain_text()) == expected, (question, reply.parts)
        history += [Message.of_text("user", question), reply]


def test_the_earliest_step_answers_worse_than_the_last() -> None:
    """What a newcomer sees in Compare's step sweep: the same chat, fewer right answers early on."""
    right = {}
    for step in (model_steps(CKPT)[0], model_steps(CKPT)[-1]):
        b = open_backend(CKPT, LoadOptions(step=step))
        history: list[Message] = []
        right[step] = 0
        for question, expr in FOLLOW_UPS:
            reply = ask(b, history, question)
            right[step] += final_number(reply.plain_text()) == calculate(expr)
            history += [Message.of_text("user", question), reply]
        b.close()
    first, last = right.values()
    assert first < last == len(FOLLOW_UPS)


def test_training_render_matches_the_engine_and_masks_like_nanochat() -> None:
    tok = load_tokenizer(TOKENIZER)
    maker = ChatMaker(random.Random(0), ["banana", "letter"])
    for _ in range(20):
        chat = messages(maker.training_chat(6))
        example = render_chat(tok, chat)
        assert example.ids == render_conversation(tok, chat)
        # Trained on: each assistant turn's call (with its delimiters), sentence and end token;
        # not on the user's turns nor on the calculator output the engine forces.
        expected: list[int] = []
        for m in chat:
            if m.role == "assistant":
                for part in m.parts:
                    body = tok.encode(part.text)
                    if part.kind == PYTHON:
                        expected += [
                            tok.special_id("<|python_start|>"),
                            *body,
                            tok.special_id("<|python_end|>"),
                        ]
                    elif part.kind == TEXT:
                        expected += body
                expected.append(tok.special_id("<|assistant_end|>"))
        assert [i for i, m in zip(example.ids, example.mask, strict=True) if m] == expected


def test_learned_tokenizer_is_nanochats_format_and_deterministic(tmp_path) -> None:
    pytest.importorskip("rustbpe", reason="the trainer's tokenizer needs the demo extra")
    from tools.demo import bpe

    texts = ["What is 12 times 7? 12 times 7 is 84."] * 30 + ["How many r are in strawberry?"] * 20
    texts += [bytes(range(32, 127)).decode() * 3]
    ranks = bpe.learn_ranks(texts, 300)
    assert ranks == bpe.learn_ranks(texts, 300)
    assert all(ranks[bytes([b])] == b for b in range(256))
    assert sorted(ranks.values()) == list(range(291))
    path = tmp_path / "tokenizer.pkl"
    bpe.save_encoding(bpe.build_encoding(ranks), path)
    tok = load_tokenizer(path)  # the app's restricted loader
    assert tok.vocab_size == 300
    assert [tok.special_name(i) for i in range(291, 300)] == list(SPECIAL_TOKENS)
    text = "What is 12 times 7?"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) < len(text.encode())  # merges were learned and are used
    with pytest.raises(bpe.TokenizerTrainingError):
        bpe.learn_ranks(["ab"], 300)


def _hashes(out: Path) -> dict[str, str]:
    return {
        str(f.relative_to(out)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(out.rglob("*"))
        if f.is_file()
    }


def test_tiny_training_run_is_deterministic_and_loads_in_the_engine(tmp_path) -> None:
    pytest.importorskip("rustbpe", reason="the trainer's tokenizer needs the demo extra")
    from tools.demo.cli import main

    threads = torch.get_num_threads()
    runs = [tmp_path / "a", tmp_path / "b"]
    for out in runs:
        assert main(["--preset", "tiny", "--out", str(out), "--no-grade"]) == 0
    assert torch.get_num_threads() == threads
    first, second = (_hashes(out) for out in runs)
    assert first == second
    ckpt = runs[0] / "chatsft_checkpoints" / "demo"
    assert model_steps(ckpt) == PRESETS["tiny"].snapshot_steps
    for step in model_steps(ckpt):
        b = open_backend(ckpt, LoadOptions(step=step))
        assert b.info().era == "E7"
        reply = ask(b, [], "What is 12 times 7?")  # untrained: any reply, but a whole one
        assert reply.role == "assistant"
        b.close()


def test_trainer_refuses_impossible_settings_with_one_line(capsys) -> None:
    from tools.demo.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--preset", "tiny", "--steps", "1", "--snapshots", "2"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("python -m tools.demo: error: ")
