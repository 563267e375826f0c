"""The server-side mirror of the protocol, used by the embedded cluster.

:class:`CommandParser` turns what a client sends into :class:`ClientCommand` tuples. Like
youzan nsqd, it reads FIN, REQ and TOUCH at fixed byte offsets, because the raw 16-byte id may
contain ``\\n`` or space bytes. Frame encoders produce responses, errors and (via
``protocol.message``) message frames.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from smartnsq.errors import ProtocolError
from smartnsq.protocol.buffer import InputBuffer
from smartnsq.protocol.commands import MAGIC_V2
from smartnsq.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, encode_frame
from smartnsq.protocol.validation import MAX_BODY_SIZE, MESSAGE_ID_SIZE

__all__ = [
    "CLASSIC_BODY_COMMANDS",
    "YOUZAN_BODY_COMMANDS",
    "ClientCommand",
    "CommandParser",
    "MpubFormatError",
    "encode_error",
    "encode_response",
    "split_mpub",
]

CLASSIC_BODY_COMMANDS = frozenset({b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"})
YOUZAN_BODY_COMMANDS = frozenset(
    {b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"PUB_TRACE", b"MPUB_TRACE", b"PUB_EXT", b"MPUB_EXT"}
)

_unpack_i32 = struct.Struct(">i").unpack_from

# Fixed layouts of the commands that carry a raw id: (prefix, id offset).
_FIN_PREFIX = b"FIN "
_REQ_PREFIX = b"REQ "
_TOUCH_PREFIX = b"TOUCH "
_FIN_SIZE = len(_FIN_PREFIX) + MESSAGE_ID_SIZE + 1


class ClientCommand(NamedTuple):
    """One client command. ``params`` are the words after the name (for FIN/REQ/TOUCH the raw
    id, then REQ's timeout). ``body`` is None when the command has no body or its size field
    was out of range (``body_size`` then holds the size as sent)."""

    name: bytes
    params: tuple[bytes, ...] = ()
    body: bytes | None = None
    body_size: int | None = None


class CommandParser(InputBuffer):
    """Incremental parser of the client-to-server byte stream."""

    __slots__ = ("_body_commands", "_broken", "_magic_pending", "max_body_size")

    def __init__(
        self,
        *,
        body_commands: frozenset[bytes] = YOUZAN_BODY_COMMANDS,
        max_body_size: int = MAX_BODY_SIZE,
        expect_magic: bool = True,
    ) -> None:
        super().__init__()
        self._body_commands = body_commands
        self.max_body_size = max_body_size
        self._magic_pending = expect_magic
        self._broken = False

    def next_command(self) -> ClientCommand | None:
        """The next complete command, or None until more bytes arrive.

        Raises :class:`ProtocolError` if the stream does not start with the ``"  V2"`` magic.
        After a body command with an invalid size, parsing stops (nsqd closes the connection).
        """
        if self._broken:
            return None
        buf = self._buf
        pos = self._pos
        end = len(buf)
        if self._magic_pending:
            if end - pos < 4:
                return None
            magic = bytes(buf[pos : pos + 4])
            if magic != MAGIC_V2:
                self._broken = True
                raise ProtocolError(f"bad protocol magic {magic!r}")
            self._magic_pending = False
            pos += 4
            self._pos = pos
        if buf.startswith(_FIN_PREFIX, pos):
            return self._fixed_id_command(b"FIN", pos, len(_FIN_PREFIX))
        if buf.startswith(_TOUCH_PREFIX, pos):
            return self._fixed_id_command(b"TOUCH", pos, len(_TOUCH_PREFIX))
        if buf.startswith(_REQ_PREFIX, pos):
            return self._req(pos)
        newline = buf.find(b"\n", pos)
        if newline < 0:
            return None
        line = bytes(buf[pos:newline])
        if line.endswith(b"\r"):
            line = line[:-1]
        words = line.split(b" ")
        name = words[0]
        params = tuple(words[1:])
        if name not in self._body_commands:
            self._pos = newline + 1
            return ClientCommand(name, params)
        if end - newline - 1 < 4:
            return None
        (size,) = _unpack_i32(buf, newline + 1)
        body_start = newline + 5
        if size <= 0 or size > self.max_body_size:
            self._broken = True
            self._pos = body_start
            return ClientCommand(name, params, None, size)
        if end - body_start < size:
            return None
        self._pos = body_start + size
        return ClientCommand(name, params, bytes(buf[body_start : body_start + size]), size)

    def take_fins(self) -> list[bytes]:
        """The ids of the well-formed ``FIN <16-byte id>\\n`` commands at the head of the
        stream, consumed; empty if the next command is anything else.

        A fast path for servers: consumers send FINs in runs, and one call per run avoids a
        :class:`ClientCommand` per message. A malformed FIN is left for :meth:`next_command`.
        """
        if self._broken or self._magic_pending:
            return []
        buf = self._buf
        pos = start = self._pos
        end = len(buf)
        size = _FIN_SIZE
        while (
            end - pos >= size and buf.startswith(_FIN_PREFIX, pos) and buf[pos + size - 1] == 0x0A
        ):
            pos += size
        if pos == start:
            return []
        self._pos = pos
        run = bytes(buf[start:pos])
        return [run[i : i + MESSAGE_ID_SIZE] for i in range(len(_FIN_PREFIX), len(run), size)]

    def _fixed_id_command(self, name: bytes, pos: int, id_offset: int) -> ClientCommand | None:
        total = id_offset + MESSAGE_ID_SIZE + 1
        if len(self._buf) - pos < total:
            return None
        buf = self._buf
        message_id = bytes(buf[pos + id_offset : pos + id_offset + MESSAGE_ID_SIZE])
        if buf[pos + total - 1] != 0x0A:
            # Not "<name> <16 bytes>\n": consume the line and report it as malformed.
            newline = buf.find(b"\n", pos + total - 1)
            if newline < 0:
                return None
            self._pos = newline + 1
            return ClientCommand(name, tuple(bytes(buf[pos + id_offset : newline]).split(b" ")))
        self._pos = pos + total
        return ClientCommand(name, (message_id,))

    def _req(self, pos: int) -> ClientCommand | None:
        buf = self._buf
        id_end = pos + len(_REQ_PREFIX) + MESSAGE_ID_SIZE
        if len(buf) <= id_end:
            return None
        newline = buf.find(b"\n", id_end)
        if newline < 0:
            return None
        message_id = bytes(buf[pos + len(_REQ_PREFIX) : id_end])
        self._pos = newline + 1
        if buf[id_end] != 0x20:
            return ClientCommand(b"REQ", (message_id,))
        timeout = bytes(buf[id_end + 1 : newline]).rstrip(b"\r")
        return ClientCommand(b"REQ", (message_id, timeout))


class MpubFormatError(ValueError):
    """An MPUB body is malformed; ``reason`` is "count" or "message"."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def split_mpub(body: bytes, max_msg_size: int, max_body_size: int = MAX_BODY_SIZE) -> list[bytes]:
    """Split an MPUB body ``[count]([size][msg])*`` into messages, checking nsqd's limits."""
    if len(body) < 4:
        raise MpubFormatError("count", "MPUB failed to read message count")
    (count,) = _unpack_i32(body, 0)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise MpubFormatError("count", f"MPUB invalid message count {count}")
    out: list[bytes] = []
    append = out.append
    end = len(body)
    pos = 4
    for _ in range(count):
        if end < pos + 4:
            raise MpubFormatError("message", "MPUB failed to read message body size")
        (size,) = _unpack_i32(body, pos)
        pos += 4
        if size <= 0 or size > max_msg_size:
            raise MpubFormatError("message", f"MPUB message too big {size} > {max_msg_size}")
        stop = pos + size
        if end < stop:
            raise MpubFormatError("message", "MPUB failed to read message body")
        append(body[pos:stop])
        pos = stop
    return out


def encode_response(data: bytes) -> bytes:
    return encode_frame(FRAME_TYPE_RESPONSE, data)


def encode_error(text: str | bytes) -> bytes:
    return encode_frame(FRAME_TYPE_ERROR, text.encode() if isinstance(text, str) else text)
