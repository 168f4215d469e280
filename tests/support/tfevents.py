"""TensorBoard event files made by hand, for the inputs no real writer makes (cut, spoilt, hostile)
and for the shapes other writers use: the protobuf wire format and TFRecord framing, written from
their specs (event.proto, summary.proto, tensor.proto; tensorflow/core/lib/io/record_writer.cc).

Checked once against the real writers: ``scalar_value(..)`` is byte for byte what torch's
``summary.scalar(tag, v)`` serializes, ``tensor_value(.., DT_FLOAT)`` what it serializes with
``new_style=True``, and ``tensor_value(.., DT_DOUBLE)`` with ``double_precision=True`` (torch
2.13, tensorboard 2.21); the golden KempnerForge event file is framed as :func:`frame` frames.
"""

from __future__ import annotations

import struct

from desktop.engine.files.crc32c import masked_crc32c

DT_FLOAT, DT_DOUBLE = 1, 2


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


def scalar_value(tag: bytes | str, value: float) -> bytes:
    """A Summary.Value with ``simple_value`` (what ``add_scalar`` writes by default)."""
    tag = tag.encode() if isinstance(tag, str) else tag
    return length_delimited(1, tag) + key(2, 5) + struct.pack("<f", value)


def tensor_value(
    tag: str,
    values: tuple[float, ...],
    dtype: int = DT_FLOAT,
    content: bool = False,
    shape: tuple[int, ...] = (),
    plugin: bytes = b"scalars",
) -> bytes:
    """A Summary.Value holding a tensor (``new_style=True`` writes one value, no shape, plugin
    "scalars"); ``content``: the values in ``tensor_content`` rather than ``float_val``/``double_val``."""
    fmt, field = ("<f", 5) if dtype == DT_FLOAT else ("<d", 6)
    raw = b"".join(struct.pack(fmt, v) for v in values)
    tensor = key(1, 0) + varint(dtype)
    if shape:
        tensor += length_delimited(2, b"".join(length_delimited(2, key(1, 0) + varint(d)) for d in shape))
    tensor += length_delimited(4, raw) if content else length_delimited(field, raw)
    metadata = length_delimited(1, length_delimited(1, plugin))
    return length_delimited(1, tag.encode()) + length_delimited(8, tensor) + length_delimited(9, metadata)


def event(step: int, values: list[bytes], wall: float = 1.7e9) -> bytes:
    """An Event with a Summary of ``values`` (each from :func:`scalar_value` or :func:`tensor_value`)."""
    summary = b"".join(length_delimited(1, v) for v in values)
    return key(1, 1) + struct.pack("<d", wall) + key(2, 0) + varint(step) + length_delimited(5, summary)


def frame(data: bytes) -> bytes:
    """One TFRecord frame."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def frame_stating(length: int, data: bytes = b"") -> bytes:
    """A frame header that states ``length`` (its own checksum right) followed by ``data``."""
    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked_crc32c(raw)) + data


def event_file(points: list[tuple[int, str, float]]) -> bytes:
    """A file of ``(step, tag, value)`` scalars, one event each, after a file-version event."""
    head = frame(key(1, 1) + struct.pack("<d", 1.7e9) + length_delimited(3, b"brain.Event:2"))
    return head + b"".join(frame(event(step, [scalar_value(tag, v)])) for step, tag, v in points)
