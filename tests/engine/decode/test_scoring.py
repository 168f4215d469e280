"""Teacher-forced scoring and the memory estimate, without Qt.

Scores are checked against an independent route to the same numbers: the KV-cached decode the
generator uses (prefill the prompt, then feed the reply one token at a time), not a second copy
of the full forward pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from support import backend_helpers
from support.checkpoint_factory import write_checkpoint

from desktop.engine.backend import LoadOptions
from desktop.engine.decode.kvcache import KVCache
from desktop.engine.decode.scoring import score_reply
from desktop.engine.discovery import CheckpointSummary, summarize
from desktop.engine.errors import ContextError
from desktop.engine.kernels import memory
from desktop.engine.messages import Message
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.params import SamplingParams


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> NanochatBackend:
    base = tmp_path_factory.mktemp("nanochat")
    directory = write_checkpoint(base, "E7", phase="chatsft", tokenizer="pkl")
    return NanochatBackend.open(directory, LoadOptions(step=10, device="cpu"))


def _reply(session: NanochatBackend, text: str, n: int = 20) -> tuple[list[int], list[int]]:
    prompt = list(session.render([Message.of_text("user", text)], n).ids)
    params = SamplingParams(temperature=1.0, max_tokens=n, seed=3)
    reply = backend_helpers.reply_ids(session, prompt, params, reuse_cache=False)
    return prompt, reply


def _cached_logprobs(session: NanochatBackend, prompt: list[int], reply: list[int]) -> list[float]:
    """Each reply token's log-probability through the incremental (KV-cached) path."""
    model = session.model
    cache = KVCache(model.config, 1, len(prompt) + len(reply), model.device, model.compute_dtype)
    out = []
    with torch.inference_mode():
        logits = model(torch.tensor([prompt]), cache, last_only=True)[0, -1]
        for token in reply:
            out.append(torch.log_softmax(logits.float(), dim=-1)[token].item())
            logits = model(torch.tensor([[token]]), cache)[0, -1]
    return out


def test_score_matches_the_cached_decode_path(session):
    prompt, reply = _reply(session, "hello there")
    assert len(reply) > 3
    result = score_reply(session.model, session.tok, prompt, reply)
    expected = _cached_logprobs(session, prompt, reply)
    assert result["tokens"] == len(reply)
    assert result["token_logprobs"] == pytest.approx(expected, abs=1e-4)
    assert result["mean_logprob"] == pytest.approx(sum(expected) / len(expected), abs=1e-4)


def test_bits_per_byte_counts_text_tokens_and_their_utf8_bytes(session):
    prompt, reply = _reply(session, "count the bytes")
    special = session.tok.special_id("<|assistant_end|>")
    reply = [*reply, special]  # a special token carries no bytes and no weight in bits per byte
    result = score_reply(session.model, session.tok, prompt, reply)
    lps = _cached_logprobs(session, prompt, reply)
    text = [(t, lp) for t, lp in zip(reply, lps, strict=True) if session.tok.special_name(t) is None]
    n_bytes = len(session.tok.decode([t for t, _ in text]).encode("utf-8"))
    assert result["bytes"] == n_bytes > 0
    assert result["bits_per_byte"] == pytest.approx(
        -sum(lp for _, lp in text) / math.log(2) / n_bytes, rel=1e-4
    )


def test_skipped_tokens_stay_in_the_sequence_but_leave_the_averages(session):
    prompt, reply = _reply(session, "a calculator answer")
    skip = [i % 3 == 1 for i in range(len(reply))]  # as if the calculator had forced these
    result = score_reply(session.model, session.tok, prompt, reply, skip=skip)
    lps = _cached_logprobs(session, prompt, reply)
    kept = [(t, lp) for t, lp, s in zip(reply, lps, skip, strict=True) if not s]
    assert result["token_logprobs"] == pytest.approx(lps, abs=1e-4)  # every token, as read in context
    assert result["tokens"] == len(kept)
    assert result["mean_logprob"] == pytest.approx(sum(lp for _, lp in kept) / len(kept), abs=1e-4)
    text = [t for t, _ in kept if session.tok.special_name(t) is None]
    assert result["bytes"] == len(session.tok.decode(text).encode("utf-8"))
    with pytest.raises(ValueError, match="flags"):
        score_reply(session.model, session.tok, prompt, reply, skip=[True])


