"""What the inside of a model looks like at one position (torch-free, Qt-free): the numbers
:func:`desktop.engine.inside.inspect` computes, and their JSON form (docs/INSIDE.md).

Every field is plain Python (ints, floats, strings, tuples), so an :class:`Inside` can be kept
with a reply in history and shown again without the model.
"""

from __future__ import annotations

import base64
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Any

FORMAT = "nanoscope-inside/1"
# The attention rows of a position kept with a reply in history: their float32 bits, little
# endian, zlib-compressed, in base64 (a sixth to a seventh of the JSON lists' size, and exact).
PACKED = "float32-le-zlib-base64"
MAX_LAYERS_HEADS = 4096  # layers × heads a packed block may claim (d32 with 16 heads: 512)


def pack_attention(attention: tuple[tuple[tuple[float, ...], ...], ...]) -> dict[str, Any]:
    """``attention[layer][head][j]`` as one packed block (:data:`PACKED`)."""
    layers, heads = len(attention), len(attention[0]) if attention else 0
    width = len(attention[0][0]) if heads else 0
    flat = array("f", (w for per_layer in attention for row in per_layer for w in row))
    if sys.byteorder == "big":
        flat.byteswap()
    data = base64.b64encode(zlib.compress(flat.tobytes(), 6)).decode("ascii")
    return {"encoding": PACKED, "shape": [layers, heads, width], "data": data}


def unpack_attention(d: dict[str, Any], width: int) -> tuple[tuple[tuple[float, ...], ...], ...]:
    """What :func:`pack_attention` packed; ``width`` (position + 1) bounds what it may claim, so a
    damaged history row costs at most its own size (ValueError on anything else)."""
    if d.get("encoding") != PACKED:
        raise ValueError(f"not {PACKED}: {d.get('encoding')!r}")
    layers, heads, got_width = (int(n) for n in d["shape"])
    if got_width != width or not 0 < layers * heads <= MAX_LAYERS_HEADS:
        raise ValueError(f"attention shape {d['shape']} does not fit position {width - 1}")
    size = layers * heads * width * 4
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(base64.b64decode(str(d["data"]), validate=True), size + 1)
    except zlib.error as exc:  # not a ValueError
        raise ValueError(f"the packed attention rows are damaged: {exc}") from None
    if len(raw) != size or not inflate.eof:
        raise ValueError("the packed attention rows are damaged")
    flat = array("f")
    flat.frombytes(raw)
    if sys.byteorder == "big":
        flat.byteswap()
    values = flat.tolist()
    return tuple(
        tuple(tuple(values[r * width : (r + 1) * width]) for r in range(layer * heads, (layer + 1) * heads))
        for layer in range(layers)
    )


@dataclass(frozen=True)
class Guess:
    """One token of a top-k list and its probability."""

    token: int
    prob: float


@dataclass(frozen=True)
class LensLayer:
    """The logit lens after one block: the stream read out through the model's own final norm,
    head and softcap."""

    layer: int
    top: tuple[Guess, ...]  # the 5 most likely tokens, most likely first
    produced_rank: int  # 1 = the top prediction (ties broken in the produced token's favour)
    produced_prob: float


@dataclass(frozen=True)
class Term:
    """One path's push on the produced token's pre-softcap logit (docs/INSIDE.md, Attribution).

    ``kind``: "embedding", "smear", "bigram", "attn", "value_embed", "mlp", "engram", "backout",
    or "final_norm_bias" (a LayerNorm's bias: KempnerForge runs that use one).
    ``layer``: the block it was written in (-1 for paths before the first block)."""

    kind: str
    layer: int
    value: float

    @property
    def name(self) -> str:
        return self.kind if self.layer < 0 else f"L{self.layer} {self.kind}"


@dataclass(frozen=True)
class Attribution:
    """Direct logit attribution of the produced token, along the final norm at this position.

    ``sum(t.value for t in terms) + residual == pre_softcap`` (to float rounding: the sum is
    taken in float64). ``heads[layer][h]``: head h's share of that layer's attention output
    (its "attn" and "value_embed" terms together), through the output projection."""

    token: int
    logit: float  # the model's softcapped logit (what its distribution uses)
    pre_softcap: float  # the head's logit before softcap: what the terms decompose
    softcap: float  # 0: none
    norm_scale: float  # the final norm's 1/rms at this position, which scales every term
    terms: tuple[Term, ...]
    heads: tuple[tuple[float, ...], ...]
    residual: float

    @property
    def logit_words(self) -> str:
        """The logit the terms decompose, in words: "before softcap (16.8385; softcapped
        12.1269)", or "(11.2014)" for a model without a softcap."""
        if self.softcap:
            return f"before softcap ({self.pre_softcap:.4f}; softcapped {self.logit:.4f})"
        return f"({self.pre_softcap:.4f})"


