"""The positions a reply's Inside view kept in history (docs/INSIDE.md, "Kept with the reply"):
their attention rows packed as float32 bits, exact and several times smaller than JSON lists;
a damaged row costs only its own position, and never more memory than its shape says."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import pytest

from desktop.engine.backend import LoadOptions
from desktop.engine.inside import Inside, InsideCache, inspect_all
from desktop.engine.inside.result import PACKED, unpack_attention
from desktop.engine.registry import open_backend

DEMO = Path(__file__).resolve().parents[3] / "resources" / "demo" / "chatsft_checkpoints"


@pytest.fixture(scope="module")
def cache() -> InsideCache:
    target = next(p for p in DEMO.iterdir() if p.is_dir())
    backend = open_backend(target, LoadOptions(device="cpu", dtype="float32"))
    vocab = backend.info().vocab_size
    try:
        yield inspect_all(backend, [(11 * i + 5) % vocab for i in range(120)])
    finally:
        backend.close()


def test_packed_rows_are_the_same_bits_and_several_times_smaller(cache):
    inside = cache.at(100)
    packed = json.loads(json.dumps(inside.to_dict(packed=True)))
    assert packed["attention"]["encoding"] == PACKED
    assert Inside.from_dict(packed) == inside  # every weight, bit for bit
    plain = len(json.dumps(inside.to_dict()["attention"]))
    assert len(json.dumps(packed["attention"])) * 4 < plain
    # the cache history keeps packs them too, and reads them back
    assert InsideCache.saved(json.loads(json.dumps(cache.to_dict())))[(100, inside.produced)] == inside


def test_a_damaged_position_is_left_out_and_the_others_kept(cache):
    good, bad = cache.at(40), cache.at(41)
    kept = json.loads(json.dumps(cache.to_dict()))
    for item in kept["positions"]:
        if item["position"] == bad.position:
            item["attention"]["data"] = item["attention"]["data"][:-40]
    saved = InsideCache.saved(kept)
    assert (good.position, good.produced) in saved and (bad.position, bad.produced) not in saved


def packed_block(shape: list[int], raw: bytes) -> dict:
    return {"encoding": PACKED, "shape": shape, "data": base64.b64encode(zlib.compress(raw)).decode()}


@pytest.mark.parametrize(
    ("shape", "raw", "width"),
    [
        ([2, 2, 5], bytes(2 * 2 * 5 * 4 - 4), 5),  # a row short
        ([2, 2, 5], bytes(2 * 2 * 5 * 4 + 4), 5),  # more than its shape
        ([2, 2, 6], bytes(2 * 2 * 6 * 4), 5),  # rows longer than its position
        ([10**6, 10**6, 5], bytes(40), 5),  # a shape claiming terabytes
        ([1, 1, 5], bytes(1 << 26), 5),  # 64 MB of zeros in 65 KB: inflated no further than 20 bytes
    ],
)
def test_a_damaged_block_is_one_value_error(shape, raw, width):
    with pytest.raises(ValueError):
        unpack_attention(packed_block(shape, raw), width)


def test_garbage_that_is_not_zlib_is_a_value_error():
    block = {"encoding": PACKED, "shape": [1, 1, 5], "data": base64.b64encode(b"not zlib at all").decode()}
    with pytest.raises(ValueError, match="damaged"):
        unpack_attention(block, 5)
