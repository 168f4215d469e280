"""Protocol Buffers' wire format, read by hand for the few messages the app needs (TensorBoard's
Event and Summary), with every length checked against what remains of its message.

Callers descend only into fields whose message type they know, so how deep a read goes is set by
their schema, never by the data; any other field is skipped by its wire type without a copy. Groups
(wire types 3 and 4, deprecated since proto2) are refused: skipping one takes a nesting count
that the data would control.

What decoding costs is the fields walked (a microsecond each in CPython), at every level, not the
bytes: a 16 MB message of two-byte fields is eight million of them. A reader passes a :class:`Walk`
to every :func:`fields` of its messages, and :class:`WalkSpent` ends the read when it is used up.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5
MAX_VARINT_BYTES = 10  # a 64-bit value
_U64 = (1 << 64) - 1


class WireError(ValueError):
    """Bytes that are not a well-formed message; ``str()`` says what is wrong."""


class WalkSpent(Exception):
    """A :class:`Walk` used up: not a malformed message, a read to end."""


class Walk:
    """How many more fields a reader may decode, shared by all the messages it walks."""

    def __init__(self, fields: int) -> None:
        self.left = fields


def varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` (as an unsigned 64-bit value) and the position after it."""
    result = shift = 0
    for i in range(pos, min(end, pos + MAX_VARINT_BYTES)):
        byte = buf[i]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _U64, i + 1
        shift += 7
    if end - pos < MAX_VARINT_BYTES:
        raise WireError("a varint runs past the end of its message")
    raise WireError(f"a varint longer than {MAX_VARINT_BYTES} bytes")


def signed64(value: int) -> int:
    """An ``int64`` field's value from its unsigned varint."""
    return value - (1 << 64) if value >= 1 << 63 else value


def fields(buf: bytes, pos: int, end: int, walk: Walk | None = None) -> Iterator[tuple[int, int, int, int]]:
    """``(number, wire type, a, b)`` for each field of the message in ``buf[pos:end]``: for a
    varint, ``a`` is its value; for the others, ``buf[a:b]`` holds its bytes. Each field is one
    of ``walk`` (:class:`WalkSpent` when none is left)."""
    while pos < end:
        if walk is not None:
            if walk.left <= 0:
                raise WalkSpent
            walk.left -= 1
        key = buf[pos]  # one byte for fields 1 to 15: read inline, the hot path of every message
        if key < 0x80:
            pos += 1
        else:
            key, pos = varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("a field numbered 0")
        if wire == VARINT:
            value, pos = varint(buf, pos, end)
            yield number, wire, value, pos
            continue
        if wire == LEN:
            size = buf[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = varint(buf, pos, end)
        elif wire == I64:
            size = 8
        elif wire == I32:
            size = 4
        else:
            raise WireError(f"field {number} has wire type {wire}, which is not read")
        if size > end - pos:  # checked before anything is sliced or allocated
            raise WireError(f"field {number} states {size} bytes where {end - pos} remain")
        yield number, wire, pos, pos + size
        pos += size
