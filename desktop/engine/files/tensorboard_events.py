"""TensorBoard event files (``events.out.tfevents.*``): the scalars they log, read within bounds.

An event file is a run of TFRecord frames::

    uint64 length | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data

and each frame's data is a ``tensorflow.Event``, decoded by :mod:`.protowire` for these fields
only (event.proto, summary.proto, tensor.proto; every other field is skipped unread):

* Event: 1 ``wall_time`` (double), 2 ``step`` (int64), 5 ``summary``;
* Summary: 1 ``value`` (repeated): 1 ``tag``, 2 ``simple_value`` (float), 8 ``tensor``,
  9 ``metadata`` → 1 ``plugin_data`` → 1 ``plugin_name``;
* TensorProto: 1 ``dtype``, 2 ``tensor_shape`` → 2 ``dim`` → 1 ``size``, 4 ``tensor_content``,
  5 ``float_val``, 6 ``double_val``.

torch's ``SummaryWriter.add_scalar`` (what KempnerForge's ``TensorBoardBackend`` calls) writes
``simple_value``; with ``new_style=True`` a DT_FLOAT tensor of one ``float_val`` (DT_DOUBLE and
``double_val`` with ``double_precision``). TensorFlow 2 writes a one-element tensor under the
"scalars" plugin, stating the plugin on a tag's first event only. So a tensor counts as a scalar
when it holds exactly one float or double and its value names no other plugin.

Bounds, each with one line when it bites: a frame may state at most :data:`MAX_RECORD_BYTES`, and
no length is used before it is checked against what the file still holds; a file is read up to the
budgets its caller passes, of bytes, events, values (every Summary.Value decoded, scalar or not:
one event may hold a million) and protobuf fields decoded (what the time goes to, see
:mod:`.protowire`); a run keeps :data:`MAX_TAGS` tags and, per tag, at most :data:`MAX_POINTS`
points, sampled evenly from all it logged (the newest always kept). A file cut
short keeps what came before the cut; a checksum that does not match ends that file; an event that
does not decode is skipped. Lines read ``"<file>: byte <offset>: <what>"``.

A file a run is still writing is read on (:class:`EventFile`): each read starts at the first frame
not read, and a frame not written whole is left for the next read rather than said to be cut.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from desktop.engine.files.bounded import FileRefused, open_regular
from desktop.engine.files.crc32c import masked_crc32c
from desktop.engine.files.protowire import I32, I64, LEN, VARINT, Walk, WalkSpent, WireError, fields, signed64

MB = 1 << 20
MAX_RECORD_BYTES = 16 * MB  # one event; a scalar's is under 100 bytes, an image summary a few MB
MAX_FILE_BYTES = 64 * MB  # of one file, when the caller states no budget
MAX_EVENTS = 2_000_000  # of one file, likewise (a million tiny frames take a few seconds)
MAX_VALUES = 500_000  # likewise; torch writes one per event, of ~6 fields
MAX_FIELDS = 3_000_000  # likewise: 1-3 µs each, so seconds, whatever the events hold
MAX_TAGS = 256  # KempnerForge logs 14 per step, plus eval and MoE numbers
MAX_POINTS = 20_000  # per tag: a plot 2,000 pixels wide shows no more
MAX_TAG_BYTES = 1024

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")
DT_FLOAT, DT_DOUBLE = 1, 2


class TagSeries:
    """One tag's ``(step, wall time, value)`` points, steps ascending.

    A step at or before the newest one logged replaces everything from that step on: a run
    resumed from an earlier checkpoint logs those steps again, and TensorBoard shows the newer.
    Past ``2 × cap`` kept points every other one is dropped and from then on only every
    ``stride``-th value is kept, so memory stays bounded while the kept points stay even.
    """

    def __init__(self, cap: int = MAX_POINTS) -> None:
        self.cap = max(cap, 2)
        self.steps = array("q")
        self.walls = array("d")
        self.values = array("d")
        self.stride = 1
        self._since_kept = 0
        self._newest: tuple[int, float, float] | None = None  # the newest value, when not kept
        self.logged = 0  # values read for this tag

    def add(self, step: int, wall: float, value: float) -> None:
        top = self._newest[0] if self._newest else self.steps[-1] if self.steps else None
        if top is not None and step <= top:
            cut = bisect.bisect_left(self.steps, step)
            del self.steps[cut:], self.walls[cut:], self.values[cut:]
            self._newest = None
        self.logged += 1
        self._since_kept += 1
        if self._since_kept < self.stride:
            self._newest = (step, wall, value)
            return
        self._since_kept, self._newest = 0, None
        self.steps.append(step)
        self.walls.append(wall)
        self.values.append(value)
        if len(self.steps) >= 2 * self.cap:
            # An even count: the newest point is at an odd index, off the new grid. It stays the
            # newest value shown until the next one comes.
            self._newest = (step, wall, value)
            self.steps, self.walls, self.values = self.steps[::2], self.walls[::2], self.values[::2]
            self.stride *= 2
            # count from the point before it, so the next point kept lands on the new grid
            self._since_kept = self.stride // 2

    def points(self) -> tuple[list[int], list[float], list[float]]:
        """At most ``cap`` points, evenly spaced over what was kept, first and newest included."""
        steps, walls, values = list(self.steps), list(self.walls), list(self.values)
        if self._newest is not None:
            steps.append(self._newest[0])
            walls.append(self._newest[1])
            values.append(self._newest[2])
        n = len(steps)
        if n <= self.cap:
            return steps, walls, values
        picks = [round(i * (n - 1) / (self.cap - 1)) for i in range(self.cap)]
        return [steps[i] for i in picks], [walls[i] for i in picks], [values[i] for i in picks]

    @property
    def sampled(self) -> bool:
        return self.stride > 1 or len(self.steps) + (self._newest is not None) > self.cap


@dataclass
class Scalars:
    """The scalars of one run's event files, by tag, in the order the files are read."""

    max_tags: int = MAX_TAGS
    max_points: int = MAX_POINTS
    series: dict[str, TagSeries] = field(default_factory=dict)
    values_left_out: int = 0  # values of tags past max_tags

    def add(self, tag: str, step: int, wall: float, value: float) -> None:
        series = self.series.get(tag)
        if series is None:
            if len(self.series) >= self.max_tags:
                self.values_left_out += 1
                return
            series = self.series[tag] = TagSeries(self.max_points)
        series.add(step, wall, value)


