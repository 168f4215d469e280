"""``nanoscope inspect MODEL [--step N] (--chat TEXT | --tokens IDS) --position P [--json]``:
the inside of a local model at one token (docs/INSIDE.md).

``--chat TEXT``: TEXT as one user message in the model's chat format, the assistant's start,
then the model's greedy reply of up to ``--max-tokens`` tokens, so that positions in a reply
exist. ``--tokens IDS``: comma-separated ids, inspected as given (nothing generated).
``--position P`` indexes that token sequence (negative: from its end). It is the *predicting*
position: what is shown is what the model computed there, its guess for token P + 1, and
the produced token is the one at P + 1 (at the last position, the model's own top token).
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable
from typing import Any

from desktop.cli.say import say, warn
from desktop.engine.backend import Backend
from desktop.engine.errors import NanoscopeError
from desktop.engine.params import MAX_TOKENS_MAX, SamplingParams

TOP_ATTENDED = 3


def add_inspect_parser(sub: argparse._SubParsersAction, add_model_args: Callable[..., None]) -> None:
    p = sub.add_parser(
        "inspect",
        help="inside a model at one token: each layer's prediction, each head's attention, attribution",
    )
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--chat", help="a user message; the model then replies greedily (--max-tokens)")
    src.add_argument("--tokens", help="exact token ids, comma separated, inspected as given")
    p.add_argument(
        "--position",
        type=int,
        required=True,
        help="the predicting position in the token sequence (negative: from the end)",
    )
    p.add_argument("--max-tokens", type=int, default=32, help="--chat: the reply's length at most")


def _ids(args: argparse.Namespace, backend: Backend) -> tuple[list[int], int]:
    """The token sequence, and where the reply begins in it (its length for --tokens)."""
    from desktop.engine.messages import Message

    if args.tokens is not None:
        try:
            ids = [int(t) for t in args.tokens.replace(" ", "").split(",") if t]
        except ValueError:
            raise NanoscopeError("--tokens must be comma-separated integers") from None
        return ids, len(ids)
    if not 1 <= args.max_tokens <= MAX_TOKENS_MAX:
        raise NanoscopeError(f"--max-tokens must be between 1 and {MAX_TOKENS_MAX}, got {args.max_tokens}")
    if not args.chat.strip():
        raise NanoscopeError("nothing to inspect: the prompt is empty")
    prompt = backend.render([Message.of_text("user", args.chat)], args.max_tokens, chat=True)
    ids = prompt.require_ids()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    reply = [ev.id for ev in backend.stream(prompt, params, threading.Event()) if not ev.continues]
    return ids + reply, len(ids)


def cmd_inspect(args: argparse.Namespace, open_model: Callable[[argparse.Namespace], Backend]) -> int:
    from desktop.engine.inside import inspect
    from desktop.engine.remote.servers import is_remote

    if is_remote(args.model):  # not opened: it could not be inspected once open
        raise NanoscopeError(
            f"{args.model}: a served model has no inside to show (its weights are on the server)"
        )
    backend = open_model(args)
    try:
        info = backend.info()
        if info.family == "remote" or not info.capabilities.token_ids:
            raise NanoscopeError(
                f"{info.name}: a served model has no inside to show (its weights are on the server)"
            )
        ids, reply_start = _ids(args, backend)
        if not ids:
            raise NanoscopeError("nothing to inspect: the prompt is empty")
        position = args.position + len(ids) if args.position < 0 else args.position
        if not 0 <= position < len(ids):
            raise NanoscopeError(
                f"--position {args.position} is past the end: the tokens are at 0..{len(ids) - 1}"
            )
        inside = inspect(backend, ids, position)
        labels = {i: backend.token_label(i) for i in _shown_ids(inside, ids)}
    finally:
        backend.close()
    if not inside.exact:
        warn(inside.note)
    if args.json:
        d = inside.to_dict()
        d.update(
            model=info.name,
            precision=info.precision,
            ids=ids,
            reply_start=reply_start,
            labels={str(k): v for k, v in sorted(labels.items())},
        )
        say(json.dumps(d))
        return 0
    for line in human_lines(inside, ids, reply_start, labels, info.name, info.precision):
        say(line)
    return 0


def _shown_ids(inside: Any, ids: list[int]) -> set[int]:
    shown = {inside.token, inside.produced, *ids}
    for layer in inside.lens:
        shown.update(g.token for g in layer.top)
    return shown


def _q(label: str) -> str:
    return repr(label)


def human_lines(
    inside: Any, ids: list[int], reply_start: int, labels: dict[int, str], name: str, precision: str
) -> list[str]:
    """The table ``nanoscope inspect`` prints."""
    p, produced = inside.position, inside.produced
    where = "reply" if p >= reply_start else "prompt"
    came = "came next" if p + 1 < len(ids) else "the model's top token; nothing came next"
    lines = [
        f"{name} ({inside.era}, {precision}, {'exact' if inside.exact else 'approximate'})",
        f"position {p} of {len(ids)} ({where}): token {_q(labels[inside.token])} (id {inside.token}) "
        f"predicts {_q(labels[produced])} (id {produced}, {came})",
        f"read out: {inside.readout}",
        "",
        f"logit lens: top 5 after each block; rank and probability of {_q(labels[produced])}",
    ]
    for layer in inside.lens:
        top = "  ".join(f"{_q(labels[g.token])} {g.prob:.3f}" for g in layer.top)
        lines.append(f"  L{layer.layer:<3} {top}   | rank {layer.produced_rank}, p {layer.produced_prob:.4f}")
    first = inside.first_top1
    lines.append(
        f"{_q(labels[produced])} is first the top prediction after block {first}"
        if first is not None
        else f"{_q(labels[produced])} is never the top prediction"
    )
    lines += ["", "attention: the most attended tokens of each layer's most focused head"]
    for layer, heads in enumerate(inside.attention):
        head = max(range(len(heads)), key=lambda h: max(heads[h]))
        row = heads[head]
        best = sorted(range(len(row)), key=lambda j: -row[j])[:TOP_ATTENDED]
        text = ", ".join(f"{_q(labels[ids[j]])}@{j} {row[j]:.3f}" for j in best)
        lines.append(f"  L{layer:<3} head {head}: {text}")
    att = inside.attribution
    lines += ["", f"attribution of the logit of {_q(labels[produced])} {att.logit_words}"]
    for term in att.terms:
        heads = ""
        if term.kind == "attn" and 0 <= term.layer < len(att.heads):
            heads = "   heads: " + " ".join(f"{v:+.3f}" for v in att.heads[term.layer])
        lines.append(f"  {term.name:<16} {term.value:+.4f}{heads}")
    lines.append(f"  {'residual':<16} {att.residual:+.2e}")
    return lines
