"""An input byte buffer with an optional decompressor, shared by the frame decoder (client
side) and the command parser (server side).

Reads advance a position instead of deleting from the front; the consumed prefix is dropped
only once it is at least half of the buffer, so trimming stays linear overall. The buffer
grows with what arrives (a frame larger than a read's worth takes several reads) and gives
its memory back once everything in it is decoded (:meth:`InputBuffer.settle`): an idle
connection holds an empty buffer, whatever the largest frame it ever read.
"""

from __future__ import annotations

from collections.abc import Callable

Decompressor = Callable[[bytes], bytes]


class InputBuffer:
    __slots__ = ("_buf", "_decompress", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._decompress: Decompressor | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the peer (decompressed first if a codec is installed)."""
        if self._decompress is not None:
            data = self._decompress(bytes(data))
        pos = self._pos
        if pos and pos * 2 >= len(self._buf):
            del self._buf[:pos]
            self._pos = 0
        self._buf += data

    def settle(self) -> None:
        """Drop what was decoded, when the decoder waits for more: all of it when nothing
        else is left (the storage is freed), else the consumed prefix once it is at least
        half of the buffer (a large frame still arriving is not moved for a small one)."""
        pos = self._pos
        if not pos:
            return
        buf = self._buf
        if pos == len(buf):
            buf.clear()
        elif pos * 2 >= len(buf):
            del buf[:pos]
        else:
            return
        self._pos = 0

    def install_decompressor(self, decompress: Decompressor) -> None:
        """Switch the stream to a compressed encoding from the current read position on.

        Bytes already received but not yet decoded were sent after the switch point, so they
        are taken over and decompressed too.
        """
        rest = bytes(self._buf[self._pos :])
        self._buf = bytearray()
        self._pos = 0
        self._decompress = decompress
        if rest:
            self.feed(rest)

    def peek(self, size: int) -> bytes:
        """The first ``size`` bytes received and not yet decoded (fewer if fewer are there)."""
        return bytes(self._buf[self._pos : self._pos + size])

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buf) - self._pos
