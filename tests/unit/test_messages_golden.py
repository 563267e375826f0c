"""Message frames captured from real servers decode to exactly the recorded values."""

import json
from typing import Any

import pytest

from smartnsq.protocol.frames import FRAME_TYPE_MESSAGE, FrameDecoder
from smartnsq.protocol.message import (
    MessageFrame,
    MessageLayout,
    decode_message,
    encode_message_frame,
    partition_of_internal_id,
)
from tests.fixtures import wire

MESSAGES = wire()["messages"]


@pytest.mark.parametrize(
    "case", MESSAGES, ids=[f"{m['from']}:{m['expect']['body']}" for m in MESSAGES]
)
def test_decode_captured_message(case: dict[str, Any]) -> None:
    raw = bytes.fromhex(case["hex"])
    decoder = FrameDecoder()
    decoder.feed(raw)
    frame = decoder.next_frame()
    assert frame is not None
    frame_type, data = frame
    assert frame_type == FRAME_TYPE_MESSAGE
    assert decoder.next_frame() is None
    layout = MessageLayout(**case["layout"])
    msg = decode_message(data, layout, MessageFrame)
    exp = case["expect"]
    assert msg.timestamp == exp["timestamp"]
    assert msg.attempts == exp["attempts"]
    assert msg.id.hex() == exp["id_hex"]
    assert msg.internal_id == exp["internal_id"]
    assert msg.trace_id == exp["trace_id"]
    assert msg.body == exp["body"].encode()
    assert msg.offset == exp.get("offset")
    assert msg.raw_size == exp.get("raw_size")
    if layout.ext:
        assert msg.ext_version == exp["ext_version"]
        if exp["ext_version"]:
            assert msg.ext_raw == exp["ext"].encode()
            json.loads(msg.ext_raw)
        else:
            assert msg.ext_raw is None


@pytest.mark.parametrize(
    "case", MESSAGES, ids=[f"{m['from']}:{m['expect']['body']}" for m in MESSAGES]
)
def test_encode_reproduces_captured_frame(case: dict[str, Any]) -> None:
    """The server-side encoder writes the same bytes nsqd wrote."""
    exp = case["expect"]
    layout = case["layout"]
    ext_version = exp.get("ext_version") if layout["ext"] else None
    frame = encode_message_frame(
        exp["timestamp"],
        exp["attempts"],
        bytes.fromhex(exp["id_hex"]),
        exp["body"].encode(),
        ext_version=ext_version,
        ext_raw=exp.get("ext", "").encode(),
        offset=exp.get("offset"),
        raw_size=exp.get("raw_size"),
    )
    assert frame.hex() == case["hex"]


def test_youzan_ordered_id_carries_partition() -> None:
    ordered = [m for m in MESSAGES if m["from"] == "tcp_sub_ordered.txt"]
    for case in ordered:
        assert partition_of_internal_id(case["expect"]["internal_id"]) == 1  # otest partition 1


def test_truncated_message_is_a_protocol_error() -> None:
    from smartnsq.errors import ProtocolError

    raw = bytes.fromhex(MESSAGES[4]["hex"])[8:]  # an ordered message, detail block present
    with pytest.raises(ProtocolError):
        decode_message(raw[:20], MessageLayout.youzan(), MessageFrame)
    with pytest.raises(ProtocolError):
        decode_message(raw[:30], MessageLayout.youzan(detail=True), MessageFrame)
