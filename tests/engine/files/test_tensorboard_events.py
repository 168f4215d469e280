"""TensorBoard event files: the golden KempnerForge run's scalars read exactly as TensorBoard reads
them, and cut, spoilt or hostile files end in one line each, keeping what came before.

The golden file was written by KempnerForge's ``MetricsTracker`` through torch's ``SummaryWriter``;
golden.json holds its scalars as TensorBoard's own ``EventAccumulator`` read them. Hostile files
start from its bytes, or are framed by tests/support/tfevents.py (byte for byte what torch
writes, for the shapes it writes).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import tfevents as tf
from support.golden import GOLDEN, manifest

from desktop.engine.files.crc32c import crc32c
from desktop.engine.files.tensorboard_events import (
    MAX_RECORD_BYTES,
    Scalars,
    TagSeries,
    read_event_file,
)

CASE = next((GOLDEN / "kempnerforge").glob("*/golden.json")).parent
LOGGED = manifest(CASE)["tensorboard"]
EVENTS = next((CASE / LOGGED["dir"]).iterdir())


def scalars_of(path: Path, **limits: int) -> tuple[dict[str, list[list[float]]], list[str]]:
    scalars = Scalars()
    read = read_event_file(path, scalars, **limits)
    found = {}
    for tag, series in scalars.series.items():
        steps, _, values = series.points()
        found[tag] = [[s, v] for s, v in zip(steps, values, strict=True)]
    return found, read.problems


def frame_ends(data: bytes) -> list[int]:
    """Where each frame of a well-formed file ends."""
    ends, pos = [], 0
    while pos < len(data):
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
        ends.append(pos)
    return ends


def kept_before(cut: int) -> dict[str, list[list[float]]]:
    """The golden scalars (as golden.json has them) of the frames that end at or before ``cut``."""
    complete = sum(1 for end in frame_ends(EVENTS.read_bytes()) if end <= cut) - 1  # the version event
    out: dict[str, list[list[float]]] = {}
    for step, _, tag in logged_in_order()[: max(complete, 0)]:
        out.setdefault(tag, []).append(next(p for p in LOGGED["scalars"][tag] if p[0] == step))
    return out


@functools.cache
def logged_in_order() -> list[tuple[int, int, str]]:
    """golden.json's scalars in the order KempnerForge's tracker logs them: by step, then in its
    metrics dict's order (train/, gpu/, smoothed/), which is the order a read meets the tags."""
    order = [
        "train/loss", "train/grad_norm", "train/lr", "train/tokens_per_sec", "train/mfu",
        "train/step_time_sec", "gpu/allocated_gb", "gpu/peak_gb", "gpu/reserved_gb",
        "gpu/mem_utilization", "smoothed/loss", "smoothed/tokens_per_sec", "smoothed/mfu",
        "smoothed/step_time",
    ]  # fmt: skip
    assert sorted(order) == sorted(LOGGED["scalars"])
    return sorted((p[0], order.index(tag), tag) for tag in order for p in LOGGED["scalars"][tag])


# --- CRC-32C ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "crc"),
    [  # RFC 3720 B.4, and the check value of the CRC catalogue
        (bytes(32), 0x8A9136AA),
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
        (b"123456789", 0xE3069283),
        (b"", 0),
    ],
)
def test_crc32c_known_values(data, crc):
    assert crc32c(data) == crc


# --- the golden file ----------------------------------------------------------------------------


def test_the_golden_scalars_read_as_tensorboard_reads_them():
    found, problems = scalars_of(EVENTS)
    assert problems == []
    assert found == LOGGED["scalars"]
    assert {"train/loss", "train/grad_norm", "train/lr", "train/tokens_per_sec", "train/mfu"} <= set(found)
    assert [p[0] for p in found["train/loss"]] == [
        1,
        *range(LOGGED["log_interval"], 241, LOGGED["log_interval"]),
    ]