@dataclass(frozen=True)
class Inside:
    """The inside of a model at ``position``: what each layer predicted for the next token
    (``lens``), where each head looked (``attention``), and which paths pushed the produced
    token (``attribution``)."""

    position: int  # the predicting position: its output is the guess for token position + 1
    token: int  # ids[position]
    produced: int  # the token whose rank, probability and attribution are reported
    readout: str  # what the lens reads out, in one line (per family and era)
    exact: bool  # False in approximate modes (fast 16-bit, int8): see note
    note: str  # one line: why the numbers are approximate, or ""
    lens: tuple[LensLayer, ...]
    # attention[layer][head][j]: the weight of token j (0..position) in that head's average;
    # zero outside a sliding window.
    attention: tuple[tuple[tuple[float, ...], ...], ...]
    attribution: Attribution
    family: str = ""
    era: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """Family and era in a few words ("nanochat E7"; a Hugging Face family's era is its
        family, said once)."""
        return self.family if self.era in ("", self.family) else f"{self.family} {self.era}".strip()

    @property
    def first_top1(self) -> int | None:
        """The first layer after which the produced token is the top prediction, or None."""
        return next((layer.layer for layer in self.lens if layer.produced_rank == 1), None)

    def to_dict(self, packed: bool = False) -> dict[str, Any]:
        """The JSON form (docs/INSIDE.md); ``packed``: the attention rows as one
        :data:`PACKED` block (how history keeps them) instead of nested lists."""
        att = self.attribution
        return {
            "format": FORMAT,
            "family": self.family,
            "era": self.era,
            "position": self.position,
            "token": self.token,
            "produced": self.produced,
            "readout": self.readout,
            "exact": self.exact,
            "note": self.note,
            "first_top1": self.first_top1,
            "lens": [
                {
                    "layer": layer.layer,
                    "top": [[g.token, g.prob] for g in layer.top],
                    "produced_rank": layer.produced_rank,
                    "produced_prob": layer.produced_prob,
                }
                for layer in self.lens
            ],
            "attention": pack_attention(self.attention)
            if packed
            else [[list(row) for row in heads] for heads in self.attention],
            "attribution": {
                "token": att.token,
                "logit": att.logit,
                "pre_softcap": att.pre_softcap,
                "softcap": att.softcap,
                "norm_scale": att.norm_scale,
                "terms": [{"kind": t.kind, "layer": t.layer, "value": t.value} for t in att.terms],
                "heads": [list(h) for h in att.heads],
                "residual": att.residual,
            },
            **({"extra": self.extra} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Inside:
        """The :class:`Inside` :meth:`to_dict` wrote, packed or not (a KeyError or ValueError on
        anything else)."""
        if d.get("format") != FORMAT:
            raise ValueError(f"not {FORMAT}: {d.get('format')!r}")
        a = d["attribution"]
        return cls(
            position=int(d["position"]),
            token=int(d["token"]),
            produced=int(d["produced"]),
            readout=str(d["readout"]),
            exact=bool(d["exact"]),
            note=str(d["note"]),
            lens=tuple(
                LensLayer(
                    int(x["layer"]),
                    tuple(Guess(int(t), float(p)) for t, p in x["top"]),
                    int(x["produced_rank"]),
                    float(x["produced_prob"]),
                )
                for x in d["lens"]
            ),
            attention=unpack_attention(d["attention"], int(d["position"]) + 1)
            if isinstance(d["attention"], dict)
            else tuple(tuple(tuple(float(w) for w in row) for row in heads) for heads in d["attention"]),
            attribution=Attribution(
                token=int(a["token"]),
                logit=float(a["logit"]),
                pre_softcap=float(a["pre_softcap"]),
                softcap=float(a["softcap"]),
                norm_scale=float(a["norm_scale"]),
                terms=tuple(Term(str(t["kind"]), int(t["layer"]), float(t["value"])) for t in a["terms"]),
                heads=tuple(tuple(float(v) for v in h) for h in a["heads"]),
                residual=float(a["residual"]),
            ),
            family=str(d.get("family", "")),
            era=str(d.get("era", "")),
            extra=dict(d.get("extra", {})),
        )
