"""Snappy framing and raw deflate as stream transforms, including the mid-stream switch."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import ProtocolError
from smartnsq.protocol.compression import DeflateCodec, SnappyCodec, StreamCodec
from smartnsq.protocol.frames import Frame, FrameDecoder, encode_frame
from smartnsq.protocol.responses import OK

CODECS = [SnappyCodec, lambda: DeflateCodec(1), lambda: DeflateCodec(6)]


@pytest.mark.parametrize("make", CODECS)
def test_round_trip_large_and_many(make: type[StreamCodec]) -> None:
    sender, receiver = make(), make()
    payloads = [b"a" * 200_000, bytes(range(256)) * 300, b"x", b"OK"]
    out = b""
    for p in payloads:
        out += receiver.decompress(sender.compress(p))
    assert out == b"".join(payloads)


def test_snappy_stream_starts_with_identifier() -> None:
    data = SnappyCodec().compress(b"hello")
    assert data.startswith(b"\xff\x06\x00\x00sNaPpY")


def test_deflate_is_raw() -> None:
    import zlib

    data = DeflateCodec(6).compress(b"hello hello hello")
    assert zlib.decompressobj(-15).decompress(data) == b"hello hello hello"


@settings(max_examples=60, deadline=None)
@given(
    bodies=st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=15),
    cuts=st.lists(st.integers(0, 100_000), max_size=25),
    codec_index=st.integers(0, 2),
)
def test_switch_takes_over_buffered_bytes(
    bodies: list[bytes], cuts: list[int], codec_index: int
) -> None:
    """The IDENTIFY answer arrives plain; everything after it is compressed, possibly in the
    same read. Frames already buffered past the switch point must be decompressed."""
    server = CODECS[codec_index]()
    client = CODECS[codec_index]()
    plain = encode_frame(0, b'{"snappy":true}')
    compressed = server.compress(encode_frame(0, OK))
    for body in bodies:
        compressed += server.compress(encode_frame(2, body))
    stream = plain + compressed
    decoder = FrameDecoder()
    points = sorted({x % (len(stream) + 1) for x in cuts})
    got: list[Frame] = []
    switched = False
    last = 0
    for p in [*points, len(stream)]:
        decoder.feed(stream[last:p])
        last = p
        while (frame := decoder.next_frame()) is not None:
            got.append(frame)
            if not switched:
                switched = True
                decoder.install_decompressor(client.decompress)
    assert got == [Frame(0, b'{"snappy":true}'), Frame(0, OK), *[Frame(2, b) for b in bodies]]


def test_corrupt_streams_raise_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        DeflateCodec().decompress(b"\xff\xff\xff\xff garbage")
    bad = SnappyCodec().compress(b"hello world")
    bad = bad[:-3] + bytes(x ^ 0xFF for x in bad[-3:])
    with pytest.raises(ProtocolError):
        SnappyCodec().decompress(bad)


def test_deflate_level_validated() -> None:
    from smartnsq.errors import ValidationError

    with pytest.raises(ValidationError):
        DeflateCodec(0)
