"""A KempnerForge run's model config: its training TOML's ``[model]`` and ``[data]`` tables.

KempnerForge does not store the config in the checkpoint (checkpoint-formats spec §3.2), so it
comes from the TOML the run was trained with: one given explicitly (``--config``, a chooser, or
one remembered for the run), else the only training TOML next to the run or in its parent.
Fields and defaults are KempnerForge's ``ModelConfig``; MoE and VLM runs are refused naming the
field that makes them so. torch-free.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.engine.errors import CheckpointError, UnsupportedFormatError
from desktop.engine.files import bounded
from desktop.engine.files.numbers import NumberRefused, describe, finite_float, integer
from desktop.engine.kempnerforge.layout import KFCheckpoint, run_dir

logger = logging.getLogger(__name__)

# 256k positions: Llama 3.1's 128k twice over. The RoPE table for it is 128 MB at head_dim 128.
MAX_SEQ_LEN = 1 << 18
MAX_INT = 1 << 31  # no size or count of a model comes near it; past it the sizes' products overflow
NORM_TYPES = ("rmsnorm", "layernorm")
ACTIVATIONS = ("silu", "gelu", "relu")
SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")
NO_TOML = (
    "KempnerForge checkpoints do not store the model config; pass the training TOML (--config TRAIN.toml)"
)

# [model] fields: name -> (kind, default). Kinds: int, float, bool, str, int? (int or absent/None).
_FIELDS: dict[str, tuple[str, Any]] = {
    "dim": ("int", 4096),
    "n_layers": ("int", 32),
    "n_heads": ("int", 32),
    "n_kv_heads": ("int?", None),
    "vocab_size": ("int", 32000),
    "ffn_dim_multiplier": ("float", 1.0),
    "ffn_hidden_dim": ("int?", None),
    "norm_type": ("str", "rmsnorm"),
    "norm_eps": ("float", 1e-5),
    "activation": ("str", "silu"),
    "max_seq_len": ("int", 2048),
    "rope_theta": ("float", 10000.0),
    "tie_embeddings": ("bool", False),
    "qk_norm": ("bool", False),
    "init_std": ("float", 0.02),
    "model_type": ("str", "transformer"),
    "sdpa_backend": ("str", "auto"),
    "num_experts": ("int", 0),
}
# MoE knobs: they change nothing while num_experts is 0.
_MOE_FIELDS = frozenset(
    {
        "moe_top_k",
        "moe_frequency",
        "moe_router",
        "moe_shared_experts",
        "moe_aux_loss_weight",
        "moe_capacity_factor",
        "moe_sequence_aux_loss_weight",
        "moe_gradient_scale",
        "moe_bias_schedule",
        "moe_packed_experts",
        "moe_expert_ffn_multiplier",
        "moe_router_z_loss_weight",
    }
)


@dataclass(frozen=True)
class KFModelConfig:
    """KempnerForge's dense ``ModelConfig`` (the fields that shape the forward)."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_hidden_dim: int  # the explicit value, or the multiplier rule's
    norm_type: str
    norm_eps: float
    activation: str
    max_seq_len: int
    rope_theta: float
    tie_embeddings: bool
    qk_norm: bool
    sdpa_backend: str

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def rope_len(self) -> int:
        """The longest sequence the model runs (KempnerForge's RoPE table is max_seq_len long)."""
        return self.max_seq_len

    def describe(self) -> str:
        """ "rmsnorm · silu · GQA 4/2 · qk-norm · tied" """
        attn = (
            f"GQA {self.n_heads}/{self.n_kv_heads}"
            if self.n_kv_heads != self.n_heads
            else f"MHA {self.n_heads}"
        )
        bits = [self.norm_type, self.activation, attn]
        if self.qk_norm:
            bits.append("qk-norm")
        bits.append("tied" if self.tie_embeddings else "untied")
        return " · ".join(bits)


@dataclass(frozen=True)
class KFRunConfig:
    path: Path  # the TOML
    model: KFModelConfig
    tokenizer_path: str  # [data] tokenizer_path: a directory or a hub id ("" when unset)
    warnings: tuple[str, ...] = ()


def ffn_hidden_dim(dim: int, multiplier: float, explicit: int | None) -> int:
    """KempnerForge's rule: the explicit size, else 4·dim·2/3·multiplier rounded up to 256;
    NumberRefused when that product overflows a float."""
    if explicit is not None:
        return explicit
    raw = int(finite_float(4 * dim * (2 / 3) * multiplier))  # the same float operations, in order
    return 256 * math.ceil(raw / 256)


def read_toml(path: Path) -> dict[str, Any]:
    path = Path(path).expanduser()
    try:
        return bounded.read_toml(path)
    except bounded.FileMissing:
        raise CheckpointError(f"{path}: training TOML not found") from None
    except bounded.FileRefused as exc:
        raise CheckpointError(str(exc)) from None


