"""Incremental decoder for server-to-client frames: ``[int32 size][int32 type][data]``.

``size`` counts the 4-byte type plus the data. The decoder is sans-IO: ``feed()`` bytes as
they arrive, in any fragmentation, then take complete frames with ``next_frame()`` or
``drain()``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from smartnsq.errors import ProtocolError
from smartnsq.protocol._build import speedups
from smartnsq.protocol.buffer import InputBuffer

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "Frame",
    "FrameDecoder",
    "encode_frame",
]

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

# A message frame holds at most max_msg_size (1 MiB by default) plus its headers; servers may
# raise their limits, so the default guard is generous. A larger size means corruption.
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024

_unpack_header = struct.Struct(">ii").unpack_from
_unpack_size = struct.Struct(">i").unpack_from
_pack_header = struct.Struct(">ii").pack


class Frame(NamedTuple):
    type: int
    data: bytes


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """One complete frame (used by the server side and by tests)."""
    return _pack_header(len(data) + 4, frame_type) + data


class FrameDecoder(InputBuffer):
    """Turns a byte stream from nsqd into :class:`Frame` tuples."""

    __slots__ = ("max_frame_size",)

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        super().__init__()
        self.max_frame_size = max_frame_size

    def next_frame(self) -> tuple[int, bytes] | None:
        """The next complete frame as ``(frame type, data)``, or None until more bytes are
        fed. (A plain tuple: a :class:`Frame` per message costs a Python call.)

        Raises :class:`~smartnsq.errors.ProtocolError` on a corrupt size or an unknown type;
        the stream cannot be resynchronised after that, so the connection must be dropped.
        Returning None, it settles the buffer (:meth:`settle`): what was decoded goes.
        """
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if available < 8:
            if available >= 4:
                (size,) = _unpack_size(buf, pos)
                if size < 4 or size > self.max_frame_size:
                    raise ProtocolError(
                        f"corrupt frame size {size} (allowed 4..{self.max_frame_size})"
                    )
            if pos:
                self.settle()
            return None
        size, frame_type = _unpack_header(buf, pos)
        if size < 4 or size > self.max_frame_size:
            raise ProtocolError(f"corrupt frame size {size} (allowed 4..{self.max_frame_size})")
        if available < size + 4:
            if pos:
                self.settle()
            return None
        if not 0 <= frame_type <= 2:
            raise ProtocolError(f"unknown frame type {frame_type}")
        end = pos + 4 + size
        data = bytes(buf[pos + 8 : end])
        self._pos = end
        return frame_type, data

    def drain(self) -> list[Frame]:
        """Every complete frame buffered so far."""
        frames: list[Frame] = []
        append = frames.append
        while (frame := self.next_frame()) is not None:
            append(Frame(*frame))
        return frames


# The compiled twin, where it was built (and SMARTNSQ_PURE is not set): the same frames.
pure_next_frame = FrameDecoder.next_frame
if speedups is not None:
    FrameDecoder.next_frame = speedups.next_frame  # type: ignore[method-assign]