@dataclass
class FileRead:
    """What reading one file gave: counts against the caller's budgets, and problem lines."""

    bytes_read: int = 0
    events: int = 0
    values: int = 0  # Summary.Values decoded, scalars or not
    fields: int = 0  # protobuf fields decoded, at every level
    problems: list[str] = field(default_factory=list)


class _Shrank(Exception):
    """The file ended before the size it stated when opened: read on from the frame next time."""


class _Stop(Exception):
    """A budget used up inside an event: the file's read ends there (``str()``: which)."""


class _Tally:
    """Skips of one kind counted, reported once: the first one's offset and how many."""

    def __init__(self) -> None:
        self.kinds: dict[str, tuple[int, str, int]] = {}  # key -> (first offset, what, count)

    def note(self, key: str, offset: int, what: str) -> None:
        first = self.kinds.get(key)
        self.kinds[key] = (offset, what, 1) if first is None else (first[0], first[1], first[2] + 1)

    def lines(self, path: Path) -> list[str]:
        out = []
        for offset, what, count in self.kinds.values():
            more = f" ({count - 1:,} more like it)" if count > 1 else ""
            out.append(f"{path}: byte {offset}: {what}{more}")
        return out


def read_event_file(
    path: Path,
    scalars: Scalars,
    max_bytes: int = MAX_FILE_BYTES,
    max_events: int = MAX_EVENTS,
    max_values: int = MAX_VALUES,
    max_fields: int = MAX_FIELDS,
) -> FileRead:
    """Add the scalars of the event file ``path`` to ``scalars``, reading at most ``max_bytes``,
    ``max_events``, ``max_values`` and ``max_fields``; never raises for what the file holds. A
    file that ends inside a frame is said to be cut (a reader that reads on uses :class:`EventFile`)."""
    one = EventFile(path, scalars)
    one.read(max_bytes, max_events, max_values, max_fields)  # a first read: nothing to be replaced
    read = one.done
    read.problems = one.problems()
    if one.waiting:
        read.problems.append(
            f"{path}: byte {read.bytes_read}: the file is cut off inside a frame (a run still writing, "
            f"or a partial copy); kept the {read.events:,} events before it"
        )
    return read


class FileReplaced(Exception):
    """The file at an event file's path is not the one read so far (another file, or shorter than
    what was read): the scalars taken from it are out of date."""


