"""A KempnerForge step summarised without its weights: the DCP metadata (read safely) and the TOML.

Returns the fields of :class:`~desktop.engine.discovery.CheckpointSummary` after ``path`` and
``step`` (discovery builds the object, so this module does not import discovery). torch-free.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from desktop.engine.errors import NanoscopeError, UnsupportedFormatError
from desktop.engine.kempnerforge.config import NO_TOML, load_config
from desktop.engine.kempnerforge.dcp_metadata import DTYPE_BYTES, read_dcp_metadata
from desktop.engine.kempnerforge.layout import resolve_checkpoint
from desktop.engine.kempnerforge.weights import EMBEDDING, OUTPUT, check_weights, model_entries

_LAYER = re.compile(r"layers\.(\d+)\.")


def summary_fields(directory: Path, step: int | None) -> dict[str, Any]:
    """era, params, sequence_len, vocab_size, n_layer, n_embd, stored_dtype, file_bytes,
    kv_bytes_per_token and error for one step of a run (problems land in ``error``)."""
    fields: dict[str, Any] = {
        "era": "?",
        "params": 0,
        "sequence_len": 0,
        "vocab_size": 0,
        "n_layer": 0,
        "n_embd": 0,
        "stored_dtype": "?",
        "file_bytes": 0,
        "kv_bytes_per_token": 0,
        "error": "",
    }
    try:
        ckpt = resolve_checkpoint(Path(directory), step)
        metas = [read_dcp_metadata(d) for d in ckpt.dcp_dirs]
        entries = model_entries(metas)
    except NanoscopeError as exc:
        fields["error"] = str(exc)
        return fields
    tensors = {name: meta.tensors[key] for name, (meta, key) in entries.items()}
    emb = tensors.get(EMBEDDING)
    if emb is not None and len(emb.size) == 2:
        fields["vocab_size"], fields["n_embd"] = emb.size
    fields["n_layer"] = len({int(m.group(1)) for name in tensors if (m := _LAYER.match(name))})
    kv_rows = sum(t.size[0] for name, t in tensors.items() if name.endswith("attention.k_proj.weight"))
    fields["kv_bytes_per_token"] = 2 * kv_rows * 4
    by_dtype: dict[str, int] = {}
    for t in tensors.values():
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.numel * DTYPE_BYTES[t.dtype]
    fields["stored_dtype"] = "+".join(sorted(by_dtype, key=lambda d: -by_dtype[d])) or "?"
    fields["file_bytes"] = sum(
        meta.storage_of(key, c).length
        for meta, key in entries.values()
        for c in meta.tensors[key].chunks
        if (key, c.offsets) in meta.storage
    )
    params = sum(t.numel for t in tensors.values())
    stages = f" · {ckpt.stages} stages" if ckpt.stages else ""
    try:
        run_cfg = load_config(ckpt)
        check_weights(
            run_cfg.model, {n: t.size for n, t in tensors.items()}, str(ckpt.step_dir), run_cfg.path.name
        )
    except UnsupportedFormatError as exc:
        fields["error"] = str(exc)
    except NanoscopeError as exc:
        text = str(exc)
        fields["era"] = "needs the training TOML" if NO_TOML in text else "TOML does not fit"
        if NO_TOML not in text:
            fields["error"] = text
    else:
        fields["sequence_len"] = run_cfg.model.max_seq_len
        fields["era"] = f"KempnerForge dense{stages}"
        if run_cfg.model.tie_embeddings and not ckpt.stages and OUTPUT in tensors:
            params -= tensors[OUTPUT].numel  # one matrix, saved under both names
    fields["params"] = params
    return fields
