"""nanochat's own ``Engine.generate``, imported from a source checkout, as a speed baseline.

``bench_engine.py --nanochat-src PATH`` races Nanoscope against the real thing instead of
``nanochat_baseline.py``'s re-implementation. The model is built the way nanochat's
``checkpoint_manager.build_model`` builds it (GPT on the meta device, ``to_empty``,
``init_weights`` for the rotary tables, ``load_state_dict(strict=True, assign=True)``), on the
CPU in float32. Nothing of nanochat is copied here: it is imported from ``PATH``.

Engine.generate asks its tokenizer for the special-token ids of its tool-use state machine and
for BOS; we feed token ids only, so a stand-in answers with nanochat's layout (the nine special
tokens are the last nine ids of the vocabulary) and never produces text.
"""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from desktop.engine.nanochat.special_tokens import BOS, SPECIAL_TOKENS


class NanochatSourceError(Exception):
    """The source tree cannot give us a working Engine; the message is one line."""


class StandInTokenizer:
    """The methods ``Engine.generate`` calls on a tokenizer, for a run fed with token ids only."""

    def __init__(self, vocab_size: int) -> None:
        first = vocab_size - len(SPECIAL_TOKENS)
        self._special = {name: first + i for i, name in enumerate(SPECIAL_TOKENS)}

    def encode_special(self, name: str) -> int:
        return self._special[name]

    def get_bos_token_id(self) -> int:
        return self._special[BOS]

    def decode(self, _ids: Sequence[int]) -> str:
        return ""  # a calculator expression decodes to nothing, so nothing is ever forced

    def encode(self, _text: str, *_args: Any, **_kwargs: Any) -> list[int]:
        return []


def source_commit(src: Path) -> str:
    """The checkout's git commit, or 'unknown' (a copied tree, or no git)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


@dataclasses.dataclass(frozen=True)
class RealEngine:
    engine: Any  # nanochat.engine.Engine
    label: str  # "nanochat Engine from PATH @ COMMIT": printed with every figure measured against it
    mapped: tuple[str, ...]  # how our meta became its GPTConfig, where it was not one to one

    def generate(
        self, tokens: list[int], max_tokens: int, temperature: float, top_k: int, seed: int = 42
    ) -> Iterator[int]:
        """Row 0 of ``Engine.generate``, one token id at a time (the same call shape as
        ``nanochat_baseline.NanochatE7.generate``)."""
        columns = self.engine.generate(
            tokens, num_samples=1, max_tokens=max_tokens, temperature=temperature, top_k=top_k, seed=seed
        )
        for column, _masks in columns:
            yield column[0]


def _import(src: Path) -> tuple[Any, Any]:
    """nanochat.gpt and nanochat.engine from ``src`` (not from any other ``nanochat`` on the path)."""
    if not (src / "nanochat" / "engine.py").is_file():
        raise NanochatSourceError(f"{src}: no nanochat/engine.py there")
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    try:
        gpt = importlib.import_module("nanochat.gpt")
        engine = importlib.import_module("nanochat.engine")
        common = importlib.import_module("nanochat.common")
    except Exception as exc:  # its imports need packages we may lack (filelock, rustbpe, tiktoken...)
        raise NanochatSourceError(f"{src}: importing nanochat failed: {type(exc).__name__}: {exc}") from None
    where = Path(gpt.__file__ or "").resolve()
    if not where.is_relative_to(src.resolve()):
        raise NanochatSourceError(f"nanochat was already imported from {where.parent}, not from {src}")
    dtype = common.COMPUTE_DTYPE
    if dtype is not torch.float32:  # NANOCHAT_DTYPE in the environment
        raise NanochatSourceError(f"nanochat's COMPUTE_DTYPE is {dtype}; unset NANOCHAT_DTYPE")
    return gpt, engine


def gpt_config_kwargs(
    fields: Mapping[str, Any], meta_config: Mapping[str, Any], known: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """GPTConfig's arguments from our meta's ``model_config``: a field the meta lacks comes from
    ``known`` (our own config of the checkpoint) when it has that name, else keeps nanochat's
    default; meta keys GPTConfig has no field for are left out. Returns (kwargs, what was mapped)."""
    kwargs, notes = {}, []
    for name, default in fields.items():
        if name in meta_config:
            kwargs[name] = meta_config[name]
        elif name in known:
            kwargs[name] = known[name]
            notes.append(f"{name}={known[name]!r} (not in the meta; from our config)")
        else:
            notes.append(f"{name}={default!r} (not in the meta; nanochat's default)")
    notes += [f"meta key {k!r} dropped (GPTConfig has no such field)" for k in meta_config if k not in fields]
    return kwargs, notes


def load_real_engine(
    src: Path, model_file: Path, meta_config: Mapping[str, Any], known: Mapping[str, Any]
) -> RealEngine:
    """Build nanochat's GPT from our checkpoint and wrap it in its Engine (CPU, float32)."""
    gpt, engine = _import(src)
    fields = {f.name: f.default for f in dataclasses.fields(gpt.GPTConfig)}
    kwargs, notes = gpt_config_kwargs(fields, meta_config, known)
    config = gpt.GPTConfig(**kwargs)
    sd = torch.load(model_file, map_location="cpu", weights_only=True)
    sd = {k.removeprefix("_orig_mod."): v.float() for k, v in sd.items()}
    with torch.device("meta"):
        model = gpt.GPT(config)
    model.to_empty(device=torch.device("cpu"))
    model.init_weights()  # as nanochat's build_model: this is what fills the rotary buffers
    try:
        model.load_state_dict(sd, strict=True, assign=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise NanochatSourceError(
            f"{model_file}: does not load into nanochat's GPT with strict=True: {' '.join(first[:3])}"
        ) from None
    model.eval()
    label = f"nanochat Engine from {src} @ {source_commit(src)}"
    return RealEngine(engine.Engine(model, StandInTokenizer(config.vocab_size)), label, tuple(notes))
