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
from support.checkpoint_factory import TinyConfig, default_config, model_file, write_checkpoint
from support.golden import CASES

# The factory's era for each golden fork variant it can write (it has no Engram+mHC+MTP+SwiGLU).
FORK_ERAS = {"plain": "fork", "engram": "fork_engram", "mhc": "fork_mhc"}
SHAPE_CASES = [c for c in CASES if c.parent.name == "nanochat" or c.name in FORK_ERAS]


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


@pytest.mark.parametrize("case", SHAPE_CASES, ids=[c.name for c in SHAPE_CASES])
def test_a_factory_file_pickles_like_nanochats_own(case: Path, tmp_path: Path):
    model, meta = golden_base(case)
    era = FORK_ERAS.get(case.name, case.name)
    sizes = {k: v for k, v in meta["model_config"].items() if k in TinyConfig.__dataclass_fields__}
    written = write_checkpoint(tmp_path, era, cfg=default_config(era, **sizes), tokenizer=None)
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
