"""Folders of hostile files, each beside what a scan walks (a nanochat base dir): a KempnerForge
run with a trillion pipeline stages or a 30,000-part dotted TOML key, HF folders whose weights are
a FIFO or whose tokenizer is /dev/zero or whose rope_theta is 0, a nanochat model file that is a
FIFO, a meta of 100,000 escaped quotes. ``HOSTILE``: name -> (builder(base) -> its folder, what
the refusal says)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from support.checkpoint_factory import write_checkpoint
from support.hf_factory import write_hf_model
from support.kf_reference import RefConfig, write_run


def _kf_with_a_trillion_stages(base: Path) -> Path:
    run, _ = write_run(base / "kf", RefConfig(), steps=(10,))
    (run / "step_20" / "pp1000000000000").mkdir(parents=True)  # one stage named 10^12
    return run / "step_20"


def _kf_dotted_toml(base: Path) -> Path:
    run, _ = write_run(base / "kf2", RefConfig(), steps=(10,))
    (run.parent / "train.toml").write_text("a" + ".a" * 30_000 + " = 1\n")
    return run


def _hf_fifo_weights(base: Path) -> Path:
    folder = write_hf_model(base / "hf-fifo", "llama")
    weights = next(folder.glob("*.safetensors"))
    weights.unlink()
    os.mkfifo(weights)  # reading it would block for ever
    return folder


def _hf_tokenizer_dev_zero(base: Path) -> Path:
    folder = write_hf_model(base / "hf-zero", "llama")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("/dev/zero")
    return folder


def _hf_zero_rope(base: Path) -> Path:
    folder = write_hf_model(base / "hf-rope", "llama")
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = 0
    if isinstance(config.get("rope_parameters"), dict):  # transformers 5 keeps it here
        config["rope_parameters"]["rope_theta"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _nanochat_fifo_model(base: Path) -> Path:
    tag = base / "base_checkpoints" / "fifo"
    tag.mkdir(parents=True)
    os.mkfifo(tag / "model_000001.pt")
    (tag / "meta_000001.json").write_text("{}")
    return tag


def _nanochat_quadratic_meta(base: Path) -> Path:
    ckpt = write_checkpoint(base, "E7", phase="base", tag="quotes", step=1, tokenizer=None)
    (ckpt / "meta_000001.json").write_text('"' + '\\"' * 100_000)
    return ckpt


HOSTILE = {
    "kf-trillion-stages": (_kf_with_a_trillion_stages, "pipeline stages pp0 are missing"),
    "kf-dotted-toml": (_kf_dotted_toml, "a dotted key of 32 parts or more"),
    "hf-fifo-weights": (_hf_fifo_weights, "not a regular file (a named pipe)"),
    "hf-tokenizer-dev-zero": (_hf_tokenizer_dev_zero, "not a regular file (a device)"),
    "hf-rope-theta-0": (_hf_zero_rope, "rope_theta must be a finite positive number"),
    "nanochat-fifo-model": (_nanochat_fifo_model, "no model file for step 1"),
    "nanochat-quadratic-meta": (_nanochat_quadratic_meta, "a string is never closed"),
}
