"""nanochat's experiment layout (upstream PR #800, "the experiment refactor"), beside the
``<phase>_checkpoints/<tag>`` one.

Everything one experiment produces lives in ``<base>/experiments/<name>/``: ``meta.json`` (git
commit, dirty flag, dataset), ``tokenizer/``, and per model tag (``d<depth>``) a folder holding
one folder per stage (``base``, ``mid``, ``sft``, ``rl``) of ``model_<step>.pt`` + metas, beside
the stage logs (``base_train.log``, ``sft.log``, …). docs/FORMATS.md describes what is read.
"""

from __future__ import annotations

from pathlib import Path

from desktop.engine.nanochat import checkpoint as ckpt

EXPERIMENTS = "experiments"  # under the base dir (upstream lets NANOCHAT_EXPERIMENTS_DIR move it)
STAGES = ("base", "mid", "sft", "rl")


def is_experiment_dir(folder: Path) -> bool:
    """An experiment's own folder: it has the ``meta.json`` or the ``tokenizer/`` the branch's
    runner writes first (a bare ``base/`` folder elsewhere is not an experiment's)."""
    return (folder / "meta.json").is_file() or (folder / "tokenizer").is_dir()


def is_stage_folder(folder: Path) -> bool:
    """``<experiment>/<tag>/<stage>``."""
    return folder.name in STAGES and is_experiment_dir(folder.parent.parent)


def is_tag_folder(folder: Path) -> bool:
    """``<experiment>/<tag>``, with at least one stage holding a checkpoint."""
    return is_experiment_dir(folder.parent) and bool(stage_folders(folder))


def stage_folders(tag_folder: Path) -> list[tuple[str, Path]]:
    """(stage, folder) for each stage of a tag folder that holds a checkpoint, in run order."""
    return [(s, tag_folder / s) for s in STAGES if ckpt.model_steps(tag_folder / s)]


def tag_name(stage_folder: Path) -> str:
    """How a stage folder's run is named: ``<experiment>/<tag>``."""
    return f"{stage_folder.parent.parent.name}/{stage_folder.parent.name}"


def find_stage_folders(base: Path) -> list[tuple[str, str, Path]]:
    """(stage, ``<experiment>/<tag>``, folder) for every stage folder under ``base/experiments``."""
    root = base / EXPERIMENTS
    found: list[tuple[str, str, Path]] = []
    if not root.is_dir():
        return found
    for experiment in sorted(p for p in root.iterdir() if p.is_dir() and is_experiment_dir(p)):
        for tag in sorted(p for p in experiment.iterdir() if p.is_dir() and p.name != "tokenizer"):
            found += [(stage, tag_name(folder), folder) for stage, folder in stage_folders(tag)]
    return found
