"""``inspect`` and ``inspect_all``: the inside of a local model at a position of a token sequence
(docs/INSIDE.md). torch is imported only when a pass runs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from desktop.engine.errors import NanoscopeError
from desktop.engine.inside.result import FORMAT, Attribution, Guess, Inside, LensLayer, Term
from desktop.engine.inside.yielding import PassYielded, Stop
from desktop.engine.kernels.memory import available_ram, human

if TYPE_CHECKING:
    from desktop.engine.inside.hf import StackPass
    from desktop.engine.inside.nanochat import NanochatPass

logger = logging.getLogger(__name__)
TOP = 5
CACHE_FORMAT = "nanoscope-inside-cache/1"
# What a pass keeps per token and layer, in rows of the model's width: the stream, attention's
# and the MLP's outputs, q, k, each head's output, and a value-embedding layer's two more.
ROWS_KEPT = 8


def _model_of(source: Any) -> tuple[Any, str, str]:
    """(the model inside ``source``: a nanochat ``GPT``, a Hugging Face ``HFCausalLM`` or a
    KempnerForge ``KFTransformer``, family, era); one line where there is none."""
    from desktop.engine.hf.model import HFCausalLM
    from desktop.engine.kempnerforge.model import KFTransformer
    from desktop.engine.nanochat.model import GPT

    if isinstance(source, GPT):
        cfg = source.config
        return source, "nanochat-fork" if cfg.is_fork else "nanochat", cfg.era
    if isinstance(source, HFCausalLM):
        return source, source.config.family, source.config.family
    if isinstance(source, KFTransformer):
        return source, "kempnerforge", "dense"
    info = source.info() if callable(getattr(source, "info", None)) else None
    if info is not None and (info.family == "remote" or not info.capabilities.token_ids):
        raise NanoscopeError(
            f"{info.name}: a served model has no inside to show (its weights are on the server)"
        )
    model = getattr(source, "model", None)
    if isinstance(model, GPT):
        return model, info.family if info is not None else "nanochat", model.config.era
    if isinstance(model, HFCausalLM | KFTransformer) and info is not None:
        return model, info.family, info.era
    if model is None and info is not None and getattr(source, "loaded", None) is not None:
        raise NanoscopeError(f"{info.name}: the model is closed")
    family = info.family if info is not None else type(source).__name__
    raise NanoscopeError(
        f"{family}: no Inside view for this family yet "
        "(nanochat checkpoints, Hugging Face folders and KempnerForge runs have one)"
    )


def _vocab_and_context(model: Any) -> tuple[int, int]:
    cfg = model.config
    return cfg.vocab_size, cfg.rope_len


def kept_bytes(model: Any, length: int) -> int:
    """About what a pass over ``length`` tokens keeps (:data:`ROWS_KEPT` rows a token and layer)."""
    import torch

    from desktop.engine.hf.model import HFCausalLM
    from desktop.engine.kempnerforge.model import KFTransformer

    cfg = model.config
    if isinstance(model, HFCausalLM):
        depth, width = cfg.n_layer, max(cfg.hidden_size, cfg.n_head * cfg.head_dim)
    elif isinstance(model, KFTransformer):
        depth, width = cfg.n_layers, cfg.dim
    else:
        depth, width = cfg.n_layer, cfg.n_embd
    item = torch.empty((), dtype=model.compute_dtype).element_size()
    return depth * width * length * ROWS_KEPT * item


def _check_memory(model: Any, length: int, share: float) -> None:
    """One line, before the pass, when it would keep more than ``share`` of the free RAM."""
    need, free = kept_bytes(model, length), available_ram()
    if free is not None and need > share * free:
        raise NanoscopeError(
            f"the Inside pass over {length} tokens would keep about {human(need)}, "
            f"more than {share:.0%} of the {human(free)} of memory free"
        )


def _record(model: Any, ids: tuple[int, ...], stop: Stop | None) -> NanochatPass | StackPass:
    """The family's recorder over ``ids`` (desktop/engine/inside/{nanochat,hf,kempnerforge}.py)."""
    from desktop.engine.hf.model import HFCausalLM
    from desktop.engine.kempnerforge.model import KFTransformer

    if isinstance(model, HFCausalLM):
        from desktop.engine.inside.hf import record as record_hf

        return record_hf(model, ids, stop)
    if isinstance(model, KFTransformer):
        from desktop.engine.inside.kempnerforge import record as record_kf

        return record_kf(model, ids, stop)
    from desktop.engine.inside.nanochat import record

    return record(model, ids, stop)