def test_top_alternatives_are_the_most_likely_tokens_in_order(session):
    prompt, reply = _reply(session, "alternatives", n=6)
    result = score_reply(session.model, session.tok, prompt, reply, top=5)
    assert len(result["top"]) == len(reply)
    for row, chosen in zip(result["top"], result["token_logprobs"], strict=True):
        lps = [lp for _, _, lp in row]
        assert lps == sorted(lps, reverse=True) and len(row) == 5
        assert chosen <= lps[0] + 1e-6
        assert sum(math.exp(lp) for lp in lps) <= 1 + 1e-5
        assert all(label == (session.tok.special_name(i) or session.tok.decode([i])) for i, label, _ in row)


def test_choices_get_the_first_positions_log_probabilities_from_the_same_pass(session):
    prompt, reply = _reply(session, "choices", n=3)
    top = score_reply(session.model, session.tok, prompt, reply, top=3)["top"][0]
    ids = [i for i, _, _ in top]
    result = score_reply(session.model, session.tok, prompt, reply[:1], choices=[*ids, 10**9])
    # Each choice's log-probability is the one the top list gives it; an id past the vocabulary has none.
    assert result["choice_logprobs"][:3] == pytest.approx([lp for _, _, lp in top], abs=1e-5)
    assert result["choice_logprobs"][3] == -math.inf


def test_a_prompt_too_long_keeps_its_end_and_the_whole_reply(session):
    prompt, reply = _reply(session, "short")
    limit = session.model.config.rope_len
    long_prompt = [prompt[0]] * (limit + 50) + prompt
    result = score_reply(session.model, session.tok, long_prompt, reply)
    kept = long_prompt[-(limit - len(reply)) :]
    assert result["token_logprobs"] == pytest.approx(_cached_logprobs(session, kept, reply), abs=1e-4)


def test_nothing_to_score_is_a_readable_error(session):
    with pytest.raises(ContextError, match="no reply"):
        score_reply(session.model, session.tok, [1, 2], [])
    too_long = [1] * session.model.config.rope_len
    with pytest.raises(ContextError, match="rotary table"):
        score_reply(session.model, session.tok, [1], too_long)


# ----- memory -----------------------------------------------------------------------------------


def test_available_ram_reads_meminfo_and_is_plausible():
    ram = memory.available_ram()
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total = next(
            int(line.split()[1]) * 1024 for line in meminfo.read_text().splitlines() if "MemTotal" in line
        )
        assert 0 < ram <= total
    else:
        assert ram is None or ram > 0


def test_fits_compares_estimates_with_free_memory(tmp_path, monkeypatch):
    directory = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer="pkl")
    summary = summarize(directory, 10)
    assert not summary.error
    need = 2 * summary.memory_estimate(4)
    monkeypatch.setattr(memory, "available_ram", lambda: need - 1)
    ok, needed, available, message = memory.fits([summary, summary], "cpu", "float32")
    assert (ok, needed, available) == (False, need, need - 1)
    assert "RAM" in message and "float32" in message and "\n" not in message
    # A model already loaded counts as free memory it would give back.
    ok, _needed, available, message = memory.fits([summary, summary], "cpu", "float32", loaded=[summary])
    assert ok and available == need - 1 + summary.memory_estimate(4) and message == ""
    assert memory.fits([summary], "cpu", "bfloat16")[1] == summary.memory_estimate(2)


def test_unreadable_summaries_and_unknown_free_memory_do_not_warn(monkeypatch):
    broken = CheckpointSummary(Path("x"), 1, "?", 0, 0, 0, 0, 0, "?", 0, 0, error="cannot read")
    monkeypatch.setattr(memory, "available_ram", lambda: 0)
    assert memory.fits([broken], "cpu")[0]
    monkeypatch.setattr(memory, "available_ram", lambda: None)
    huge = CheckpointSummary(Path("y"), 1, "E7", 10**12, 2048, 65536, 32, 2048, "bfloat16", 0, 0)
    assert memory.fits([huge], "cpu") == (True, huge.memory_estimate(4), 0, "")
