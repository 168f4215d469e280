"""Find checkpoints under a nanochat base dir and summarise them without loading weights.

The base dir is always passed in: which one to use (``$NANOCHAT_BASE_DIR`` or its default) is
the app's ``paths`` module's decision, and the engine imports nothing from the app.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import named_path
from desktop.engine.hf.files import display_name, find_hf_directories, is_hf_directory
from desktop.engine.hf.summary import summary_fields
from desktop.engine.kempnerforge.layout import STEP_RE, find_runs, is_kf_target
from desktop.engine.kempnerforge.summary import summary_fields as kf_summary_fields
from desktop.engine.nanochat import checkpoint as ckpt
from desktop.engine.nanochat.classify import classify
from desktop.engine.nanochat.experiment_layout import (
    EXPERIMENTS,
    find_stage_folders,
    is_stage_folder,
    tag_name,
)
from desktop.engine.runs.saving import SAVED, SaveWatch, StepState

# Phase directory -> the short source name users type (base|mid|sft|rl), plus the fork's extras.
PHASES = {
    "base_checkpoints": "base",
    "mid_checkpoints": "mid",
    "chatsft_checkpoints": "sft",
    "chatrl_checkpoints": "rl",
    "sft_checkpoints": "sft",
    "rl_checkpoints": "rl",
    "gspo_checkpoints": "rl",
}
SOURCE_ORDER = ("base", "mid", "sft", "rl", "hf", "folder")


@dataclass
class CheckpointEntry:
    source: str  # base | mid | sft | rl | folder
    tag: str
    path: Path
    steps: list[int] = field(default_factory=list)
    # steps being written, or that never finished (with a watch only): shown, not opened
    unsaved: list[StepState] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


@dataclass
class CheckpointSummary:
    path: Path
    step: int
    era: str
    params: int
    sequence_len: int
    vocab_size: int
    n_layer: int
    n_embd: int
    stored_dtype: str
    file_bytes: int
    kv_bytes_per_token: int  # at the stored precision, for memory estimates
    error: str = ""

    def memory_estimate(self, bytes_per_param: int = 4, context: int | None = None) -> int:
        """Weights at the compute precision plus a KV cache for ``context`` tokens (default sequence_len)."""
        ctx = self.sequence_len if context is None else context
        kv = self.kv_bytes_per_token // 4 * bytes_per_param * ctx if self.kv_bytes_per_token else 0
        return self.params * bytes_per_param + kv

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def source_of(directory: Path) -> str | None:
    """The stage (base|mid|sft|rl) of a nanochat checkpoint folder in either layout, None for a
    folder outside them."""
    directory = Path(directory)
    if directory.parent.name in PHASES:
        return PHASES[directory.parent.name]
    return directory.name if is_stage_folder(directory) else None


def run_tag(directory: Path) -> str:
    """A nanochat checkpoint folder's tag: ``d20`` (``<phase>_checkpoints/d20``), or
    ``<experiment>/<tag>`` in the experiment layout."""
    directory = Path(directory)
    return tag_name(directory) if is_stage_folder(directory) else directory.name


def discover(
    base: Path, extra_dirs: list[Path] | None = None, saves: SaveWatch | None = None
) -> list[CheckpointEntry]:
    """Every ``<phase>_checkpoints/<tag>/`` and every experiment's ``<name>/<tag>/<stage>/`` under
    ``base``, plus any extra checkpoint folders.

    With ``saves`` (a run being watched while it trains) a step is listed only once its files are
    whole and settled; the others are the entry's ``unsaved`` (saving…, or incomplete and why).
    Without it every step with a model file is listed, and opening one says what is wrong."""
    entries: list[CheckpointEntry] = []

    def nanochat(source: str, tag: str, folder: Path) -> None:
        if saves is None:
            if steps := ckpt.model_steps(folder):
                entries.append(CheckpointEntry(source, tag, folder, steps))
            return
        states = saves.nanochat(folder)
        saved = [s.step for s in states if s.state == SAVED]
        if saved:
            entries.append(
                CheckpointEntry(source, tag, folder, saved, [s for s in states if s.state != SAVED])
            )

    for phase, source in PHASES.items():
        root = base / phase
        if not root.is_dir():
            continue
        for tag_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            nanochat(source, tag_dir.name, tag_dir)
    for stage, tag, folder in find_stage_folders(base):
        nanochat(stage, tag, folder)
    for d in extra_dirs or []:
        if all(e.path != d for e in entries):
            nanochat("folder", d.name, d)
    # Hugging Face folders in the watched folders (one "step": the folder holds one model).
    for d in find_hf_directories([base, *(extra_dirs or [])]):
        if all(e.path != d for e in entries) and (saves is None or saves.hf(d).state == SAVED):
            entries.append(CheckpointEntry("hf", display_name(d), d, [0]))
    entries.sort(key=lambda e: (SOURCE_ORDER.index(e.source), e.tag))
    # KempnerForge runs in the watched folders, with every complete step.
    for run, steps in find_runs([base, *(extra_dirs or [])]):
        listed, unsaved = _kf_steps(run, steps, saves)
        if listed and all(e.path != run for e in entries):
            entries.append(CheckpointEntry("kempnerforge", run.name, run, listed, unsaved))
    return entries


def _kf_steps(run: Path, steps: list[int], saves: SaveWatch | None) -> tuple[list[int], list[StepState]]:
    """A KempnerForge run's steps to list, and (with a watch) those not saved yet."""
    if saves is None:
        return steps, []
    states = saves.kempnerforge(run)
    return [s.step for s in states if s.state == SAVED], [s for s in states if s.state != SAVED]


