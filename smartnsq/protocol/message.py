"""Message frames (frame type 2) in every negotiated layout, decode and encode.

Layouts (youzan/nsq 0.3.7-HA.1.13.0 ``nsqd/message.go``, ``internalWriteTo``; nsqio/nsq v1.3.0
``nsqd/message.go``, ``WriteTo``):

* classic: ``[int64 ts][uint16 attempts][16-byte ASCII hex id][body]``;
* youzan: the 16-byte id is binary, ``[uint64 internal id][uint64 trace id]``;
* + ext block (client identified ``extend_support`` on an ext topic):
  ``[uint8 ext_ver]`` then, if ext_ver != 0, ``[uint16 ext_len][ext bytes]``;
* + detail block (SUB_ORDERED / SUB_ADVANCED): ``[uint64 queue offset][uint32 raw size]``,
  always after the ext block.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TypeVar

from smartnsq.errors import ProtocolError
from smartnsq.protocol._build import speedups

__all__ = [
    "EXT_VERSION_JSON",
    "EXT_VERSION_NONE",
    "EXT_VERSION_TAG",
    "MessageFrame",
    "MessageLayout",
    "decode_message",
    "encode_message_frame",
    "partition_of_internal_id",
]

EXT_VERSION_NONE = 0
EXT_VERSION_TAG = 2
EXT_VERSION_JSON = 4

# youzan internal ids carry the partition in their top bits: partition << 50 | sequence.
PARTITION_ID_SHIFT = 50

_unpack_head = struct.Struct(">qH").unpack_from
_unpack_ids = struct.Struct(">QQ").unpack_from
_unpack_u16 = struct.Struct(">H").unpack_from
_unpack_detail = struct.Struct(">QI").unpack_from
_pack_frame_head = struct.Struct(">iiqH").pack
_pack_ids = struct.Struct(">QQ").pack
_pack_u16 = struct.Struct(">H").pack
_pack_detail = struct.Struct(">QI").pack

_HEAD_SIZE = 26  # timestamp 8 + attempts 2 + id 16
_DETAIL_SIZE = 12


@dataclass(frozen=True)
class MessageLayout:
    """What a connection's message frames contain, fixed by IDENTIFY and the SUB command."""

    binary_id: bool = False
    ext: bool = False
    detail: bool = False

    @classmethod
    def classic(cls) -> MessageLayout:
        return cls()

    @classmethod
    def youzan(cls, *, ext: bool = False, detail: bool = False) -> MessageLayout:
        return cls(binary_id=True, ext=ext, detail=detail)


class MessageFrame:
    """The decoded fields of one message frame. ``id`` is the raw 16 bytes to FIN/REQ/TOUCH."""

    __slots__ = (
        "attempts",
        "body",
        "ext_raw",
        "ext_version",
        "id",
        "internal_id",
        "offset",
        "raw_size",
        "timestamp",
        "trace_id",
    )

    def __init__(
        self,
        timestamp: int,
        attempts: int,
        id: bytes,  # the protocol's name for it
        internal_id: int | None,
        trace_id: int | None,
        ext_version: int,
        ext_raw: bytes | None,
        offset: int | None,
        raw_size: int | None,
        body: bytes,
    ) -> None:
        self.timestamp = timestamp
        self.attempts = attempts
        self.id = id
        self.internal_id = internal_id
        self.trace_id = trace_id
        self.ext_version = ext_version
        self.ext_raw = ext_raw
        self.offset = offset
        self.raw_size = raw_size
        self.body = body

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id.hex()}, attempts={self.attempts}, "
            f"offset={self.offset}, body={self.body[:32]!r})"
        )


M = TypeVar("M", bound=MessageFrame)


def decode_message(data: bytes, layout: MessageLayout, cls: type[M]) -> M:
    """Decode the data of a message frame into ``cls`` (a :class:`MessageFrame` subclass)."""
    size = len(data)
    if size < _HEAD_SIZE:
        raise ProtocolError(f"message frame of {size} bytes is shorter than its header")
    timestamp, attempts = _unpack_head(data, 0)
    message_id = data[10:26]
    if layout.binary_id:
        internal_id, trace_id = _unpack_ids(data, 10)
    else:
        internal_id = trace_id = None
    pos = _HEAD_SIZE
    ext_version = EXT_VERSION_NONE
    ext_raw = None
    if layout.ext:
        if size < pos + 1:
            raise ProtocolError("message frame truncated in its ext block")
        ext_version = data[pos]
        pos += 1
        if ext_version != EXT_VERSION_NONE:
            if size < pos + 2:
                raise ProtocolError("message frame truncated in its ext block")
            (ext_len,) = _unpack_u16(data, pos)  # unsigned, unlike the Java SDK
            pos += 2
            if size < pos + ext_len:
                raise ProtocolError("message frame truncated in its ext header")
            ext_raw = data[pos : pos + ext_len]
            pos += ext_len
    offset = raw_size = None
    if layout.detail:
        if size < pos + _DETAIL_SIZE:
            raise ProtocolError("message frame truncated in its queue-position block")
        offset, raw_size = _unpack_detail(data, pos)
        pos += _DETAIL_SIZE
    return cls(
        timestamp,
        attempts,
        message_id,
        internal_id,
        trace_id,
        ext_version,
        ext_raw,
        offset,
        raw_size,
        data[pos:],
    )


def encode_message_frame(
    timestamp: int,
    attempts: int,
    message_id: bytes,
    body: bytes,
    *,
    ext_version: int | None = None,
    ext_raw: bytes = b"",
    offset: int | None = None,
    raw_size: int | None = None,
) -> bytes:
    """A complete message frame (size and type included), the server-side mirror.

    ``ext_version`` None omits the ext block; ``offset`` None omits the detail block.
    """
    parts = [b"", message_id]
    if ext_version is not None:
        if ext_version == EXT_VERSION_NONE:
            parts.append(b"\x00")
        else:
            parts.append(bytes((ext_version,)) + _pack_u16(len(ext_raw)) + ext_raw)
    if offset is not None:
        parts.append(_pack_detail(offset, raw_size or 0))
    parts.append(body)
    length = 4 + 10 + sum(len(p) for p in parts)
    parts[0] = _pack_frame_head(length, 2, timestamp, attempts)
    return b"".join(parts)


def youzan_message_id(internal_id: int, trace_id: int = 0) -> bytes:
    """The raw 16-byte youzan id: internal id and trace id, both big-endian."""
    return _pack_ids(internal_id, trace_id)


def partition_of_internal_id(internal_id: int) -> int:
    return internal_id >> PARTITION_ID_SHIFT


# The compiled twin, where it was built (and SMARTNSQ_PURE is not set): the same objects.
pure_decode_message = decode_message
if speedups is not None:
    decode_message = speedups.decode_message
