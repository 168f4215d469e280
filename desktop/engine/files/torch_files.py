"""What ``torch.save`` writes, checked before torch reads a byte of it.

Two layouts reach users:

* the zip archive (torch >= 1.6's default): ``<name>/data.pkl`` plus one stored record per
  storage under ``<name>/data/``. The pickle is checked against the records' sizes.
* the legacy stream (``_use_new_zipfile_serialization=False``, and every file from torch < 1.6):
  four pickles one after another (a magic number, the protocol version, the writer's type
  sizes, the object), a fifth listing the storage keys, then each storage as an 8-byte element
  count and its bytes. ``torch.load(weights_only=True)`` reads it too, so it is checked here the
  same way: every pickle by :mod:`.pickle_scan`, every storage's count against its declaration,
  and every byte range against the file's length.

The oldest tar format (torch < 0.4) is refused: no nanochat-era tool writes it.
"""

from __future__ import annotations

import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from desktop.engine.files.bounded import open_regular
from desktop.engine.files.pickle_policy import TORCH_POLICY, Policy
from desktop.engine.files.pickle_scan import (
    PickleRefused,
    TensorInfo,
    scan_at,
    scan_torch_pickle,
)
from desktop.engine.files.restricted_unpickler import loads_plain
from desktop.engine.text_lines import error_text

# The legacy stream's small pickles: plain values only (its magic number is a long, its type
# sizes a dict, its storage keys a list of strings, one per tensor).
_PLAIN = Policy(callables=frozenset(), max_bytes=TORCH_POLICY.max_bytes)
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
_LEGACY_PROTOCOL = 1001  # torch.serialization.PROTOCOL_VERSION
_PICKLE_PROTO = 0x80


@dataclass(frozen=True)
class TorchScan:
    """What a torch checkpoint's pickle holds."""

    entries: tuple[tuple[object, TensorInfo | str], ...]  # (key, tensor or the kind of non-tensor)
    top: str  # the kind of the top object ("dict" for a state dict)
    legacy: bool  # the legacy stream (torch cannot map it into memory)


def scan_torch_file(path: Path) -> TorchScan:
    """Check a ``torch.save`` file (zip archive or legacy stream); raises :class:`PickleRefused`,
    or :class:`~.bounded.FileRefused` for what is not a regular file."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        first = f.read(1)
        if first and first[0] == _PICKLE_PROTO:
            return _scan_legacy(f, size)
        return _scan_zip(f, size)


def _scan_zip(f: BinaryIO, size: int) -> TorchScan:
    try:
        archive = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, struct.error):
        raise PickleRefused(
            "corrupt", "not a torch checkpoint (neither a zip archive nor torch's legacy format)"
        ) from None
    with archive:
        infos = archive.infolist()
        pickles = [i for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
        if len(pickles) != 1:
            raise PickleRefused("corrupt", "the archive has no single <name>/data.pkl")
        root = pickles[0].filename[: -len("data.pkl")]
        records: dict[str, int] = {}
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                raise PickleRefused(
                    "corrupt", f"member {info.filename} is compressed; torch never writes that"
                )
            if info.header_offset + info.file_size > size:
                raise PickleRefused("corrupt", f"member {info.filename} runs past the end of the file")
            if info.filename.startswith(root + "data/"):
                records[info.filename[len(root) + 5 :]] = info.file_size
        if pickles[0].file_size > TORCH_POLICY.max_bytes:
            raise PickleRefused(
                "limit", f"data.pkl is {pickles[0].file_size} bytes (limit {TORCH_POLICY.max_bytes})"
            )
        try:
            data = archive.read(pickles[0])
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise PickleRefused("corrupt", f"data.pkl cannot be read ({exc})") from None
    found = scan_torch_pickle(data, records)
    return TorchScan(found.entries, found.top, legacy=False)


def _scan_legacy(f: BinaryIO, size: int) -> TorchScan:
    # The pickles come first: at most the policy's bytes of them, however large the file.
    f.seek(0)
    head = f.read(min(size, TORCH_POLICY.max_bytes))
    values, pos = [], 0
    for what in ("magic number", "protocol version", "writer's type sizes"):
        values.append(_plain_pickle(head, pos, what))
        pos = values[-1][1]
    if values[0][0] != _LEGACY_MAGIC or values[1][0] != _LEGACY_PROTOCOL:
        raise PickleRefused("corrupt", "a pickle, but not a torch checkpoint (no torch magic number)")
    found = scan_torch_pickle(head, None, pos)
    keys, pos = _plain_pickle(head, found.end, "list of storage keys")
    if not isinstance(keys, list) or sorted(map(str, keys)) != sorted(found.storages):
        raise PickleRefused("corrupt", "its list of storages does not match the tensors it holds")
    # Each storage: its element count (8 bytes, little-endian) and then its bytes, in list order.
    for key in keys:
        numel, itemsize = found.storages[key]
        f.seek(pos)
        count = f.read(8)
        if len(count) < 8:
            raise PickleRefused("corrupt", f"the file is cut off before storage '{key}'")
        if int.from_bytes(count, "little") != numel:
            raise PickleRefused("corrupt", f"storage '{key}' holds another size than its tensor declares")
        pos += 8 + numel * itemsize
        if pos > size:
            raise PickleRefused("corrupt", f"storage '{key}' runs past the end of the file")
    return TorchScan(found.entries, found.top, legacy=True)


def _plain_pickle(data: bytes, start: int, what: str) -> tuple[object, int]:
    """The value of a small plain pickle at ``data[start:]`` and the position after it.

    Scanned first (no globals, bounded), then built by the restricted unpickler, which refuses
    every global too: the scan alone does not stand between the file and code execution.
    """
    try:
        end = scan_at(data, start, _PLAIN)
        return loads_plain(data[start:end]), end
    except PickleRefused as exc:
        raise PickleRefused(
            exc.kind, f"its {what} is not a plain pickle ({exc.reason or exc.name})"
        ) from None
    except (pickle.UnpicklingError, ValueError, EOFError) as exc:  # what the scan let through
        raise PickleRefused("corrupt", f"its {what} is not a plain pickle ({error_text(exc)})") from None
