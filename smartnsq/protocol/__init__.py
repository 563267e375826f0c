"""Sans-IO NSQ protocol: command encoders, frame and message decoding, error registry,
stream compression and the server-side mirror. No asyncio, no sockets."""

from smartnsq.protocol import commands
from smartnsq.protocol.compression import DeflateCodec, SnappyCodec, StreamCodec
from smartnsq.protocol.errors import error_from_frame, is_fatal
from smartnsq.protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    Frame,
    FrameDecoder,
)
from smartnsq.protocol.identify import IdentifyRequest, IdentifyResponse
from smartnsq.protocol.message import MessageFrame, MessageLayout, decode_message
from smartnsq.protocol.responses import CLOSE_WAIT, HEARTBEAT, OK, AuthResponse, TraceReceipt

__all__ = [
    "CLOSE_WAIT",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "HEARTBEAT",
    "OK",
    "AuthResponse",
    "DeflateCodec",
    "Frame",
    "FrameDecoder",
    "IdentifyRequest",
    "IdentifyResponse",
    "MessageFrame",
    "MessageLayout",
    "SnappyCodec",
    "StreamCodec",
    "TraceReceipt",
    "commands",
    "decode_message",
    "error_from_frame",
    "is_fatal",
]
