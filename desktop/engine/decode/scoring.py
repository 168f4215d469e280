"""Teacher-forced scoring: how likely a checkpoint finds a given reply to a given prompt.

The Compare view scores one pane's reply under every pane's checkpoint ("cross-scoring"): a
later checkpoint that gives an earlier one's reply a much lower probability has moved away
from it. One forward pass over prompt + reply gives, at each position, the distribution the
model predicts for the next token; the log-probability of the token the reply actually has
there is its score. These are the raw model probabilities (softcapped logits, no temperature,
no top-k), the same quantity the generation overlay shows.

The averages cover the tokens the model chose: tokens forced by the calculator (its results,
which nanochat's SFT also masks out of the loss) can be left out with ``skip``, though they still
sit in the sequence the model reads. Bits per byte follows nanochat's ``evaluate_bpb``: special
tokens carry no bytes and are left out of both sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from desktop.engine.errors import ContextError

if TYPE_CHECKING:
    from desktop.engine.decode.protocols import DecodingModel as GPT
    from desktop.engine.decode.protocols import Tokenizer


def token_label(tok: Tokenizer, token_id: int) -> str:
    """How one token reads on its own: a special token by name, else its decoded text."""
    return tok.special_name(token_id) or tok.decode([token_id])


def score_reply(
    model: GPT,
    tok: Tokenizer,
    prompt_ids: Sequence[int],
    reply_ids: Sequence[int],
    top: int = 0,
    skip: Sequence[bool] | None = None,
    choices: Sequence[int] = (),
) -> dict[str, Any]:
    """Score ``reply_ids`` as the continuation of ``prompt_ids`` by teacher forcing.

    Returns ``mean_logprob`` (natural log, per scored token), ``bits_per_byte`` (over the scored
    non-special tokens; None when they decode to no bytes), ``tokens`` (scored), ``bytes``,
    ``token_logprobs`` (one per reply token, skipped ones included) and, when ``top`` > 0,
    ``top``: per token the ``top`` most likely tokens as ``[id, label, logprob]``. ``skip`` marks
    reply tokens to leave out of the averages (forced ones). ``choices``: token ids whose
    log-probabilities at the reply's first position come back as ``choice_logprobs`` (the
    letters of a multiple-choice question, from the one pass). A prompt too long for the model's
    rotary table loses its oldest tokens; the reply itself is never cut.
    """
    import torch

    reply = [int(t) for t in reply_ids]
    if not reply:
        raise ContextError("there is no reply to score")
    limit = model.config.rope_len
    if len(reply) >= limit:
        raise ContextError(f"the reply has {len(reply)} tokens; this model's rotary table holds {limit}")
    prompt = [int(t) for t in prompt_ids][-(limit - len(reply)) :]
    if not prompt:
        raise ContextError("the prompt is empty")
    with torch.inference_mode():
        ids = torch.tensor([prompt + reply], dtype=torch.long, device=model.device)
        # Position i predicts token i + 1, so the reply's predictions start one before it.
        logits = model(ids)[0, len(prompt) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        target = torch.tensor(reply, dtype=torch.long, device=logprobs.device)
        chosen = logprobs.gather(1, target.unsqueeze(1))[:, 0].tolist()
        alternatives = logprobs.topk(min(top, logprobs.size(-1)), dim=-1) if top > 0 else None
        vocab = logprobs.size(-1)
        picked = [float(logprobs[0, c]) if 0 <= c < vocab else -math.inf for c in choices]
    skipped = list(skip) if skip is not None else [False] * len(reply)
    if len(skipped) != len(reply):
        raise ValueError(f"skip has {len(skipped)} flags for {len(reply)} reply tokens")
    scored = [(t, lp) for t, lp, s in zip(reply, chosen, skipped, strict=True) if not s]
    text = [(t, lp) for t, lp in scored if tok.special_name(t) is None]
    n_bytes = len(tok.decode([t for t, _ in text]).encode("utf-8")) if text else 0
    result: dict[str, Any] = {
        "mean_logprob": sum(lp for _, lp in scored) / len(scored) if scored else None,
        "bits_per_byte": -sum(lp for _, lp in text) / math.log(2) / n_bytes if n_bytes else None,
        "tokens": len(scored),
        "bytes": n_bytes,
        "token_logprobs": chosen,
    }
    if choices:
        result["choice_logprobs"] = picked
    if alternatives is not None:
        values, indices = alternatives.values.tolist(), alternatives.indices.tolist()
        result["top"] = [
            [[i, token_label(tok, i), v] for i, v in zip(row_ids, row_values, strict=True)]
            for row_ids, row_values in zip(indices, values, strict=True)
        ]
    return result
