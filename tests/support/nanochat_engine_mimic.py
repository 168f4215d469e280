"""An independent re-implementation of nanochat's ``Engine.generate`` loop, for equivalence tests.

Written from nanochat's ``engine.py`` (the fork's copy, lines ~135-306, in
/work/shared/seeds/003_nanochat_fork_source.txt) and spec §1.9, sharing no code with ``desktop/engine``:

* one batch-1 "prefill" of the prompt, its last logits expanded to ``num_samples`` rows;
* ``sample_next_token``: argmax at temperature 0, else softmax over the top-k (or all) logits divided
  by the temperature, one ``torch.multinomial`` draw per row from a ``torch.Generator`` seeded with
  ``seed``;
* a sample is drawn for every row at every step, even for rows whose next token is forced;
* the calculator state machine: ``<|python_start|>`` starts collecting, ``<|python_end|>`` decodes the
  collected ids, evaluates them with nanochat's ``use_calculator`` and forces ``<|output_start|>``,
  ``encode(str(result))``, ``<|output_end|>``;
* ``<|assistant_end|>``, ``<|bos|>`` (and the fork's ``<EOS>``) complete a row; the loop ends when
  every row is complete or after ``max_tokens`` columns.

Instead of a KV cache, each step's logits come from ``logits_fn(row_tokens)``, a full forward of the
row's whole sequence (the tests pass ``reference_model.reference_logits``). This file also writes the
"calculator trap" checkpoint the tests use to make a model call the calculator on purpose.
"""

from __future__ import annotations

import json
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import tiktoken
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer as HFTokenizer

from support.checkpoint_factory import (
    default_config,
    make_meta,
    make_state_dict,
    module_state_dict,
    write_tokenizer,
)

LogitsFn = Callable[[Sequence[int]], torch.Tensor]  # token ids -> logits [V] at the last position


class NanochatTokenizer(Protocol):
    """The four tokenizer calls nanochat's Engine makes."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_special(self, name: str) -> int | None: ...

    def get_bos_token_id(self) -> int: ...


class TiktokenNanochatTokenizer:
    """nanochat's ``RustBPETokenizer`` calls on a ``tiktoken.Encoding``: ordinary encode, plain decode."""

    def __init__(self, enc: tiktoken.Encoding) -> None:
        self.enc = enc

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.enc.decode(list(ids))

    def encode_special(self, name: str) -> int | None:
        # nanochat's encode_special is encode_single_token; the Engine turns its KeyError into None.
        try:
            return self.enc.encode_single_token(name)
        except KeyError:
            return None

    def get_bos_token_id(self) -> int:
        return self.enc.encode_single_token("<|bos|>")


class CppJsonNanochatTokenizer:
    """The fork's tokenizer.json through HF ``tokenizers``: specials looked up by name, ``<BOS>`` as bos.

    It has no calculator tokens, so the Engine never decodes with it; plain HF decode is enough here.
    """

    def __init__(self, path: Path) -> None:
        self.tok = HFTokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def encode_special(self, name: str) -> int | None:
        return self.tok.token_to_id(name)

    def get_bos_token_id(self) -> int:
        bos = self.tok.token_to_id("<BOS>")
        assert bos is not None
        return bos


def sample_next_token(
    logits: torch.Tensor, rng: torch.Generator, temperature: float = 1.0, top_k: int | None = None
) -> torch.Tensor:
    """nanochat's sampler: ``logits`` (B, V) -> (B, 1) token ids."""
    assert temperature >= 0.0
    if temperature == 0.0:
        return torch.argmax(logits, dim=-1, keepdim=True)
    if top_k is not None and top_k > 0:
        k = min(top_k, logits.size(-1))
        vals, idx = torch.topk(logits, k, dim=-1)
        probs = F.softmax(vals / temperature, dim=-1)
        choice = torch.multinomial(probs, num_samples=1, generator=rng)
        return idx.gather(1, choice)
    probs = F.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=rng)


_MATH_CHARS = "0123456789*+-/.() "
_STRING_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\"()._ "
_DANGEROUS = (
    "__",
    "import",
    "exec",
    "eval",
    "compile",
    "open",
    "file",
    "input",
    "raw_input",
    "globals",
    "locals",
    "vars",
    "dir",
    "getattr",
    "setattr",
    "delattr",
    "hasattr",
)


def _eval_quietly(expr: str) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return eval(expr, {"__builtins__": {}}, {})
    except Exception:
        return None


def use_calculator(expr: str) -> Any:
    """nanochat's calculator: its screening, then ``eval`` without builtins (no timeout needed here)."""
    expr = expr.replace(",", "")
    if all(c in _MATH_CHARS for c in expr):
        return None if "**" in expr else _eval_quietly(expr)
    if not all(c in _STRING_CHARS for c in expr):
        return None
    if any(p in expr.lower() for p in _DANGEROUS) or ".count(" not in expr:
        return None
    return _eval_quietly(expr)


