"""Real training runs as a test drives them (support/live_training.py): nanochat's own
``base_train`` and KempnerForge's own ``scripts/train.py``, pinned under tests/upstream/, train
on the CPU in a subprocess and save three steps that Nanoscope opens; a writer killed mid-save
leaves the step incomplete, as a killed job does."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from support import REPO
from support.live_training import (
    KILLED,
    nanochat_checkpoints,
    start_kf_training,
    start_nanochat_training,
)

from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.kempnerforge.backend import KempnerForgeBackend
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.registry import open_backend

UPSTREAM = REPO / "tests" / "upstream"
PINNED = {
    "nanochat": "92d63d4e8bb4df75c3b71618f31ddde2378b2bcd",
    "kempnerforge": "5666d0d161539998210f99f16f986b1ab76cbffe",
}


def listed(folder: Path) -> dict[str, str]:
    """SOURCE.md's list: ``{path: sha256}`` (``sha256sum`` lines in its fenced block)."""
    text = (folder / "SOURCE.md").read_text(encoding="utf-8")
    return {path: digest for digest, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", text, re.M)}


@pytest.mark.parametrize("tool", sorted(PINNED))
def test_the_pinned_upstream_files_are_byte_identical_to_their_list(tool):
    folder = UPSTREAM / tool
    files = listed(folder)
    assert PINNED[tool] in (folder / "SOURCE.md").read_text(encoding="utf-8")
    assert "LICENSE" in files
    on_disk = {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != "SOURCE.md" and "__pycache__" not in p.parts
    }
    assert on_disk == set(files)
    for path, digest in files.items():
        assert hashlib.sha256((folder / path).read_bytes()).hexdigest() == digest, path


def open_nanochat(base_dir: Path, step: int) -> NanochatBackend:
    return NanochatBackend.open(
        nanochat_checkpoints(base_dir),
        LoadOptions(step=step, device="cpu", dtype="float32", base_dir=base_dir),
    )


def open_kf(run: Path, step: int | None) -> KempnerForgeBackend:
    backend = open_backend(run, LoadOptions(step=step, device="cpu", dtype="float32"))
    assert isinstance(backend, KempnerForgeBackend)
    return backend


def held_at(run, step: int) -> None:
    """Until the runner holds the save of ``step`` (its log says so)."""
    import time

    deadline = time.monotonic() + 120
    while f"holding the save of step {step}" not in run.log(tail=1000):
        assert run.poll() is None, run.log()
        assert time.monotonic() < deadline, run.log()
        time.sleep(0.02)


@pytest.mark.slow
def test_nanochat_base_train_saves_three_steps_that_nanoscope_opens(tmp_path):
    base = tmp_path / "nanochat"
    run = start_nanochat_training(base, hold=True)
    try:
        ckpt = nanochat_checkpoints(base)
        run.allow(10)
        run.wait_saved(10)
        held_at(run, 20)  # trained to step 20, its save held: step 10 only
        assert sorted(p.name for p in ckpt.iterdir()) == [
            "meta_000010.json",
            "model_000010.pt",
            "optim_000010_rank0.pt",
        ]
        run.allow(20)
        run.allow(30)
        run.finish()
    finally:
        run.stop()
    assert sorted(p.name for p in (base / "tokenizer").iterdir()) == ["token_bytes.pt", "tokenizer.pkl"]
    for step in (10, 20, 30):
        meta = json.loads((ckpt / f"meta_{step:06d}.json").read_text(encoding="utf-8"))
        assert meta["step"] == step
        assert meta["model_config"]["n_layer"] == 2 and meta["model_config"]["n_embd"] == 64
        assert isinstance(meta["val_bpb"], float)
        assert (ckpt / f"optim_{step:06d}_rank0.pt").is_file()
        backend = open_nanochat(base, step)
        try:
            assert backend.info().step == step
            assert backend.render("the small cat", None).ids
        finally:
            backend.close()


@pytest.mark.slow
def test_a_nanochat_writer_killed_mid_save_leaves_a_truncated_model_and_no_meta(tmp_path):
    base = tmp_path / "nanochat"
    run = start_nanochat_training(base, kill_mid_save_at=20)
    try:
        run.wait_killed()
    finally:
        run.stop()
    assert run.returncode == KILLED
    ckpt = nanochat_checkpoints(base)
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "meta_000010.json",
        "model_000010.pt",
        "model_000020.pt",
        "optim_000010_rank0.pt",
    ]
    whole, cut = (ckpt / "model_000010.pt").stat().st_size, (ckpt / "model_000020.pt").stat().st_size
    assert 0 < cut < whole
    with pytest.raises(RuntimeError):
        torch.load(ckpt / "model_000020.pt", map_location="cpu", weights_only=True)
    with pytest.raises(NanoscopeError):
        open_nanochat(base, 20).close()
    backend = open_nanochat(base, 10)
    backend.close()


@pytest.mark.slow
def test_kempnerforge_train_saves_three_steps_that_nanoscope_opens(tmp_path):
    folder = tmp_path / "kf"
    run = start_kf_training(folder, hold=True)
    try:
        run.allow(10)
        run.wait_saved(10)
        held_at(run, 20)
        assert sorted(p.name for p in run.checkpoints.iterdir()) == ["latest", "step_10"]
        run.allow(20)
        run.allow(30)
        run.finish()
    finally:
        run.stop()
    out = run.checkpoints
    assert sorted(p.name for p in out.iterdir()) == ["latest", "step_10", "step_20", "step_30"]
    assert (out / "latest").readlink() == Path("step_30")
    for step in (10, 20, 30):
        names = sorted(p.name for p in (out / f"step_{step}").iterdir())
        assert names == [".metadata", "__0_0.distcp", "metadata.json", "train_state.pt"]
        backend = open_kf(out, step)
        try:
            assert backend.info().step == step
            assert backend.render("the small cat", None).ids
        finally:
            backend.close()
    backend = open_kf(out, None)
    try:
        assert backend.info().step == 30
    finally:
        backend.close()


@pytest.mark.slow
def test_a_kempnerforge_writer_killed_mid_save_leaves_shards_without_metadata(tmp_path):
    run = start_kf_training(tmp_path / "kf", kill_mid_save_at=20)
    try:
        run.wait_killed()
    finally:
        run.stop()
    out = run.checkpoints
    assert sorted(p.name for p in out.iterdir()) == ["latest", "step_10", "step_20"]
    assert sorted(p.name for p in (out / "step_20").iterdir()) == ["__0_0.distcp"]
    assert (out / "latest").readlink() == Path("step_10")
    backend = open_kf(out, None)
    try:
        assert backend.info().step == 10
    finally:
        backend.close()


def test_steps_must_be_what_the_tools_save(tmp_path):
    with pytest.raises(ValueError, match="k, 2k"):
        start_nanochat_training(tmp_path, steps=(10, 25))
    with pytest.raises(ValueError, match="not one of"):
        start_kf_training(tmp_path, kill_mid_save_at=15)