class EventFile:
    """One event file read on as its writer appends: each :meth:`read` adds to ``scalars`` the
    events of the frames written since the last read, from the frame where it stopped. A frame not
    written whole yet is left for a later read (:attr:`waiting`), not said: the writer may be
    mid-write. What ends the file for good (a budget, a bad frame) is kept and said by every
    :meth:`problems`, as a read from the start says it; the budgets count all reads together."""

    def __init__(self, path: Path, scalars: Scalars) -> None:
        self.path, self.scalars = path, scalars
        self.done = FileRead()  # of all reads; done.bytes_read: the frames read, where the next starts
        self.tally = _Tally()
        self.stop: str | None = None  # what ended the file for good (a line)
        self.trouble: str | None = None  # what kept the last read from reading on (a line)
        self.waiting = False  # the last read stopped at a frame not written whole
        self.bytes_read = 0  # from the file by every read, frames looked at again included
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read
        self.max_bytes = self.max_events = self.max_values = self.max_fields = 0
        self.walk = Walk(0)

    def read(self, max_bytes: int, max_events: int, max_values: int, max_fields: int) -> None:
        """Read on, the file's budgets now at most ``max_*`` for it in all (its caller's limits
        for it, which do not change while it grows); FileReplaced when the file is not the one
        read before."""
        self.max_bytes, self.max_events, self.max_values, self.max_fields = (
            max_bytes,
            max_events,
            max_values,
            max_fields,
        )
        self.trouble, self.waiting = None, False
        self.walk = Walk(max_fields - self.done.fields)
        try:
            with open_regular(self.path) as f:
                size = self._check_same(os.fstat(f.fileno()))
                if self.stop is None:
                    self.stop = self._line(self._frames(f, size))
        except FileRefused as exc:
            if self.done.bytes_read:
                raise FileReplaced(str(exc)) from None
            self.trouble = str(exc)
        except _Shrank:
            self.trouble = (
                f"{self.path}: byte {self.done.bytes_read}: the file ended early (it shrank while read); "
                "kept what came before"
            )
        except OSError as exc:
            self.trouble = (
                f"{self.path}: byte {self.done.bytes_read}: cannot read ({exc.strerror or exc}); "
                "kept what came before"
            )
        finally:
            self.done.fields = max_fields - self.walk.left

    def problems(self) -> list[str]:
        """What the reads found wrong, one line each."""
        return self.tally.lines(self.path) + [line for line in (self.trouble, self.stop) if line]

    def _check_same(self, stat: os.stat_result) -> int:
        identity = (stat.st_dev, stat.st_ino)
        if self._identity is not None and (identity != self._identity or stat.st_size < self.done.bytes_read):
            raise FileReplaced(f"{self.path}: replaced or cut short since it was read")
        self._identity = identity
        return stat.st_size

    def _line(self, stop: str | None) -> str | None:
        return f"{self.path}: {stop}" if stop else None

    def _frames(self, f: BinaryIO, size: int) -> str | None:
        """Read frames from where the last read stopped until the file, a budget or a bad frame
        ends them; what ended them for good, else None (the file's end, or a frame not written
        whole: :attr:`waiting`)."""
        read = self.done
        pos = read.bytes_read
        f.seek(pos)
        while pos < size:
            if read.events >= self.max_events:
                return f"byte {pos}: stopped after {read.events:,} events (the limit); the rest is left out"
            remaining = size - pos
            if remaining < _HEADER.size:
                self.waiting = True
                return None
            header = self._bytes(f, _HEADER.size)
            length, length_crc = _HEADER.unpack(header)
            if _length_crc(header[:8]) != length_crc:
                return (
                    f"byte {pos}: a frame's length fails its checksum (not an event file, or damaged); "
                    "the rest is not read"
                )
            if length > MAX_RECORD_BYTES:
                return (
                    f"byte {pos}: a frame states {length:,} bytes (limit {MAX_RECORD_BYTES // MB} MB); "
                    "the rest is not read"
                )
            frame = _HEADER.size + length + _CRC.size
            if frame > remaining:
                self.waiting = True  # left at its start, read whole once it is written
                return None
            if pos + frame > self.max_bytes:
                return f"byte {pos}: read the first {pos:,} bytes (the limit); the rest is left out"
            body = self._bytes(f, length + _CRC.size)  # a length checked against what the file holds
            data = body[:length]
            if masked_crc32c(data) != _CRC.unpack_from(body, length)[0]:
                return f"byte {pos}: an event fails its checksum (damaged); the rest of the file is not read"
            try:
                self._take(data, pos)
            except _Stop as stop:
                return f"byte {pos}: {stop}; the rest is left out"
            pos += frame
            read.bytes_read = pos
            read.events += 1
        return None

    def _bytes(self, f: BinaryIO, count: int) -> bytes:
        """``count`` bytes, which the file's size said it holds (_Shrank when it shrank meanwhile)."""
        data = f.read(count)
        self.bytes_read += len(data)
        if len(data) < count:
            raise _Shrank
        return data

    def _take(self, data: bytes, offset: int) -> None:
        """The scalars of the event at ``offset``, added; what is wrong with it, tallied;
        :class:`_Stop` when a budget runs out inside it."""
        try:
            wall, step, values = self._event(data)
        except WalkSpent:
            raise _Stop(f"stopped after {self.max_fields:,} fields decoded (the limit)") from None
        except WireError as exc:
            self.tally.note("event", offset, f"not a valid event ({exc}); skipped")
            return
        for raw_tag, value in values:
            tag = _tag(raw_tag, offset, self.tally)
            if tag is None:
                continue
            if not math.isfinite(value):
                self.tally.note("finite", offset, f"{tag} at step {step} is {value}; left out")
                continue
            self.scalars.add(tag, step, wall, value)

    def _event(self, data: bytes) -> tuple[float, int, list[tuple[bytes, float]]]:
        """An Event's wall time, step and the scalars of its summary; each Summary.Value decoded
        is one of the file's values (:class:`_Stop` past them)."""
        wall, step = 0.0, 0
        values: list[tuple[bytes, float]] = []
        for number, wire, a, b in fields(data, 0, len(data), self.walk):
            if number == 1 and wire == I64:
                wall = _DOUBLE.unpack_from(data, a)[0]
            elif number == 2 and wire == VARINT:
                step = signed64(a)
            elif number == 5 and wire == LEN:
                for n, w, start, end in fields(data, a, b, self.walk):
                    if n != 1 or w != LEN:
                        continue
                    if self.done.values >= self.max_values:
                        raise _Stop(f"stopped after {self.done.values:,} values (the limit)")
                    self.done.values += 1
                    if (found := _value(data, start, end, self.walk)) is not None:
                        values.append(found)
        return wall, step, values


