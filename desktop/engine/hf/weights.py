"""Load a Hugging Face model's safetensors weights, strictly and within budget.

In order, before any tensor data is read: the headers of every file are parsed
(:mod:`.hf_files`), the tensor names must be exactly the ones the config implies (missing and
unexpected keys are listed), every shape must match, every dtype must be a float type this app
computes with, and the weights at the compute precision must fit the free memory. Only then are
the tensors read with ``safetensors.safe_open`` (memory-mapped files, no pickle), converted to
the compute dtype, and checked to be finite.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from desktop.engine.errors import CheckpointError, OutOfMemoryError, UnsupportedFormatError, is_out_of_memory
from desktop.engine.files.finite import check_finite
from desktop.engine.hf.config import HFConfig
from desktop.engine.hf.files import FLOAT_DTYPES, TensorInfo, read_tensor_index
from desktop.engine.kernels.memory import available_ram, human
from desktop.engine.text_lines import error_text

logger = logging.getLogger(__name__)


def check_tensors(directory: Path, config: HFConfig, tensors: dict[str, TensorInfo]) -> None:
    """Keys, shapes and dtypes against the config; one line listing what differs."""
    expected = config.expected_shapes()
    found = dict(tensors)
    if config.tie_embeddings and "lm_head.weight" in found:
        # Some writers store the tied head anyway; transformers ties it to the embedding.
        if found["lm_head.weight"].shape != expected["model.embed_tokens.weight"]:
            raise CheckpointError(
                f"{directory}: lm_head.weight has shape {list(found['lm_head.weight'].shape)}"
            )
        del found["lm_head.weight"]
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_some(missing)}")
        if unexpected:
            parts.append(f"unexpected {_some(unexpected)}")
        raise CheckpointError(f"{directory}: the weights do not match config.json: {'; '.join(parts)}")
    for name, shape in expected.items():
        if found[name].shape != shape:
            raise CheckpointError(
                f"{directory}: {name} has shape {list(found[name].shape)}, config.json implies {list(shape)}"
            )
    odd = sorted({info.dtype for info in found.values()} - set(FLOAT_DTYPES))
    if odd:
        raise UnsupportedFormatError(f"{directory}: tensors stored as {', '.join(odd)} are not supported")


def _some(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def check_budget(directory: Path, config: HFConfig, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse before allocating when the weights at ``dtype`` cannot fit the free RAM (CPU/MPS)."""
    if device.type == "cuda":
        return  # torch reports a CUDA out-of-memory itself, as one line (errors.is_out_of_memory)
    needed = config.n_params() * torch.empty((), dtype=dtype).element_size()
    free = available_ram()
    if free is not None and needed > free:
        raise OutOfMemoryError(
            f"{directory}: the weights need about {human(needed)} as {str(dtype).removeprefix('torch.')}; "
            f"{human(free)} of RAM is free"
        )


def load_weights(
    directory: Path, config: HFConfig, dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """The checked tensors on ``device`` in ``dtype``."""
    from safetensors import SafetensorError, safe_open

    tensors = read_tensor_index(directory)
    check_tensors(directory, config, tensors)
    check_budget(directory, config, dtype, device)
    wanted = config.expected_shapes()
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(tensors[name].file, []).append(name)
    weights: dict[str, torch.Tensor] = {}
    try:
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in names:
                    weights[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    except (SafetensorError, OSError, RuntimeError, MemoryError) as exc:
        if is_out_of_memory(exc):
            raise OutOfMemoryError(f"{directory}: out of memory while reading the weights") from None
        raise CheckpointError(f"{directory}: cannot read the weights ({error_text(exc)})") from None
    check_finite(weights, directory)
    return weights
