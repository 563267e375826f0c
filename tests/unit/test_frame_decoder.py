"""The incremental frame decoder under any fragmentation, and its corruption guards."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import ProtocolError
from smartnsq.protocol.frames import Frame, FrameDecoder, encode_frame
from smartnsq.protocol.message import (
    MessageFrame,
    MessageLayout,
    decode_message,
    encode_message_frame,
)

frames_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.binary(min_size=0, max_size=300)), min_size=1, max_size=30
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks, last = [], 0
    for p in points:
        chunks.append(data[last:p])
        last = p
    chunks.append(data[last:])
    return chunks


@settings(max_examples=200, deadline=None)
@given(frames=frames_strategy, cuts=st.lists(st.integers(0, 10_000), max_size=40))
def test_any_fragmentation(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    decoder = FrameDecoder()
    got: list[Frame] = []
    for chunk in _split(stream, cuts):
        decoder.feed(chunk)
        got.extend(decoder.drain())
    assert got == [Frame(t, d) for t, d in frames]
    assert decoder.buffered == 0


def test_one_byte_feeds() -> None:
    frames = [(0, b"OK"), (2, b"x" * 40), (1, b"E_INVALID bad"), (0, b"_heartbeat_")]
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    decoder = FrameDecoder()
    got = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        got.extend(decoder.drain())
    assert got == [Frame(t, d) for t, d in frames]


def test_many_frames_in_one_feed() -> None:
    stream = b"".join(encode_frame(0, b"OK") for _ in range(10_000))
    decoder = FrameDecoder()
    decoder.feed(stream)
    assert len(decoder.drain()) == 10_000


@pytest.mark.parametrize("size", [-1, -(2**31), 0, 3, 17 * 1024 * 1024])
def test_corrupt_sizes_raise(size: int) -> None:
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">i", size) + b"\x00" * 8)
    with pytest.raises(ProtocolError):
        decoder.next_frame()


def test_configured_maximum() -> None:
    decoder = FrameDecoder(max_frame_size=100)
    decoder.feed(encode_frame(0, b"x" * 96))
    assert decoder.next_frame() == Frame(0, b"x" * 96)
    decoder.feed(encode_frame(0, b"x" * 97))
    with pytest.raises(ProtocolError):
        decoder.next_frame()


def test_unknown_frame_type_raises() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(7, b"??"))
    with pytest.raises(ProtocolError):
        decoder.next_frame()


def test_buffer_is_trimmed_while_reading() -> None:
    """A long-lived connection does not accumulate consumed bytes."""
    decoder = FrameDecoder()
    frame = encode_frame(2, b"y" * 1000)
    for _ in range(5000):
        decoder.feed(frame + frame[:500])
        decoder.drain()
        decoder.feed(frame[500:])
        decoder.drain()
    assert len(decoder._buf) < 4 * len(frame)


@settings(max_examples=300, deadline=None)
@given(
    internal_id=st.integers(0, 2**64 - 1),
    trace_id=st.integers(0, 2**64 - 1),
    attempts=st.integers(0, 65535),
    body=st.binary(min_size=1, max_size=64),
    ext=st.one_of(st.none(), st.binary(max_size=70)),
    detail=st.one_of(st.none(), st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))),
)
def test_youzan_message_round_trip(
    internal_id: int,
    trace_id: int,
    attempts: int,
    body: bytes,
    ext: bytes | None,
    detail: tuple[int, int] | None,
) -> None:
    """Ids containing newlines and spaces survive; every layout combination round-trips."""
    message_id = struct.pack(">QQ", internal_id, trace_id)
    frame = encode_message_frame(
        123,
        attempts,
        message_id,
        body,
        ext_version=None if ext is None else (4 if ext else 0),
        ext_raw=ext or b"",
        offset=None if detail is None else detail[0],
        raw_size=None if detail is None else detail[1],
    )
    decoder = FrameDecoder()
    decoder.feed(frame)
    got = decoder.next_frame()
    assert got is not None
    layout = MessageLayout.youzan(ext=ext is not None, detail=detail is not None)
    msg = decode_message(got[1], layout, MessageFrame)
    assert (msg.id, msg.internal_id, msg.trace_id) == (message_id, internal_id, trace_id)
    assert msg.attempts == attempts
    assert msg.body == body
    assert msg.ext_raw == (ext or None)
    assert (msg.offset, msg.raw_size) == (detail or (None, None))
