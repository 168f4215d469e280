"""The files of a Hugging Face model directory, read without torch and without reading weights.

A directory is a Hugging Face model when it holds ``config.json`` and safetensors weights: one
``model.safetensors`` or shards named by ``model.safetensors.index.json`` (checkpoint-formats
spec §4). A safetensors file is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw bytes; there is no code path in it (§4.2).
Everything here reads only the JSON parts, so discovery can summarise a model on the GUI's
executor and the loader can check every key and shape before it allocates anything.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.engine.errors import CheckpointError
from desktop.engine.files import bounded
from desktop.engine.files.safe_json import JsonRefused, loads_bounded

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
GENERATION_CONFIG_NAME = "generation_config.json"
TOKENIZER_NAME = "tokenizer.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
TEMPLATE_NAME = "chat_template.jinja"

# Real headers are a few hundred KB even for 400B-parameter shards; safetensors itself caps them
# at 100 MB. A bigger one is a hostile or broken file, refused before it is read.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# Bytes per element of the safetensors dtype names this app can compute with.
FLOAT_DTYPES = {"F32": 4, "F16": 2, "BF16": 2}
# Names safetensors uses for other element types (refused by name at load time).
OTHER_DTYPES = {
    "F64": 8,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header describes it."""

    file: Path
    dtype: str  # safetensors name: "F32", "BF16", ...
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def is_hf_directory(path: Path) -> bool:
    """``config.json`` plus safetensors weights (a single file, or an index of shards)."""
    path = Path(path)
    if not path.is_dir() or not (path / CONFIG_NAME).is_file():
        return False
    return (path / INDEX_NAME).is_file() or any(path.glob("*.safetensors"))


def read_json(path: Path, what: str = "file") -> dict[str, Any]:
    """A JSON object from ``path``; any problem is one line naming the file."""
    try:
        data = bounded.read_json(path, "config")
    except bounded.FileRefused as exc:
        raise CheckpointError(str(exc)) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object in this {what}")
    return data


def read_optional_json(path: Path, what: str) -> dict[str, Any]:
    """Like :func:`read_json`, but a missing file is an empty object."""
    return read_json(path, what) if path.is_file() else {}


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files holding the model: the index's shards, or the single file.

    Every shard the index names must exist and lie inside the directory.
    """
    index_path = directory / INDEX_NAME
    if index_path.is_file():
        index = read_json(index_path, "weight index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path}: no weight_map")
        names = sorted({str(v) for v in weight_map.values()})
        files = []
        for name in names:
            shard = directory / name
            if Path(name).name != name or not name.endswith(".safetensors"):
                raise CheckpointError(f"{index_path}: shard name {name!r} is not a file in this folder")
            if not shard.is_file():
                raise CheckpointError(f"{index_path}: shard {name} is missing")
            files.append(shard)
        return files
    if (directory / SINGLE_NAME).is_file():
        return [directory / SINGLE_NAME]
    found = sorted(directory.glob("*.safetensors"))
    if len(found) == 1:
        return found
    if not found:
        raise CheckpointError(f"{directory}: no .safetensors weights here")
    raise CheckpointError(
        f"{directory}: {len(found)} .safetensors files but no {INDEX_NAME} to say which tensors they hold"
    )


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a safetensors file declares, checked against the file's own size."""
    try:
        with bounded.open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: too short to be a safetensors file")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise CheckpointError(f"{path}: header length {length:,} does not fit a {size:,}-byte file")
            raw = f.read(length)
    except bounded.FileRefused as exc:
        raise CheckpointError(str(exc)) from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    try:
        header = loads_bounded(raw.decode("utf-8"))
    except (UnicodeDecodeError, JsonRefused) as exc:
        raise CheckpointError(f"{path}: the safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    data_bytes = size - 8 - length
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_info(path, name, entry, data_bytes)
    return tensors


def _tensor_info(path: Path, name: str, entry: Any, data_bytes: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path}: header entry {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list):
        raise CheckpointError(f"{path}: header entry {name!r} lacks dtype, shape or data_offsets")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CheckpointError(f"{path}: tensor {name!r} has a bad shape {shape}")
    if len(offsets) != 2 or not all(isinstance(o, int) for o in offsets):
        raise CheckpointError(f"{path}: tensor {name!r} has bad data_offsets {offsets}")
    start, end = offsets
    width = FLOAT_DTYPES.get(dtype, OTHER_DTYPES.get(dtype))
    if not 0 <= start <= end <= data_bytes:
        raise CheckpointError(f"{path}: tensor {name!r} lies outside the file (truncated?)")
    if width is not None and end - start != math.prod(shape) * width:
        raise CheckpointError(f"{path}: tensor {name!r} has {end - start} bytes for shape {shape} of {dtype}")
    return TensorInfo(path, dtype, tuple(shape), end - start)


def read_tensor_index(directory: Path) -> dict[str, TensorInfo]:
    """Every tensor of the model across its files; a name in two files, or a shard that does not
    hold what the index says it holds, is refused."""
    files = weight_files(directory)
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        for name, info in read_header(file).items():
            if name in tensors:
                raise CheckpointError(
                    f"{directory}: tensor {name!r} is stored twice ({tensors[name].file.name})"
                )
            tensors[name] = info
    index_path = directory / INDEX_NAME
    if index_path.is_file():
        weight_map = read_json(index_path, "weight index")["weight_map"]
        for name, file in weight_map.items():
            held = tensors.get(name)
            if held is None or held.file.name != file:
                raise CheckpointError(f"{index_path}: {name!r} is not in {file}")
    return tensors


def find_hf_directories(roots: list[Path]) -> list[Path]:
    """Hugging Face model folders among ``roots`` and their immediate subfolders (watched folders
    hold models side by side), including the snapshots of a Hugging Face hub cache
    (``models--org--name/snapshots/<revision>/``); each listed once, in the order found."""
    found: list[Path] = []
    for root in roots:
        root = Path(root)
        try:
            candidates = [root] if is_hf_directory(root) else sorted(p for p in root.iterdir() if p.is_dir())
            candidates = [s for c in candidates for s in _snapshots(c)]
        except OSError:
            continue
        for candidate in candidates:
            if candidate not in found and is_hf_directory(candidate):
                found.append(candidate)
    return found


def _snapshots(folder: Path) -> list[Path]:
    """A hub cache's ``models--org--name`` folder stands for its snapshots; any other for itself."""
    snapshots = folder / "snapshots"
    if folder.name.startswith("models--") and snapshots.is_dir():
        return sorted(p for p in snapshots.iterdir() if p.is_dir())
    return [folder]


def display_name(directory: Path) -> str:
    """How a model folder is named in lists: ``org/name@abc1234`` for a hub-cache snapshot, else
    the folder's own name."""
    directory = Path(directory)
    repo = directory.parent.parent.name
    if directory.parent.name == "snapshots" and repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/") + "@" + directory.name[:7]
    return directory.name
