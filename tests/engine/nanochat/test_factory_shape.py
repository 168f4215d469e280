"""The checkpoint factory writes what nanochat writes: for every era, a factory file and the golden
file nanochat's own ``save_checkpoint`` wrote (same era, same sizes) pickle the same structure, opcode
for opcode: an ``OrderedDict`` built with the same keys in the same order, tensors rebuilt by the
same functions with the same storage types, and the ``_metadata`` BUILD naming the same modules.
Only numbers (shapes, strides, sizes, memo slots) are left out of the comparison."""

from __future__ import annotations

import json
import pickletools
import zipfile
from pathlib import Path

import pytest
import torch
from support.checkpoint_factory import default_config, model_file, write_checkpoint
from support.golden import CASES

SIZES = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")


def skeleton(path: Path) -> list[tuple[str, object]]:
    """The opcodes of the file's ``data.pkl``, each with its argument when that is a name (a
    global, a key, a module path) rather than a number."""
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    return [(op.name, arg if isinstance(arg, str) else None) for op, arg, _ in pickletools.genops(data)]


def golden_base(case: Path) -> tuple[Path, dict]:
    model = next((case / "base_checkpoints").glob("*/model_*.pt"))
    meta_file = model.with_name(model.name.replace("model_", "meta_").replace(".pt", ".json"))
    return model, json.loads(meta_file.read_text())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_factory_file_pickles_like_nanochats_own(case: Path, tmp_path: Path):
    model, meta = golden_base(case)
    sizes = {k: meta["model_config"][k] for k in SIZES}
    written = write_checkpoint(tmp_path, case.name, cfg=default_config(case.name, **sizes), tokenizer=None)
    ours, theirs = skeleton(model_file(written)), skeleton(model)
    assert ("GLOBAL", "collections OrderedDict") in theirs and ("BUILD", None) in theirs
    assert ours == theirs


def test_the_comparison_sees_a_flat_dict(tmp_path: Path):
    """A plain dict of the same tensors (what the factory wrote before) is told apart."""
    case = CASES[-1]
    model, _ = golden_base(case)
    flat = tmp_path / "model_000001.pt"
    torch.save(dict(torch.load(model, weights_only=True)), flat)
    assert skeleton(flat) != skeleton(model)
    assert ("BUILD", None) not in skeleton(flat)
