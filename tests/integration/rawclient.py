"""A raw NSQ TCP client for testing the embedded cluster: sockets + the protocol floor only,
so the emulated servers are checked independently of smartnsq's client transport."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

from smartnsq.protocol import commands
from smartnsq.protocol.compression import StreamCodec
from smartnsq.protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    Frame,
    FrameDecoder,
)
from smartnsq.protocol.message import MessageFrame, MessageLayout, decode_message
from smartnsq.protocol.responses import HEARTBEAT

TIMEOUT = 5.0


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.skip_heartbeats = True
        self.codec: StreamCodec | None = None

    @classmethod
    async def connect(cls, address: str, *, magic: bool = True) -> RawClient:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), TIMEOUT)
        client = cls(reader, writer)
        if magic:
            client.send(commands.MAGIC_V2)
        return client

    @classmethod
    async def identified(cls, address: str, **identify: Any) -> RawClient:
        client = await cls.connect(address)
        data = {"client_id": "raw", "hostname": "raw", "feature_negotiation": True}
        data.update(identify)
        client.send(commands.identify(data))
        frame = await client.frame()
        assert frame.type == FRAME_TYPE_RESPONSE, frame
        return client

    def send(self, data: bytes) -> None:
        self.writer.write(self.codec.compress(data) if self.codec is not None else data)

    def compress_with(self, codec: StreamCodec) -> None:
        """The server switched the stream to ``codec`` right after its last frame."""
        self.codec = codec
        self.decoder.install_decompressor(codec.decompress)

    async def start_tls(self, context: ssl.SSLContext) -> None:
        await self.writer.start_tls(context, server_hostname="127.0.0.1")

    async def frame(self, timeout: float = TIMEOUT) -> Frame:
        async def _next() -> Frame:
            while True:
                decoded = self.decoder.next_frame()
                if decoded is not None:
                    frame = Frame(*decoded)
                    if self.skip_heartbeats and frame == Frame(FRAME_TYPE_RESPONSE, HEARTBEAT):
                        self.send(commands.NOP)
                        continue
                    return frame
                data = await self.reader.read(65536)
                if not data:
                    raise EOFError("connection closed")
                self.decoder.feed(data)

        return await asyncio.wait_for(_next(), timeout)

    async def request(self, data: bytes) -> Frame:
        self.send(data)
        return await self.frame()

    async def ok(self, data: bytes) -> None:
        frame = await self.request(data)
        assert frame == Frame(FRAME_TYPE_RESPONSE, b"OK"), frame

    async def error(self, data: bytes) -> str:
        frame = await self.request(data)
        assert frame.type == FRAME_TYPE_ERROR, frame
        return frame.data.decode()

    async def message(self, layout: MessageLayout, timeout: float = TIMEOUT) -> MessageFrame:
        frame = await self.frame(timeout)
        assert frame.type == FRAME_TYPE_MESSAGE, frame
        return decode_message(frame.data, layout, MessageFrame)

    async def closed(self, timeout: float = TIMEOUT) -> bool:
        """True once the server closed the connection (EOF or reset)."""
        try:
            while True:
                await self.frame(timeout)
        except (EOFError, ConnectionError):
            return True

    async def silent(self, duration: float = 0.2) -> bool:
        """True if nothing (but heartbeats) arrives for ``duration`` seconds."""
        try:
            await self.frame(duration)
        except TimeoutError:
            return True
        return False

    async def close(self) -> None:
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), TIMEOUT)
        except (TimeoutError, ConnectionError):
            pass


def identify_json(frame: Frame) -> dict[str, Any]:
    return json.loads(frame.data)
