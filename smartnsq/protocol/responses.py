"""Payloads of response frames (frame type 0): OK, heartbeat, CLOSE_WAIT, trace receipts,
AUTH answers. IDENTIFY answers are in ``protocol.identify``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from smartnsq.errors import ProtocolError

__all__ = [
    "CLOSE_WAIT",
    "HEARTBEAT",
    "OK",
    "TRACE_RECEIPT_SIZE",
    "AuthResponse",
    "TraceReceipt",
]

OK = b"OK"
HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"

TRACE_RECEIPT_SIZE = 30
_receipt = struct.Struct(">2sQQQI")


@dataclass(frozen=True)
class TraceReceipt:
    """The 30-byte answer to PUB_TRACE, MPUB_TRACE and PUB_EXT with ``##trace_id``.

    For MPUB_TRACE it describes the batch: the first message's id and offset, trace id 0 and
    the total size of the batch on disk.
    """

    internal_id: int
    trace_id: int
    offset: int
    size: int

    @classmethod
    def decode(cls, data: bytes) -> TraceReceipt:
        if len(data) != TRACE_RECEIPT_SIZE or data[:2] != OK:
            raise ProtocolError(f"not a trace receipt: {data[:40]!r}")
        _, internal_id, trace_id, offset, size = _receipt.unpack(data)
        return cls(internal_id, trace_id, offset, size)

    def encode(self) -> bytes:
        return _receipt.pack(OK, self.internal_id, self.trace_id, self.offset, self.size)


@dataclass(frozen=True)
class AuthResponse:
    """nsqd's answer to AUTH."""

    identity: str
    identity_url: str
    permission_count: int

    @classmethod
    def decode(cls, data: bytes) -> AuthResponse:
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise ProtocolError(f"AUTH answer is not JSON: {data[:80]!r}") from exc
        if not isinstance(obj, dict):
            raise ProtocolError(f"AUTH answer is not a JSON object: {data[:80]!r}")
        return cls(
            identity=str(obj.get("identity", "")),
            identity_url=str(obj.get("identity_url", "")),
            permission_count=int(obj.get("permission_count", 0)),
        )

    def encode(self) -> bytes:
        return json.dumps(
            {
                "identity": self.identity,
                "identity_url": self.identity_url,
                "permission_count": self.permission_count,
            },
            separators=(",", ":"),
        ).encode()