def unlisted_problem(folder: Path) -> str:
    """Why a folder in which the scan lists nothing cannot be opened, where its family can say
    (a KempnerForge step folder that is incomplete or damaged); else ""."""
    match = STEP_RE.fullmatch(folder.name)
    if match is None or not is_kf_target(folder):
        return ""
    return summarize(folder, int(match.group(1))).error


def latest_step(directory: Path) -> int:
    """The newest ``model_<step>.pt`` of a nanochat checkpoint folder (0 when there is none)."""
    steps = ckpt.model_steps(directory)
    return steps[-1] if steps else 0


def resolve_spec(spec: str, base_dir: Path) -> tuple[Path, int | None]:
    """``SOURCE[/TAG[/STEP]]`` (TAG may be an experiment's ``NAME/TAG``) or a directory ->
    (checkpoint dir, step or None). PathRefused (one line) for text no path can be."""
    p = named_path(spec)
    if p.exists():
        return p, None
    parts = spec.strip("/").split("/")
    if len(parts) > 2 and not parts[2].isdigit() and (base_dir / EXPERIMENTS / parts[1]).is_dir():
        # SOURCE/NAME/TAG[/STEP]: a tag of the experiment NAME
        parts = [parts[0], f"{parts[1]}/{parts[2]}", *parts[3:]]
    source = parts[0]
    if source not in SOURCE_ORDER[:-1]:
        raise NanoscopeError(
            f"{spec}: not a directory, and not SOURCE[/TAG[/STEP]] with SOURCE in base|mid|sft|rl"
        )
    candidates = [e for e in discover(base_dir) if e.source == source]
    if len(parts) > 1:
        candidates = [e for e in candidates if e.tag == parts[1]]
    if not candidates:
        raise NanoscopeError(f"{spec}: no such checkpoint under {base_dir}")
    entry = max(candidates, key=_tag_rank) if len(parts) == 1 else candidates[0]
    step = None
    if len(parts) > 2:
        try:
            step = int(parts[2])
        except ValueError:
            raise NanoscopeError(f"{spec}: step must be a number") from None
    return entry.path, step


def _tag_rank(entry: CheckpointEntry) -> tuple[int, float]:
    """nanochat's find_largest_model: the largest d<N> tag, else the newest folder."""
    tag = entry.tag.rsplit("/", 1)[-1]  # an experiment's NAME/TAG ranks by its TAG
    depth = int(tag[1:]) if tag.startswith("d") and tag[1:].isdigit() else -1
    try:
        mtime = entry.path.stat().st_mtime
    except OSError:
        mtime = 0.0
    return depth, mtime


def summarize(directory: Path, step: int) -> CheckpointSummary:
    """Read the meta and tensor shapes (no weight data) and classify. Errors land in ``error``."""
    if is_kf_target(directory):
        return CheckpointSummary(path=directory, step=step, **kf_summary_fields(directory, step))
    if is_hf_directory(directory):
        try:
            return CheckpointSummary(path=directory, step=step, **summary_fields(directory))
        except NanoscopeError as exc:
            return CheckpointSummary(directory, step, "?", 0, 0, 0, 0, 0, "?", 0, 0, error=str(exc))
    try:
        model_path = ckpt.model_file(directory, step)
        size = model_path.stat().st_size
    except (NanoscopeError, OSError):
        model_path, size = directory / f"model_{step:06d}.pt", 0
    empty = CheckpointSummary(directory, step, "?", 0, 0, 0, 0, 0, "?", size, 0)
    try:
        meta = ckpt.read_meta(ckpt.meta_file(directory, step))
        sd = ckpt.tensor_shapes(ckpt.model_file(directory, step))  # data.pkl alone: no torch
        cfg = classify(meta, {k: t.shape for k, t in sd.items()}, str(model_path))
    except NanoscopeError as exc:
        empty.error = str(exc)
        return empty
    by_dtype: dict[str, int] = {}
    for t in sd.values():
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes()
    stored = "+".join(sorted(by_dtype, key=lambda d: by_dtype[d], reverse=True)) if by_dtype else "?"
    return CheckpointSummary(
        path=directory,
        step=step,
        era=cfg.era,
        params=sum(t.numel() for t in sd.values()),
        sequence_len=cfg.sequence_len,
        vocab_size=cfg.vocab_size,
        n_layer=cfg.n_layer,
        n_embd=cfg.n_embd,
        stored_dtype=stored,
        file_bytes=size,
        kv_bytes_per_token=2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * 4,
    )
