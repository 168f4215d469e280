"""The golden corpus (tests/golden/, written by each tool's own code through ``python -m
tools.golden``): where its cases are, what each recorded, and how Nanoscope's ids are compared
with them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from support import REPO

GOLDEN = REPO / "tests" / "golden"
# nanochat's eras, then the C++ fork's variants (the same loader, the same checks)
CASES = [
    *sorted(p.parent for p in (GOLDEN / "nanochat").glob("*/golden.json")),
    *sorted(p.parent for p in (GOLDEN / "fork").glob("*/golden.json")),
]
# nanochat's experiment layout (the experiment_refactor branch, PR #800): <case>/experiments/...
EXPERIMENT_CASES = sorted(p.parent for p in (GOLDEN / "nanochat-experiment").glob("*/golden.json"))
MAX_NEW = 40
# <|python_end|> in every case's 300-token vocabulary (the 7th of the last nine); <|assistant_end|>
# is two before it and <|bos|> six before.
PYTHON_END = 297


def manifest(case: Path) -> dict:
    return json.loads((case / "golden.json").read_text(encoding="utf-8"))


def assert_files_as_written(case: Path) -> None:
    """Every file of the case is the one its writer hashed, and the case is within 2 MB."""
    files = manifest(case)["files"]
    for rel, digest in files.items():
        assert hashlib.sha256((case / rel).read_bytes()).hexdigest() == digest, rel
    assert sum((case / rel).stat().st_size for rel in files) < 2 << 20


def against_engine(m: dict) -> bool:
    """Compared with nanochat's Engine, or with its full-forward GPT.generate where the Engine
    cannot run on a CPU at that revision or computes otherwise (golden.json says why)."""
    return m["compare_with"] == "Engine.generate"


def until_the_tool(ids: list[int], python_end: int) -> list[int]:
    """GPT.generate has no calculator and no stop token: compare up to the first calculator
    call's end or the end of the reply, where the Engine and Nanoscope act and it does not."""
    stops = [i for i, t in enumerate(ids) if t in (python_end, python_end - 2, python_end - 6)]
    return ids[: stops[0] + 1] if stops else ids


def check(m: dict, got: list[int], want: list[int], python_end: int, what: str) -> None:
    if against_engine(m):
        assert got == want, what
    else:
        assert until_the_tool(got, python_end) == until_the_tool(want, python_end), what


def reference(m: dict, c: dict) -> tuple[list[int], dict[str, list[int]]]:
    kind = "engine" if against_engine(m) else "naive"
    return c[f"{kind}_greedy"], c[f"{kind}_sampled"]


def copy_base(era: str, root: Path) -> Path:
    """The era's golden base checkpoint and tokenizer copied under ``root`` (a nanochat base dir),
    so a test may spoil them; returns the checkpoint directory."""
    case = GOLDEN / "nanochat" / era
    for source in [*case.glob("base_checkpoints/*/*"), *case.glob("tokenizer/*")]:
        target = root / source.relative_to(case)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return next((root / "base_checkpoints").iterdir())