def _check_ids(ids: Sequence[int], vocab: int, context: int) -> tuple[int, ...]:
    if len(ids) == 0:
        raise NanoscopeError("nothing to inspect: the prompt is empty")
    bad = [i for i in ids if not 0 <= int(i) < vocab]
    if bad:
        raise NanoscopeError(f"token ids out of range for vocab {vocab}: {bad[:5]}")
    if len(ids) > context:
        raise NanoscopeError(f"{len(ids)} tokens: past the model's context of {context}")
    return tuple(int(i) for i in ids)


def _check_position(position: int, length: int) -> None:
    if not 0 <= position < length:
        raise NanoscopeError(f"position {position} is past the end: the tokens are at 0..{length - 1}")


class InsideCache:
    """One hooked forward pass over a whole sequence (a prompt and its reply), from which any
    position's :class:`Inside` is computed on demand (milliseconds) and kept.

    ``to_dict`` keeps the positions computed so far (not the tensors, which take hundreds of
    MB for a long reply at depth 12); :meth:`saved` reads them back without the model."""

    def __init__(self, run: NanochatPass | StackPass, family: str, era: str) -> None:
        self._run = run
        self.ids = run.ids
        self.family, self.era = family, era
        self.readout, self.note = run.readout, run.note
        self.exact = not run.note
        self.n_layer, self.n_head = run.n_layer, run.n_head
        self._done: dict[tuple[int, int], Inside] = {}

    def lens_logits(self, position: int) -> tuple[Any, Any]:
        """(n_layer, vocab) float32 tensors: the lens's logits before and after softcap."""
        _check_position(position, len(self.ids))
        return self._run.lens_logits(position)

    def attention(self, position: int) -> list[list[list[float]]]:
        """``[layer][head][j]`` for j in 0..position: see :attr:`Inside.attention`."""
        _check_position(position, len(self.ids))
        return [self._run.attention_rows(layer, position).tolist() for layer in range(self.n_layer)]

    def at(self, position: int, produced: int | None = None) -> Inside:
        """The inside at ``position`` (the predicting position: its output is the guess for
        token ``position + 1``). ``produced``: the token to rank and attribute; None takes
        ``ids[position + 1]``, or at the last position the model's own top token."""
        import torch

        _check_position(position, len(self.ids))
        raw, capped = self._run.lens_logits(position)
        if produced is None:
            has_next = position + 1 < len(self.ids)
            produced = self.ids[position + 1] if has_next else int(capped[-1].argmax())
        if not 0 <= produced < capped.size(-1):
            raise NanoscopeError(f"produced token {produced} is out of range for vocab {capped.size(-1)}")
        key = (position, produced)
        if key in self._done:
            return self._done[key]
        probs = torch.softmax(capped, dim=-1)
        top_p, top_i = probs.topk(min(TOP, probs.size(-1)), dim=-1)
        lens = tuple(
            LensLayer(
                layer=layer,
                top=tuple(Guess(int(t), float(p)) for t, p in zip(top_i[layer], top_p[layer], strict=True)),
                produced_rank=int((capped[layer] > capped[layer, produced]).sum()) + 1,
                produced_prob=float(probs[layer, produced]),
            )
            for layer in range(self.n_layer)
        )
        terms, heads, scale = self._run.attribution(position, produced)
        pre = float(raw[-1, produced])
        total = sum(value for _, _, value in terms)
        attribution = Attribution(
            token=produced,
            logit=float(capped[-1, produced]),
            pre_softcap=pre,
            softcap=self._run.softcap,
            norm_scale=scale,
            terms=tuple(Term(kind, layer, value) for kind, layer, value in terms),
            heads=tuple(tuple(h) for h in heads),
            residual=pre - total,
        )
        inside = Inside(
            position=position,
            token=self.ids[position],
            produced=produced,
            readout=self.readout,
            exact=self.exact,
            note=self.note,
            lens=lens,
            attention=tuple(tuple(tuple(row) for row in heads) for heads in self.attention(position)),
            attribution=attribution,
            family=self.family,
            era=self.era,
        )
        self._done[key] = inside
        return inside

    def to_dict(self) -> dict[str, Any]:
        """The positions computed so far, attention rows packed as history keeps them."""
        return {
            "format": CACHE_FORMAT,
            "family": self.family,
            "era": self.era,
            "ids": list(self.ids),
            "exact": self.exact,
            "note": self.note,
            "readout": self.readout,
            "positions": [inside.to_dict(packed=True) for inside in self._done.values()],
        }

    @staticmethod
    def saved(d: dict[str, Any]) -> dict[tuple[int, int], Inside]:
        """The positions a :meth:`to_dict` kept, by (position, produced) (ValueError on another
        format). A damaged position is left out (logged), and the others kept."""
        if d.get("format") != CACHE_FORMAT:
            raise ValueError(f"not {CACHE_FORMAT}: {d.get('format')!r}")
        out: dict[tuple[int, int], Inside] = {}
        for item in d["positions"]:
            try:
                inside = Inside.from_dict(item)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                logger.warning("a kept Inside position is damaged, left out: %s", exc)
                continue
            out[(inside.position, inside.produced)] = inside
        return out


