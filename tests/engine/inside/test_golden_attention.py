"""Nanoscope's attention rows equal those nanochat's own attention code computes, at every era,
the fork's variants, and GQA cases with sliding windows that cut.

Each ``tests/golden/attention/<family>-<case>.json`` was written by ``python -m tools.golden
attention``: the case's revision loaded its checkpoint with its own ``build_model`` and ran one
forward of its own ``GPT`` over ``ids`` on the CPU in float32, the q, k and mask its attention
passed to ``F.scaled_dot_product_attention`` recorded, and softmax(q kᵀ/√d + mask) computed from
them in float64 (query head h against kv head h // group, as ``enable_gqa`` repeats them). Rows
are kept to 9 significant digits; Nanoscope's must agree to 1e-6.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.golden import GOLDEN, assert_files_as_written

from desktop.engine.backend import LoadOptions
from desktop.engine.inside import inspect, inspect_all
from desktop.engine.nanochat.backend import NanochatBackend

ATTENTION = GOLDEN / "attention"
FILES = sorted(ATTENTION.glob("*.json"))
TOLERANCE = 1e-6


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_era_variant_window_and_gqa_has_rows():
    names = {p.stem for p in FILES}
    eras = {f"nanochat-{e}" for e in ("E0", "E0pad", "E1", "E2", "E3", "E4", "E5", "E6", "E7")}
    forks = {f"fork-{v}" for v in ("plain", "engram", "mhc", "engram-mhc-mtp-swiglu", "cpp-engram-swiglu")}
    assert names >= eras | forks
    records = [load(p) for p in FILES]
    assert any(r["n_kv_head"] < r["n_head"] and any(r["window"]["cut"]) for r in records)
    assert any(any(r["window"]["cut"]) for r in records if r["n_kv_head"] == r["n_head"])


@pytest.mark.parametrize("case", sorted({p.parent for p in ATTENTION.glob("gqa/*/golden.json")}), ids=str)
def test_the_gqa_checkpoints_are_the_ones_the_writer_wrote(case):
    assert_files_as_written(case)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_attention_rows_equal_nanochats_own(path):
    want = load(path)
    case = GOLDEN / want["case"]
    m = load(case / "golden.json")
    assert m["commit"] == want["commit"]
    softcap = want["load_options"].get("softcap")
    backend = NanochatBackend.open(
        case / "chatsft_checkpoints" / m["tag"],
        LoadOptions(step=want["step"], device="cpu", dtype="float32", base_dir=case, softcap=softcap),
    )
    try:
        cache = inspect_all(backend, want["ids"])
        assert (cache.n_layer, cache.n_head) == (want["n_layer"], want["n_head"])
        for position in want["positions"]:
            close(path.stem, position, cache.attention(position), want["rows"][str(position)])
        # the single-position entry point: one pass over the ids up to the position
        middle = want["positions"][len(want["positions"]) // 2]
        inside = inspect(backend, want["ids"], middle)
        close(
            path.stem,
            middle,
            [list(map(list, heads)) for heads in inside.attention],
            want["rows"][str(middle)],
        )
    finally:
        backend.close()


def close(name: str, position: int, got: list[list[list[float]]], want: list[list[list[float]]]) -> None:
    """Every layer's and head's row at ``position`` within :data:`TOLERANCE` of nanochat's."""
    assert len(got) == len(want)
    for layer, (got_heads, want_heads) in enumerate(zip(got, want, strict=True)):
        assert len(got_heads) == len(want_heads)
        for head, (g, w) in enumerate(zip(got_heads, want_heads, strict=True)):
            assert len(g) == len(w) == position + 1
            err = max(abs(a - b) for a, b in zip(g, w, strict=True))
            assert err <= TOLERANCE, f"{name}: position {position} layer {layer} head {head}: {err}"