@functools.lru_cache(maxsize=1024)
def _length_crc(length: bytes) -> int:
    """A frame length's checksum: a file's events have few distinct lengths, each checked once."""
    return masked_crc32c(length)


def _tag(raw: bytes, offset: int, tally: _Tally) -> str | None:
    if len(raw) > MAX_TAG_BYTES:
        tally.note("long", offset, f"a tag of {len(raw):,} bytes (limit {MAX_TAG_BYTES}); left out")
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        tally.note("utf8", offset, "a tag that is not UTF-8; shown with replacement characters")
        return raw.decode("utf-8", "replace")


def _value(data: bytes, pos: int, end: int, walk: Walk) -> tuple[bytes, float] | None:
    """A Summary.Value's tag and scalar, if it holds one."""
    tag = simple = tensor = None
    plugin = b""
    for number, wire, a, b in fields(data, pos, end, walk):
        if number == 1 and wire == LEN:
            tag = data[a:b]
        elif number == 2 and wire == I32:
            simple = _FLOAT.unpack_from(data, a)[0]
        elif number == 8 and wire == LEN:
            tensor = (a, b)
        elif number == 9 and wire == LEN:
            plugin = _plugin_name(data, a, b, walk)
    if tag is None:
        return None
    if simple is not None:
        return tag, simple
    if tensor is not None and plugin in (b"", b"scalars"):
        value = _tensor_scalar(data, *tensor, walk)
        if value is not None:
            return tag, value
    return None


def _plugin_name(data: bytes, pos: int, end: int, walk: Walk) -> bytes:
    for number, wire, a, b in fields(data, pos, end, walk):  # SummaryMetadata
        if number == 1 and wire == LEN:  # plugin_data
            for n, w, start, stop in fields(data, a, b, walk):
                if n == 1 and w == LEN:
                    return data[start:stop]
    return b""


def _tensor_scalar(data: bytes, pos: int, end: int, walk: Walk) -> float | None:
    """The one float or double a TensorProto holds, else None."""
    dtype, single = 0, True
    content: tuple[int, int] | None = None
    listed: list[tuple[int, int]] = []  # (offset, width) of each float_val / double_val
    for number, wire, a, b in fields(data, pos, end, walk):
        if number == 1 and wire == VARINT:
            dtype = a
        elif number == 2 and wire == LEN:
            single = _one_element(data, a, b, walk)
        elif number == 4 and wire == LEN:
            content = (a, b)
        elif number in (5, 6) and len(listed) < 2:
            width = 4 if number == 5 else 8
            if wire == LEN:  # packed
                listed.extend((i, width) for i in range(a, min(b, a + 2 * width), width) if i + width <= b)
            elif wire == (I32 if width == 4 else I64):
                listed.append((a, width))
    unpack = {DT_FLOAT: _FLOAT, DT_DOUBLE: _DOUBLE}.get(dtype)
    if unpack is None or not single:
        return None
    if content is not None:
        return unpack.unpack_from(data, content[0])[0] if content[1] - content[0] == unpack.size else None
    if len(listed) == 1 and listed[0][1] == unpack.size:
        return unpack.unpack_from(data, listed[0][0])[0]
    return None


def _one_element(data: bytes, pos: int, end: int, walk: Walk) -> bool:
    """Whether a TensorShapeProto describes exactly one element (a scalar: no dims, or all 1)."""
    for number, wire, a, b in fields(data, pos, end, walk):
        if number == 3 and wire == VARINT and a:  # unknown_rank
            return False
        if number == 2 and wire == LEN:  # dim
            for n, w, size, _ in fields(data, a, b, walk):
                if n == 1 and w == VARINT and size != 1:
                    return False
    return True