def inspect_all(
    source: Any, ids: Sequence[int], stop: Stop | None = None, memory_share: float = 0.5
) -> InsideCache:
    """One hooked forward pass of ``source`` (a local Backend, or a nanochat ``GPT``, a Hugging
    Face ``HFCausalLM`` or a KempnerForge ``KFTransformer``) over ``ids``; any position's
    :class:`Inside` then comes from :meth:`InsideCache.at`.

    Raises :class:`NanoscopeError` (one line) for a served model, a family without an Inside
    view yet, an empty sequence, ids outside the vocabulary, more ids than the model's context,
    or a pass that would keep more than ``memory_share`` of the free RAM (:func:`kept_bytes`).
    ``stop`` is asked before each block; when it says True the pass ends with
    :class:`PassYielded` (a prepared pass giving way to the user's next request). Runs on the
    model's worker thread (never the GUI's)."""
    model, family, era = _model_of(source)
    checked = _check_ids(ids, *_vocab_and_context(model))
    _check_memory(model, len(checked), memory_share)
    return InsideCache(_record(model, checked, stop), family, era)


def inspect(source: Any, ids: Sequence[int], position: int, produced: int | None = None) -> Inside:
    """The inside of ``source`` at ``position`` of ``ids``, from one pass over
    ``ids[: position + 1]``: at the last layer its lens is the model's own next-token
    distribution there, bit for bit in exact (float32) mode.

    ``produced`` (None: ``ids[position + 1]``, or the model's top token at the end) is the token
    ranked in the lens and attributed. Errors as :func:`inspect_all`, and a position outside
    ``0 .. len(ids) - 1``."""
    if len(ids) == 0:
        raise NanoscopeError("nothing to inspect: the prompt is empty")
    _check_position(position, len(ids))
    model, _family, _era = _model_of(source)
    _check_ids(ids, _vocab_and_context(model)[0], len(ids))  # every id, the produced one too
    cache = inspect_all(source, list(ids)[: position + 1])
    if produced is None and position + 1 < len(ids):
        produced = int(ids[position + 1])
    return cache.at(position, produced)


__all__ = ["CACHE_FORMAT", "FORMAT", "InsideCache", "PassYielded", "inspect", "inspect_all", "kept_bytes"]