@dataclass
class _RowState:
    current_tokens: list[int]
    forced_tokens: deque[int] = field(default_factory=deque)
    in_python_block: bool = False
    python_expr_tokens: list[int] = field(default_factory=list)
    completed: bool = False


def mimic_generate(
    logits_fn: LogitsFn,
    tokenizer: NanochatTokenizer,
    tokens: Sequence[int],
    *,
    num_samples: int = 1,
    max_tokens: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 42,
) -> Iterator[tuple[list[int], list[int]]]:
    """Yield ``(token_column, token_masks)`` like ``Engine.generate``; mask 1 = sampled, 0 = forced."""
    rng = torch.Generator(device="cpu")
    rng.manual_seed(seed)
    python_start = tokenizer.encode_special("<|python_start|>")
    python_end = tokenizer.encode_special("<|python_end|>")
    output_start = tokenizer.encode_special("<|output_start|>")
    output_end = tokenizer.encode_special("<|output_end|>")
    assistant_end = tokenizer.encode_special("<|assistant_end|>")
    eos = tokenizer.encode_special("<EOS>")
    bos = tokenizer.get_bos_token_id()

    logits = logits_fn(list(tokens)).reshape(1, -1).expand(num_samples, -1)
    rows = [_RowState(list(tokens)) for _ in range(num_samples)]
    num_generated = 0
    while True:
        if max_tokens is not None and num_generated >= max_tokens:
            break
        if all(row.completed for row in rows):
            break
        sampled = sample_next_token(logits, rng, temperature, top_k)[:, 0].tolist()
        column, masks = [], []
        for i, row in enumerate(rows):
            is_forced = len(row.forced_tokens) > 0
            masks.append(0 if is_forced else 1)
            token = row.forced_tokens.popleft() if is_forced else sampled[i]
            column.append(token)
            row.current_tokens.append(token)
            if token in (assistant_end, bos) or (eos is not None and token == eos):
                row.completed = True
            if token == python_start:
                row.in_python_block = True
                row.python_expr_tokens = []
            elif token == python_end and row.in_python_block:
                row.in_python_block = False
                if row.python_expr_tokens:
                    result = use_calculator(tokenizer.decode(row.python_expr_tokens))
                    if result is not None:
                        row.forced_tokens.append(output_start)
                        row.forced_tokens.extend(tokenizer.encode(str(result)))
                        row.forced_tokens.append(output_end)
                row.python_expr_tokens = []
            elif row.in_python_block:
                row.python_expr_tokens.append(token)
        yield column, masks
        num_generated += 1
        logits = torch.stack([logits_fn(row.current_tokens).reshape(-1) for row in rows])


# ---------------------------------------------------------------------------------------------------
# the calculator trap


def write_calculator_trap(
    base_dir: Path, successors: Mapping[int, int], *, phase: str = "chatsft", step: int = 10, seed: int = 0
) -> Path:
    """Write an E0 checkpoint (+ tokenizer.pkl) whose greedy next token after ``t`` is ``successors[t]``.

    Every attention and MLP output projection is zero, so each block is the identity and the logits
    at a position depend on that position's token only: ``lm_head(norm(norm(wte[token])))``. Each key
    of ``successors`` gets its own one-hot embedding direction, and ``lm_head`` row ``successors[t]``
    gets ``3 *`` that direction, so after ``t`` that row scores ``15*tanh(24/15)`` (about 13.8) and every
    row that is not a successor scores exactly 0. Tokens outside the map keep random embeddings and get
    soft, random-ish next-token distributions (leaning towards the successor rows).
    """
    cfg = default_config("E0")
    if len(successors) > cfg.n_embd:
        raise ValueError(f"{len(successors)} scripted tokens need more than n_embd={cfg.n_embd} directions")
    sd = make_state_dict("E0", cfg, seed)
    for i in range(cfg.n_layer):
        sd[f"transformer.h.{i}.attn.c_proj.weight"].zero_()
        sd[f"transformer.h.{i}.mlp.c_proj.weight"].zero_()
    sd["lm_head.weight"].zero_()
    for k, (token, successor) in enumerate(successors.items()):
        direction = torch.zeros(cfg.n_embd)
        direction[k] = 1.0
        sd["transformer.wte.weight"][token] = direction
        sd["lm_head.weight"][successor] += 3.0 * direction
    ckpt_dir = Path(base_dir) / f"{phase}_checkpoints" / f"d{cfg.n_layer}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.save(module_state_dict(sd), ckpt_dir / f"model_{step:06d}.pt")
    meta = make_meta("E0", cfg, phase=phase, step=step)
    (ckpt_dir / f"meta_{step:06d}.json").write_text(json.dumps(meta), encoding="utf-8")
    write_tokenizer(Path(base_dir), "pkl", cfg.vocab_size)
    return ckpt_dir
