"""Stream compression negotiated by IDENTIFY, as byte transforms usable by both sides.

* snappy: the snappy *framing* format (stream identifier + CRC'd chunks), as Go's
  ``snappy.NewReader/NewWriter`` use, through python-snappy;
* deflate: raw deflate (no zlib header, ``wbits=-15``), flushed with ``Z_SYNC_FLUSH`` after
  every write so the peer can decode each write as soon as it arrives.

Each codec object holds one direction pair (compress what we send, decompress what we get).
Install the decompressor with ``InputBuffer.install_decompressor`` so bytes already received
after the switch point are taken over.

The codecs load their libraries when made: a connection that never negotiates compression
(the default) loads neither.
"""

from __future__ import annotations

from typing import Protocol

from smartnsq.errors import ProtocolError, ValidationError

__all__ = ["DeflateCodec", "SnappyCodec", "StreamCodec"]


class StreamCodec(Protocol):
    def compress(self, data: bytes) -> bytes: ...

    def decompress(self, data: bytes) -> bytes: ...


class SnappyCodec:
    """Snappy framing format in both directions."""

    def __init__(self) -> None:
        import snappy

        self._compressor = snappy.StreamCompressor()
        self._decompressor = snappy.StreamDecompressor()

    def compress(self, data: bytes) -> bytes:
        if not data:
            return b""
        return bytes(self._compressor.add_chunk(data))

    def decompress(self, data: bytes) -> bytes:
        try:
            return bytes(self._decompressor.decompress(data))
        except Exception as exc:  # cramjam raises its own error types
            raise ProtocolError(f"corrupt snappy stream: {exc}") from exc


class DeflateCodec:
    """Raw deflate in both directions; ``level`` 1..6 (nsqd's max_deflate_level)."""

    def __init__(self, level: int = 6) -> None:
        if type(level) is not int or not 1 <= level <= 9:
            raise ValidationError("deflate_level", "must be 1..9")
        import zlib

        self.level = level
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._decompressor = zlib.decompressobj(-15)
        self._sync_flush = zlib.Z_SYNC_FLUSH
        self._error = zlib.error

    def compress(self, data: bytes) -> bytes:
        if not data:
            return b""
        return self._compressor.compress(data) + self._compressor.flush(self._sync_flush)

    def decompress(self, data: bytes) -> bytes:
        try:
            return self._decompressor.decompress(data)
        except self._error as exc:
            raise ProtocolError(f"corrupt deflate stream: {exc}") from exc
