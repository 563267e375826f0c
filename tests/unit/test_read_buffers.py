"""What an idle connection holds for reading: the read buffer is its thread's (one for every
connection), and the frame buffer grows with a frame larger than a read, then gives its
memory back once the frame is decoded, in both builds of ``next_frame``."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from smartnsq.protocol import frames
from smartnsq.protocol._build import speedups
from smartnsq.protocol.buffer import InputBuffer
from smartnsq.protocol.frames import FRAME_TYPE_MESSAGE, FrameDecoder, encode_frame
from smartnsq.transport.reading import READ_BUFFER_SIZE, ReusableReadBuffer, thread_read_buffer

BUILDS = [pytest.param(frames.pure_next_frame, id="pure")]
if speedups is not None:
    BUILDS.append(pytest.param(speedups.next_frame, id="compiled"))

MIB = 1024 * 1024
EMPTY = sys.getsizeof(bytearray())
SMALL = 64  # bytes of storage an emptied buffer may keep (a cleared bytearray keeps one)


def _take(decoder: FrameDecoder, next_frame: Callable[[Any], Any]) -> list[tuple[int, bytes]]:
    """Every complete frame, the way the session takes them (until next_frame says None)."""
    taken = []
    while (frame := next_frame(decoder)) is not None:
        taken.append(frame)
    return taken


def _held(buffer: InputBuffer) -> int:
    """Bytes of storage the buffer holds beyond an empty one."""
    return sys.getsizeof(buffer._buf) - EMPTY


# --------------------------------------------------------------------------- the frame buffer


@pytest.mark.parametrize("next_frame", BUILDS)
def test_a_frame_larger_than_a_read_grows_the_buffer_then_is_given_back(
    next_frame: Callable[[Any], Any],
) -> None:
    body = bytes(range(256)) * (4 * 1024)  # 1 MiB
    stream = encode_frame(FRAME_TYPE_MESSAGE, body) + encode_frame(0, b"OK")
    decoder = FrameDecoder()
    taken: list[tuple[int, bytes]] = []
    largest = 0
    for start in range(0, len(stream), READ_BUFFER_SIZE):
        decoder.feed(stream[start : start + READ_BUFFER_SIZE])
        taken += _take(decoder, next_frame)
        largest = max(largest, _held(decoder))
    assert taken == [(FRAME_TYPE_MESSAGE, body), (0, b"OK")]
    assert largest >= MIB  # it grew to hold the whole frame
    assert (decoder._pos, decoder.buffered) == (0, 0)
    assert _held(decoder) < SMALL


@pytest.mark.parametrize("next_frame", BUILDS)
def test_what_is_decoded_goes_when_the_decoder_waits_for_more(
    next_frame: Callable[[Any], Any],
) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(0, b"x" * 5000) + encode_frame(0, b"y" * 10)[:6])
    assert _take(decoder, next_frame) == [(0, b"x" * 5000)]
    # the 5 KiB frame went with the read, the start of the next one stays
    assert (decoder._pos, decoder.buffered) == (0, 6)
    decoder.feed(encode_frame(0, b"y" * 10)[6:])
    assert _take(decoder, next_frame) == [(0, b"y" * 10)]
    assert decoder._pos == 0
    assert _held(decoder) < SMALL


def test_a_small_prefix_before_a_large_partial_frame_is_not_moved() -> None:
    buffer = InputBuffer()
    buffer.feed(b"a" * 10 + b"b" * 1000)
    buffer._pos = 10  # a 10-byte frame decoded, 1000 bytes of the next one here
    buffer.settle()
    assert (buffer._pos, buffer.buffered) == (10, 1000)  # moved when it is half the buffer
    buffer._pos = 600
    buffer.settle()
    assert (buffer._pos, buffer.peek(3)) == (0, b"bbb")
    assert buffer.buffered == 410


def test_settling_an_untouched_buffer_changes_nothing() -> None:
    buffer = InputBuffer()
    buffer.settle()
    buffer.feed(b"abc")
    buffer.settle()
    assert (buffer._pos, buffer.peek(10)) == (0, b"abc")


@pytest.mark.parametrize("next_frame", BUILDS)
def test_an_idle_connection_holds_nothing_after_a_burst(next_frame: Callable[[Any], Any]) -> None:
    decoder = FrameDecoder()
    burst = b"".join(encode_frame(FRAME_TYPE_MESSAGE, b"m" * 200) for _ in range(300))
    for start in range(0, len(burst), 4096):
        decoder.feed(burst[start : start + 4096])
        _take(decoder, next_frame)
    assert decoder.buffered == 0
    assert _held(decoder) < SMALL


# --------------------------------------------------------------------------- the read buffer


class _Reader(ReusableReadBuffer):
    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def data_received(self, data: memoryview) -> None:
        self.seen.append(bytes(data))


def test_connections_of_a_thread_read_into_one_buffer() -> None:
    first, second = _Reader(), _Reader()
    buffer = first.get_buffer(-1)
    assert second.get_buffer(-1).obj is buffer.obj is thread_read_buffer().obj
    assert len(buffer) == READ_BUFFER_SIZE
    buffer[:5] = b"hello"
    first.buffer_updated(5)
    buffer = second.get_buffer(-1)
    buffer[:3] = b"bye"
    second.buffer_updated(3)
    assert (first.seen, second.seen) == ([b"hello"], [b"bye"])


def test_each_thread_has_its_own_read_buffer() -> None:
    mine = thread_read_buffer().obj
    theirs: list[object] = []
    thread = threading.Thread(target=lambda: theirs.append(_Reader().get_buffer(-1).obj))
    thread.start()
    thread.join()
    assert len(theirs) == 1
    assert theirs[0] is not mine