def _value(table: dict[str, Any], name: str, path: Path) -> Any:
    kind, default = _FIELDS[name]
    if name not in table:
        return default
    v = table[name]
    ok = {
        "int": type(v) is int,
        "int?": type(v) is int,
        "float": type(v) in (int, float),
        "bool": type(v) is bool,
        "str": isinstance(v, str),
    }[kind]
    if not ok:
        wanted = {"int": "an integer", "int?": "an integer", "float": "a number", "bool": "true or false"}
        raise CheckpointError(f"{path}: model.{name} must be {wanted.get(kind, 'text')}, got {describe(v)}")
    try:  # TOML allows inf, nan and 4,000-digit integers; the model's arithmetic does not
        if kind == "float":
            return finite_float(v)
        return integer(v, -MAX_INT, MAX_INT) if kind in ("int", "int?") else v
    except NumberRefused as exc:
        raise CheckpointError(f"{path}: model.{name} {exc}") from None


def _refuse_variants(data: dict[str, Any], model: dict[str, Any], path: Path) -> None:
    vlm = data.get("vlm")
    if vlm is not None:
        arch = vlm.get("arch", "joint_decoder") if isinstance(vlm, dict) else vlm
        raise UnsupportedFormatError(
            f"{path}: KempnerForge VLM runs are not supported ([vlm] arch = {arch!r}); "
            "text-only dense models are"
        )
    experts = model.get("num_experts", 0)
    if experts:
        raise UnsupportedFormatError(
            f"{path}: KempnerForge MoE models are not supported (model.num_experts = {experts!r}); "
            "dense models are"
        )
    model_type = model.get("model_type", "transformer")
    if model_type != "transformer":
        raise UnsupportedFormatError(
            f"{path}: model.model_type = {model_type!r} is not supported "
            "(only KempnerForge's dense 'transformer')"
        )


