"""The fault proxy's pure shaping: directions, latency in order, seeded slicing that cuts a
stream at the same positions however it is read, the bandwidth schedule, byte limits."""

from __future__ import annotations

import random

import pytest

from smartnsq.errors import ValidationError
from smartnsq.testing.faults.shaping import (
    DOWNSTREAM,
    UPSTREAM,
    ByteLimit,
    Latency,
    Slicer,
    Throttle,
    directions,
)


def test_directions() -> None:
    assert directions("both") == (UPSTREAM, DOWNSTREAM)
    assert directions("upstream") == (UPSTREAM,)
    assert directions("downstream") == (DOWNSTREAM,)
    with pytest.raises(ValidationError, match="direction"):
        directions("up")


def test_latency_keeps_order_and_stays_within_the_jitter() -> None:
    latency = Latency(0.1, jitter=0.05)
    rng = random.Random(7)
    previous = 0.0
    for step in range(1000):
        now = step * 0.001
        due = latency.due(now, previous, rng)
        assert due >= previous
        assert due <= now + 0.15
        assert due >= now + 0.05 or due == previous
        previous = due


def test_latency_never_leaves_before_it_was_read() -> None:
    assert Latency(0.01, jitter=0.05).due(5.0, 0.0, random.Random(1)) >= 5.0


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True])
def test_latency_refuses_bad_values(bad: object) -> None:
    with pytest.raises(ValidationError, match="seconds"):
        Latency(bad)  # type: ignore[arg-type]


def _cut_positions(max_size: int, seed: int, reads: list[bytes]) -> tuple[list[int], bytes]:
    slicer = Slicer(max_size, random.Random(seed))
    ends, position, out = [], 0, b""
    for data in reads:
        for piece in slicer.cut(data):
            assert 1 <= len(piece) <= max_size
            position += len(piece)
            ends.append(position)
            out += piece
    return ends, out


def test_slices_fall_at_the_same_positions_however_the_stream_is_read() -> None:
    stream = bytes(range(256)) * 4
    whole, out = _cut_positions(7, 42, [stream])
    assert out == stream
    rng = random.Random(3)
    reads, rest = [], stream
    while rest:
        size = rng.randint(1, 50)
        reads.append(rest[:size])
        rest = rest[size:]
    split, out = _cut_positions(7, 42, reads)
    assert out == stream
    read_ends = set()
    position = 0
    for data in reads:
        position += len(data)
        read_ends.add(position)
    # Every seeded cut is there; the reads may only add cuts at their own ends.
    assert set(whole) <= set(split)
    assert set(split) - set(whole) <= read_ends


def test_slices_depend_on_the_seed() -> None:
    stream = bytes(500)
    assert _cut_positions(5, 1, [stream]) == _cut_positions(5, 1, [stream])
    assert _cut_positions(5, 1, [stream]) != _cut_positions(5, 2, [stream])


def test_slicer_of_one_byte() -> None:
    assert list(Slicer(1, random.Random(0)).cut(b"abc")) == [b"a", b"b", b"c"]
    with pytest.raises(ValidationError, match="max_size"):
        Slicer(0, random.Random(0))


def test_throttle_spreads_bytes_at_the_rate() -> None:
    throttle = Throttle(1000)
    assert throttle.piece_size == 20
    assert throttle.start(0.0, 100) == 0.0
    assert throttle.start(0.0, 100) == pytest.approx(0.1)  # waits for the first
    assert throttle.start(0.15, 50) == pytest.approx(0.2)
    assert throttle.start(10.0, 1) == 10.0  # an idle link starts at once
    assert Throttle(10).piece_size == 1
    with pytest.raises(ValidationError, match="bytes_per_second"):
        Throttle(0)


def test_byte_limit() -> None:
    limit = ByteLimit(10)
    assert limit.take(4) == 4
    assert not limit.reached
    assert limit.take(10) == 6
    assert limit.reached
    assert limit.take(3) == 0
    assert ByteLimit(0).reached
    with pytest.raises(ValidationError, match="nbytes"):
        ByteLimit(-1)