def test_wall_times_and_counts_of_the_golden_file():
    scalars = Scalars()
    read = read_event_file(EVENTS, scalars)
    assert read.events == 1 + sum(len(v) for v in LOGGED["scalars"].values())  # one file-version event
    assert read.values == read.events - 1 and read.bytes_read == EVENTS.stat().st_size
    walls = scalars.series["train/loss"].points()[1]
    assert walls == sorted(walls) and walls[-1] - walls[0] < 24 * 3600


# --- cut and spoilt copies of it -------------------------------------------------------------------

SMALL = 9  # frames of the golden file in the small copy: the version event and 8 scalars


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> bytes:
    data = EVENTS.read_bytes()
    return data[: frame_ends(data)[SMALL - 1]]


def test_a_file_cut_at_every_offset_keeps_the_frames_before_the_cut(small, tmp_path):
    path = tmp_path / "events.out.tfevents.1.cut"
    for cut in range(len(small) + 1):
        path.write_bytes(small[:cut])
        found, problems = scalars_of(path)
        assert found == kept_before(cut), cut
        at_end = cut in (0, *frame_ends(small))
        assert len(problems) == (0 if at_end else 1), (cut, problems)
        if problems:
            assert problems[0].startswith(f"{path}: byte ") and "cut off" in problems[0]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_flipped_byte_stops_the_file_at_its_frame(small, tmp_path_factory, data):
    at = data.draw(st.integers(0, len(small) - 1))
    flip = data.draw(st.integers(1, 255))
    spoilt = bytearray(small)
    spoilt[at] ^= flip
    path = tmp_path_factory.mktemp("flip") / "events.out.tfevents.1.flip"
    path.write_bytes(bytes(spoilt))
    found, problems = scalars_of(path)
    start = max([0, *(e for e in frame_ends(small) if e <= at)])
    assert found == kept_before(start)
    assert len(problems) == 1 and problems[0].startswith(f"{path}: byte {start}: ")


# --- hostile files ---------------------------------------------------------------------------------


def write(tmp_path: Path, data: bytes, name: str = "events.out.tfevents.1.x") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("length", [MAX_RECORD_BYTES + 1, 2**63, 2**64 - 1])
def test_a_huge_stated_length_is_refused_before_it_is_read(tmp_path, length):
    good = tf.event_file([(1, "loss", 2.0)])
    path = write(tmp_path, good + tf.frame_stating(length, b"x" * 64))
    found, problems = scalars_of(path)
    assert found == {"loss": [[1, 2.0]]}
    assert problems == [
        f"{path}: byte {len(good)}: a frame states {length:,} bytes (limit 16 MB); the rest is not read"
    ]


def test_a_length_past_the_end_is_a_cut_not_an_allocation(tmp_path):
    found, problems = scalars_of(write(tmp_path, tf.frame_stating(MAX_RECORD_BYTES - 1, b"x" * 100)))
    assert found == {} and len(problems) == 1 and "cut off" in problems[0]


def test_a_length_whose_checksum_fails_ends_the_file(tmp_path):
    data = struct.pack("<QI", 40, 12345) + bytes(44)
    found, problems = scalars_of(write(tmp_path, data))
    assert found == {} and len(problems) == 1 and "length fails its checksum" in problems[0]


def test_a_budget_of_bytes_or_events_ends_the_read_with_a_line(tmp_path):
    path = write(tmp_path, tf.event_file([(s, "loss", float(s)) for s in range(1, 101)]))
    found, problems = scalars_of(path, max_events=11)
    assert found == {"loss": [[s, float(s)] for s in range(1, 11)]}
    assert len(problems) == 1 and "stopped after 11 events" in problems[0]
    found, problems = scalars_of(path, max_bytes=200)
    assert 0 < len(found["loss"]) < 10 and len(problems) == 1 and "(the limit)" in problems[0]