def parse_config(data: dict[str, Any], path: Path) -> KFRunConfig:
    """The run config of a parsed TOML, checked as KempnerForge's ModelConfig checks it."""
    model = data.get("model")
    if not isinstance(model, dict):
        raise CheckpointError(f"{path}: no [model] table (is this a KempnerForge training TOML?)")
    _refuse_variants(data, model, path)
    v = {name: _value(model, name, path) for name in _FIELDS}
    warnings = []
    unknown = sorted(set(model) - set(_FIELDS) - _MOE_FIELDS)
    if unknown:
        warnings.append(
            f"{path.name}: unknown [model] keys {', '.join(unknown)} (ignored; a newer KempnerForge may "
            "use them, and the model may then not run as trained)"
        )
    n_kv = v["n_kv_heads"] if v["n_kv_heads"] is not None else v["n_heads"]
    for name in ("dim", "n_layers", "n_heads", "vocab_size", "max_seq_len"):
        if v[name] <= 0:
            raise CheckpointError(f"{path}: model.{name} must be positive, got {v[name]}")
    if n_kv <= 0:
        raise CheckpointError(f"{path}: model.n_kv_heads must be positive, got {n_kv}")
    if v["dim"] % v["n_heads"]:
        raise CheckpointError(f"{path}: model.dim ({v['dim']}) must be divisible by n_heads ({v['n_heads']})")
    if v["n_heads"] % n_kv:
        raise CheckpointError(
            f"{path}: model.n_heads ({v['n_heads']}) must be divisible by n_kv_heads ({n_kv})"
        )
    if (v["dim"] // v["n_heads"]) % 2:
        raise CheckpointError(f"{path}: head_dim {v['dim'] // v['n_heads']} must be even for RoPE")
    for name, allowed in (
        ("norm_type", NORM_TYPES),
        ("activation", ACTIVATIONS),
        ("sdpa_backend", SDPA_BACKENDS),
    ):
        if v[name] not in allowed:
            raise CheckpointError(
                f"{path}: model.{name} = {v[name]!r} (expected one of {', '.join(allowed)})"
            )
    if v["ffn_hidden_dim"] is not None and v["ffn_hidden_dim"] <= 0:
        raise CheckpointError(f"{path}: model.ffn_hidden_dim must be positive, got {v['ffn_hidden_dim']}")
    if v["norm_eps"] < 0:  # finite already (_value)
        raise CheckpointError(f"{path}: model.norm_eps must be a finite number >= 0")
    if not v["rope_theta"] > 0:
        raise CheckpointError(f"{path}: model.rope_theta must be a finite number > 0")
    if v["max_seq_len"] > MAX_SEQ_LEN:  # its RoPE table is built before anything else is checked
        raise CheckpointError(
            f"{path}: model.max_seq_len = {v['max_seq_len']} is over {MAX_SEQ_LEN}, the most Nanoscope runs"
        )
    try:  # a finite multiplier can still make a size no model has, or no float holds
        ffn: int | None = ffn_hidden_dim(v["dim"], v["ffn_dim_multiplier"], v["ffn_hidden_dim"])
    except NumberRefused:
        ffn = None
    if ffn is None or not 0 < ffn <= MAX_INT:
        raise CheckpointError(
            f"{path}: model.ffn_dim_multiplier = {v['ffn_dim_multiplier']:g} makes an FFN size of "
            + (describe(ffn) if ffn is not None else "more than a float holds")
        )
    cfg = KFModelConfig(
        dim=v["dim"],
        n_layers=v["n_layers"],
        n_heads=v["n_heads"],
        n_kv_heads=n_kv,
        vocab_size=v["vocab_size"],
        ffn_hidden_dim=ffn,
        norm_type=v["norm_type"],
        norm_eps=v["norm_eps"],
        activation=v["activation"],
        max_seq_len=v["max_seq_len"],
        rope_theta=v["rope_theta"],
        tie_embeddings=v["tie_embeddings"],
        qk_norm=v["qk_norm"],
        sdpa_backend=v["sdpa_backend"],
    )
    data_table = data.get("data")
    tokenizer = data_table.get("tokenizer_path", "") if isinstance(data_table, dict) else ""
    if not isinstance(tokenizer, str):
        raise CheckpointError(f"{path}: data.tokenizer_path must be text, got {describe(tokenizer)}")
    try:
        bounded.named_path(tokenizer)  # looked for as a folder later: a NUL or a long name is no folder
    except bounded.PathRefused as exc:
        raise CheckpointError(f"{path}: data.tokenizer_path: {exc}") from None
    return KFRunConfig(Path(path), cfg, tokenizer, tuple(warnings))


def _checkpoint_dir_name(data: dict[str, Any]) -> str | None:
    table = data.get("checkpoint")
    d = table.get("dir") if isinstance(table, dict) else None
    return Path(d).name if isinstance(d, str) and d else None


def find_config(ckpt: KFCheckpoint) -> Path:
    """The training TOML next to the run (or in its parent); several: the one whose
    ``[checkpoint] dir`` names this run. CheckpointError when none or no single one fits."""
    places = [ckpt.run, ckpt.run.parent]
    if ckpt.step_dir not in places:
        places.insert(0, ckpt.step_dir)
    candidates: list[tuple[Path, dict[str, Any]]] = []
    skipped: list[str] = []  # TOMLs that could not be read, and why
    for place in places:
        try:
            tomls = sorted(p for p in place.glob("*.toml") if p.is_file())
        except OSError:
            continue
        for p in tomls:
            try:
                data = read_toml(p)
            except CheckpointError as exc:
                skipped.append(str(exc))
                continue
            if isinstance(data.get("model"), dict):
                candidates.append((p, data))
        if candidates:
            break  # the nearest folder with training TOMLs decides
    looked = ", ".join(str(p) for p in places)
    if not candidates:
        why = ""
        if skipped:
            why = f"; skipped {skipped[0]}" + (f" and {len(skipped) - 1} more" if len(skipped) > 1 else "")
        raise CheckpointError(f"{ckpt.run}: {NO_TOML}; none found in {looked}{why}")
    if len(candidates) == 1:
        return candidates[0][0]
    named = [p for p, data in candidates if _checkpoint_dir_name(data) == ckpt.run.name]
    if len(named) == 1:
        return named[0]
    names = ", ".join(p.name for p, _ in candidates)
    raise CheckpointError(
        f"{ckpt.run}: several training TOMLs ({names}) in {candidates[0][0].parent}; pass one with --config"
    )


def load_config(ckpt: KFCheckpoint, explicit: Path | None = None) -> KFRunConfig:
    path = Path(explicit).expanduser() if explicit is not None else find_config(ckpt)
    return parse_config(read_toml(path), path)


class ConfigMemory:
    """Which TOML was chosen for which run: a small JSON map the caller keeps (e.g. in the cache
    dir), so a run opened once with ``--config`` opens the same way next time."""

    def __init__(self, file: Path) -> None:
        self.file = Path(file)

    def _read(self) -> dict[str, str]:
        if not self.file.exists():
            return {}
        try:
            data = bounded.read_json(self.file, "state")
        except bounded.FileRefused as exc:
            logger.warning("Ignoring the remembered KempnerForge configs: %s", exc)
            return {}
        return (
            {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
            if isinstance(data, dict)
            else {}
        )

    @staticmethod
    def _key(path: Path) -> str:
        return str(run_dir(path).resolve())

    def get(self, path: Path) -> Path | None:
        """The TOML remembered for the run ``path`` names (the run, or one of its steps)."""
        value = self._read().get(self._key(path))
        try:
            toml = bounded.named_path(value) if value else None
        except bounded.PathRefused:  # the app's own file, damaged: as if nothing was remembered
            return None
        return toml if toml is not None and toml.is_file() else None

    def remember(self, run: Path, toml: Path) -> None:
        data = self._read()
        data[self._key(run)] = str(Path(toml).expanduser().resolve())
        tmp = self.file.with_name(self.file.name + ".tmp")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.file)
        except OSError as exc:
            logger.warning("Could not remember the KempnerForge config for %s: %s", run, exc)
