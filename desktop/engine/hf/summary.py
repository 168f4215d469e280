"""What the picker shows of a Hugging Face model before loading it: read from ``config.json`` and
the safetensors headers only, so no weight is read and torch is not imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from desktop.engine.hf.config import parse_config
from desktop.engine.hf.files import CONFIG_NAME, read_json, read_tensor_index

# safetensors dtype names as the app names precisions.
DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def summary_fields(directory: Path) -> dict[str, Any]:
    """The fields of a ``CheckpointSummary`` for ``directory`` (raises a NanoscopeError)."""
    config = parse_config(read_json(directory / CONFIG_NAME, "model config"), directory / CONFIG_NAME)
    tensors = read_tensor_index(directory)
    by_dtype: dict[str, int] = {}
    for info in tensors.values():
        name = DTYPE_NAMES.get(info.dtype, info.dtype)
        by_dtype[name] = by_dtype.get(name, 0) + info.nbytes
    return {
        "era": config.family,
        "params": config.n_params(),
        "sequence_len": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "n_layer": config.n_layer,
        "n_embd": config.hidden_size,
        "stored_dtype": "+".join(sorted(by_dtype, key=by_dtype.__getitem__, reverse=True)) or "?",
        "file_bytes": sum({info.file: info.file.stat().st_size for info in tensors.values()}.values()),
        "kv_bytes_per_token": config.kv_bytes_per_token(),
    }