def nested(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):
        inner = tf.length_delimited(1, inner)
    return inner


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (tf.length_delimited(4, nested(100_000)), None),  # a graph_def nested 100,000 deep: skipped unread
        (tf.key(7, 3) + b"\x00", "wire type 3"),  # a group
        (tf.key(2, 0) + b"\xff" * 11, "a varint longer than 10 bytes"),
        (tf.key(2, 0) + b"\xff\xff", "a varint runs past the end"),
        (tf.length_delimited(5, tf.key(1, 2) + tf.varint(2**62)), "states 4611686018427387904 bytes"),
        (tf.key(0, 0) + b"\x01", "a field numbered 0"),
    ],
)
def test_malformed_or_deep_events_are_skipped_and_the_rest_read(tmp_path, bad, what):
    data = (
        tf.event_file([(1, "loss", 1.0)])
        + tf.frame(bad)
        + tf.frame(tf.event(2, [tf.scalar_value("loss", 2.0)]))
    )
    found, problems = scalars_of(write(tmp_path, data))
    assert found == {"loss": [[1, 1.0], [2, 2.0]]}
    if what is None:
        assert problems == []
    else:
        assert len(problems) == 1 and what in problems[0] and "not a valid event" in problems[0]


def test_a_summary_of_many_values_and_a_tensor_of_many_dims(tmp_path):
    many = tf.event(3, [tf.scalar_value(f"t{i % 7}", i) for i in range(50_000)])
    wide = tf.event(4, [tf.tensor_value("w", (1.0,), shape=(1,) * 100_000)])
    found, problems = scalars_of(write(tmp_path, tf.frame(many) + tf.frame(wide)))
    last_t6 = max(i for i in range(50_000) if i % 7 == 6)  # one step logged again: the later wins
    assert problems == [] and found["t6"] == [[3, float(last_t6)]] and found["w"] == [[4, 1.0]]


def test_a_million_empty_records_are_read_through_keeping_nothing(tmp_path):
    tiny = tf.frame(b"")
    path = write(tmp_path, tiny * 1_000_000)
    scalars = Scalars()
    read = read_event_file(path, scalars)
    assert (read.events, read.values, read.problems, scalars.series) == (1_000_000, 0, [], {})


def test_a_named_pipe_or_a_link_to_a_device_is_one_line(tmp_path):
    fifo = tmp_path / "events.out.tfevents.1.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "events.out.tfevents.2.zero"
    link.symlink_to("/dev/zero")
    for path, kind in ((fifo, "named pipe"), (link, "device"), (tmp_path, "folder")):
        found, problems = scalars_of(path)
        assert (
            found == {} and len(problems) == 1 and problems[0].startswith(f"{path}: ") and kind in problems[0]
        )


def test_a_tag_that_is_not_utf8_or_too_long(tmp_path):
    data = tf.frame(tf.event(1, [tf.scalar_value(b"\xffloss\xfe", 1.0), tf.scalar_value(b"x" * 5000, 2.0)]))
    found, problems = scalars_of(write(tmp_path, data))
    assert found == {"\ufffdloss\ufffd": [[1, 1.0]]}
    assert len(problems) == 2
    assert "not UTF-8" in problems[0] and "a tag of 5,000 bytes" in problems[1]


def test_values_that_are_not_finite_are_left_out_with_one_line(tmp_path):
    points = [(1, "loss", 1.0), (2, "loss", math.nan), (3, "loss", math.inf), (4, "loss", 4.0)]
    found, problems = scalars_of(write(tmp_path, tf.event_file(points)))
    assert found == {"loss": [[1, 1.0], [4, 4.0]]}
    assert len(problems) == 1 and "loss at step 2 is nan; left out (1 more like it)" in problems[0]


# --- scalars written as tensors -----------------------------------------------------------------


def test_scalars_written_as_tensors(tmp_path):
    values = [
        tf.tensor_value("new_style", (0.25,)),  # add_scalar(new_style=True)
        tf.tensor_value("double", (0.1,), tf.DT_DOUBLE),  # add_scalar(new_style=True, double_precision=True)
        tf.tensor_value("content", (0.5,), content=True, shape=(1, 1)),
        tf.tensor_value("pair", (1.0, 2.0)),  # not a scalar
        tf.tensor_value("histogram", (1.0,), plugin=b"histograms"),
        tf.tensor_value("wide", (1.0,), content=True, shape=(3,)),
    ]
    found, problems = scalars_of(write(tmp_path, tf.frame(tf.event(5, values))))
    assert problems == []
    assert found == {"new_style": [[5, 0.25]], "double": [[5, 0.1]], "content": [[5, 0.5]]}


