"""What every golden-file writer shares: exporting an upstream revision, recording its commits,
importing it in isolation, and writing a case's manifest within the size budget.

An upstream revision is exported with ``git archive`` into a temporary folder (the mirror has no
work tree), imported from there under its own package name, and dropped from ``sys.modules``
afterwards, so two revisions of one package can be used in one process, one after the other.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import random
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# Budgets from issue 20: every case under 2 MB, the whole corpus under 25 MB.
MAX_CASE_BYTES = 2 << 20
MAX_CORPUS_BYTES = 25 << 20
MANIFEST = "golden.json"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def resolve(repo: Path, rev: str) -> str:
    """The full commit hash of ``rev`` in ``repo``."""
    return git(repo, "rev-parse", f"{rev}^{{commit}}")


def export(repo: Path, commit: str, dest: Path, paths: Sequence[str] = ()) -> Path:
    """The tree of ``commit`` (only ``paths`` when given: a mirror may lack large files outside
    them) written into ``dest`` (created); returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    data = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit, "--", *paths],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def file_commits(repo: Path, commit: str, paths: Sequence[str]) -> dict[str, str]:
    """For each path, the last commit at or before ``commit`` that changed it."""
    return {p: git(repo, "log", "-1", "--format=%H", commit, "--", p) for p in paths}


@contextlib.contextmanager
def imported_from(root: Path, package: str) -> Iterator[None]:
    """``root`` first on ``sys.path`` while the block runs; afterwards every module of
    ``package`` is forgotten, so the next revision imports its own."""
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def write_manifest(case: Path, manifest: dict[str, Any]) -> None:
    """``golden.json`` in ``case``: the caller's facts (upstream repo, commits, config, expected
    ids) plus the sha256 of every file in the case. Refuses a case over the size budget."""
    files = sorted(p for p in case.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest = {**manifest, "files": {str(p.relative_to(case)): sha256(p) for p in files}}
    (case / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    size = tree_bytes(case)
    if size > MAX_CASE_BYTES:
        raise SystemExit(f"{case}: {size} bytes, over the {MAX_CASE_BYTES} budget of one case")


def check_corpus(root: Path) -> int:
    """The corpus's total size, refused over budget."""
    size = tree_bytes(root)
    if size > MAX_CORPUS_BYTES:
        raise SystemExit(f"{root}: {size} bytes, over the {MAX_CORPUS_BYTES} budget of the corpus")
    return size


# A story told in a fixed order (each sentence mostly followed by the next), the training text of
# the KempnerForge and transformers cases: greedy decoding is then decided by clear logit gaps
# while sampling still has choices. Every document ends with the closing sentence.
STORY = (
    "the small cat sat on the red mat.",
    "a big dog ran to the old barn.",
    "two blue birds sang in the tall tree.",
    "one red fox hid under the green hat.",
    "my old friend came home at night.",
    "we ate bread and drank warm milk.",
    "her little boat sailed on the lake.",
    "his brown horse jumped over the wall.",
)
CLOSING = "and so it was the end."


def story_documents(rng: random.Random, n: int) -> list[str]:
    docs = []
    for _ in range(n):
        i, sentences = rng.randrange(len(STORY)), []
        for _ in range(rng.randint(3, 9)):
            sentences.append(STORY[i])
            i = (i + 1) % len(STORY) if rng.random() < 0.85 else rng.randrange(len(STORY))
        docs.append(" ".join([*sentences, CLOSING]))
    return docs
