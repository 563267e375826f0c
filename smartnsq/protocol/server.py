"""The server-side mirror of the protocol, used by the embedded cluster.

:class:`CommandParser` turns what a client sends into :class:`ClientCommand` tuples. Like
youzan nsqd, it reads FIN, REQ and TOUCH at fixed byte offsets, because the raw 16-byte id may
contain ``\\n`` or space bytes (classic nsqd splits every line at spaces). Frame encoders
produce responses, errors and (via ``protocol.message``) message frames.
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

# youzan nsqd reads the id of FIN and REQ at bytes 4..20 of the line and TOUCH's at 6..22
# (youzan/nsq 0.3.7-HA.1.13.0 ``nsqdserver/protocol_v2.go``, ``protocolV2.IOLoop``).
_FIN_PREFIX = b"FIN "
_FIN_SIZE = len(_FIN_PREFIX) + MESSAGE_ID_SIZE + 1
_ID_START, _ID_END = 4, 4 + MESSAGE_ID_SIZE
_TOUCH_ID_START, _TOUCH_ID_END = 6, 6 + MESSAGE_ID_SIZE


class ClientCommand(NamedTuple):
    """One client command. ``params`` are the words after the name (for FIN/REQ/TOUCH the raw
    id, then REQ's timeout). ``body`` is None when the command has no body or its size field
    was out of range (``body_size`` then holds the size as sent)."""

    name: bytes
    params: tuple[bytes, ...] = ()
    body: bytes | None = None
    body_size: int | None = None


class CommandParser(InputBuffer):
    """Incremental parser of the client-to-server byte stream.

    ``fixed_ids`` (youzan nsqd): a line starting with ``FIN`` or ``REQ`` runs to the first
    ``\\n`` at or after byte 20 and its id is bytes 4..20 (REQ's timeout follows from byte 21);
    a ``TOUCH`` line is 23 bytes, or longer if its first ``\\n`` comes later, with the id at
    bytes 6..22, whatever those bytes are: nsqd reads on until it has them. Without it
    (classic nsqd) every line is split at spaces.
    """

    __slots__ = ("_body_commands", "_broken", "_fixed_ids", "_magic_pending", "max_body_size")

    def __init__(
        self,
        *,
        body_commands: frozenset[bytes] = YOUZAN_BODY_COMMANDS,
        max_body_size: int = MAX_BODY_SIZE,
        expect_magic: bool = True,
        fixed_ids: bool = True,
    ) -> None:
        super().__init__()
        self._body_commands = body_commands
        self.max_body_size = max_body_size
        self._magic_pending = expect_magic
        self._fixed_ids = fixed_ids
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
        if self._fixed_ids:
            if buf.startswith(b"FIN", pos) or buf.startswith(b"REQ", pos):
                return self._fin_or_req(pos)
            if buf.startswith(b"TOUCH", pos):
                return self._touch(pos)
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
        :class:`ClientCommand` per message. A FIN that :meth:`next_command` would read
        differently is left for it.
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
        run = bytes(buf[start:pos])
        if not self._fixed_ids:
            run = _classic_fins(run)
            if not run:
                return []
        self._pos = start + len(run)
        return [run[i : i + MESSAGE_ID_SIZE] for i in range(len(_FIN_PREFIX), len(run), size)]

    def _fin_or_req(self, pos: int) -> ClientCommand | None:
        buf = self._buf
        newline = buf.find(b"\n", pos + _ID_END)
        if newline < 0:
            return None
        self._pos = newline + 1
        name = bytes(buf[pos : pos + 3])
        message_id = bytes(buf[pos + _ID_START : pos + _ID_END])
        if name == b"REQ" and newline > pos + _ID_END:
            # no \r is stripped: nsqd keeps it in the timeout
            return ClientCommand(name, (message_id, bytes(buf[pos + _ID_END + 1 : newline])))
        return ClientCommand(name, (message_id,))

    def _touch(self, pos: int) -> ClientCommand | None:
        buf = self._buf
        newline = buf.find(b"\n", pos)
        if newline < 0:
            return None
        line_end = newline + 1
        if line_end - pos < _TOUCH_ID_END + 1:
            # a short line: nsqd reads exactly up to 23 bytes, newline or not
            if len(buf) - pos < _TOUCH_ID_END + 1:
                return None
            line_end = pos + _TOUCH_ID_END + 1
        self._pos = line_end
        return ClientCommand(b"TOUCH", (bytes(buf[pos + _TOUCH_ID_START : pos + _TOUCH_ID_END]),))


def _classic_fins(run: bytes) -> bytes:
    """The FINs at the head of a run that classic nsqd reads as ``FIN <id>`` too: it splits
    lines at spaces and strips a final \\r, so an id holding a space or a newline, or ending
    in \\r, reads differently (left for :meth:`CommandParser.next_command`)."""
    count = len(run) // _FIN_SIZE
    if run.count(b" ") == count and run.count(b"\n") == count and b"\r\n" not in run:
        return run  # one space and one newline per FIN: every id is clean
    good = 0
    while good < count:
        message_id = run[good * _FIN_SIZE + _ID_START : good * _FIN_SIZE + _ID_END]
        if b" " in message_id or b"\n" in message_id or message_id.endswith(b"\r"):
            break
        good += 1
    return run[: good * _FIN_SIZE]


class MpubFormatError(ValueError):
    """An MPUB body is malformed; ``reason`` is "count" or "message", the text is nsqd's.
    ``elements`` are the messages read before the bad one (nsqd reads them one by one, so
    checks of its own on those come first)."""

    def __init__(self, reason: str, detail: str, elements: list[bytes] | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.elements = elements or []


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
    for index in range(count):
        if end < pos + 4:
            detail = f"MPUB failed to read message({index}) body size"
            raise MpubFormatError("message", detail, out)
        (size,) = _unpack_i32(body, pos)
        pos += 4
        if size <= 0:
            detail = f"MPUB invalid message({index}) body size {size}"
            raise MpubFormatError("message", detail, out)
        if size > max_msg_size:
            detail = f"MPUB message too big {size} > {max_msg_size}"
            raise MpubFormatError("message", detail, out)
        stop = pos + size
        if end < stop:
            raise MpubFormatError("message", "MPUB failed to read message body", out)
        append(body[pos:stop])
        pos = stop
    return out


def encode_response(data: bytes) -> bytes:
    return encode_frame(FRAME_TYPE_RESPONSE, data)


def encode_error(text: str | bytes) -> bytes:
    return encode_frame(FRAME_TYPE_ERROR, text.encode() if isinstance(text, str) else text)