# --- what is kept per tag ---------------------------------------------------------------------------


def test_a_resumed_run_logs_steps_again_and_the_later_ones_win():
    series = TagSeries()
    for step in (10, 20, 30, 40):
        series.add(step, 0.0, float(step))
    for step in (30, 40, 50):  # resumed from the step-20 checkpoint
        series.add(step, 1.0, step + 0.5)
    assert series.points()[0] == [10, 20, 30, 40, 50]
    assert series.points()[2] == [10.0, 20.0, 30.5, 40.5, 50.5]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 50),
    st.lists(st.tuples(st.integers(0, 10_000), st.floats(allow_nan=False)), max_size=2000),
)
def test_kept_points_are_few_ascending_and_end_at_the_newest(cap, logged):
    series = TagSeries(cap)
    for step, value in logged:
        series.add(step, 0.0, value)
    steps, _, values = series.points()
    assert len(steps) <= cap and steps == sorted(set(steps))
    assert len(series.steps) < 2 * cap
    if logged:
        assert (steps[-1], values[-1]) == logged[-1]


def test_beyond_the_cap_points_are_spread_evenly():
    series = TagSeries(1000)
    for step in range(100_000):
        series.add(step, 0.0, float(step))
    steps, _, _ = series.points()
    gaps = [b - a for a, b in itertools.pairwise(steps)][:-1]  # the last: to the newest, wherever it is
    assert len(steps) == 1000 and series.sampled and steps[0] == 0 and steps[-1] == 99_999
    assert max(gaps) <= 2 * min(gaps)  # one or two strides of what was kept


def test_tags_past_the_cap_are_counted_not_kept():
    scalars = Scalars(max_tags=3)
    for i in range(10):
        scalars.add(f"t{i}", 1, 0.0, 1.0)
    assert list(scalars.series) == ["t0", "t1", "t2"] and scalars.values_left_out == 7


# --- what a read costs: values and fields, not events ------------------------------------------


def test_values_are_counted_inside_an_event_and_the_read_stops_at_their_budget(tmp_path):
    many = tf.frame(tf.event(5, [tf.scalar_value(f"t{i % 7}", float(i)) for i in range(5_000)]))
    path = write(tmp_path, tf.event_file([(1, "loss", 1.0)]) + many * 3)
    scalars = Scalars()
    read = read_event_file(path, scalars, max_values=7_000)
    assert read.values == 7_000 and read.events == 3  # version, loss, 5,000 values; the next is cut
    assert len(read.problems) == 1 and "stopped after 7,000 values (the limit)" in read.problems[0]
    assert sum(s.logged for s in scalars.series.values()) == 5_001  # the event cut is not half kept


def test_fields_decoded_are_counted_at_every_level_and_bounded(tmp_path):
    junk = tf.frame((tf.key(3, 0) + b"\x01") * 50_000)  # 50,000 fields no reader asks for
    path = write(tmp_path, tf.event_file([(1, "loss", 1.0)]) + junk * 4)
    read = read_event_file(path, Scalars(), max_fields=120_000)
    assert read.fields <= 120_000 and read.events == 4  # version, loss, two junk; the third is cut
    assert len(read.problems) == 1 and "stopped after 120,000 fields decoded (the limit)" in read.problems[0]
    wide = tf.frame(tf.event(2, [tf.tensor_value("w", (1.0,), shape=(1,) * 60_000)]))
    read = read_event_file(write(tmp_path, wide, "events.out.tfevents.2.x"), Scalars(), max_fields=10_000)
    assert read.fields == 10_000 and "fields decoded" in read.problems[0]  # a shape's dims count too


def test_the_golden_file_reads_whole_within_the_default_budgets():
    read = read_event_file(EVENTS, Scalars())
    assert read.problems == [] and read.values == sum(len(p) for p in LOGGED["scalars"].values())
    assert read.fields < 8 * read.values  # torch's events: about six fields a value
