"""Response frames: IDENTIFY answers, OK/heartbeat/CLOSE_WAIT, 30-byte trace receipts."""

from typing import Any

import pytest

from smartnsq.errors import ProtocolError
from smartnsq.protocol.frames import FRAME_TYPE_RESPONSE, FrameDecoder
from smartnsq.protocol.identify import IdentifyRequest, IdentifyResponse
from smartnsq.protocol.responses import CLOSE_WAIT, HEARTBEAT, OK, AuthResponse, TraceReceipt
from smartnsq.transport.config import ConnectionConfig
from tests.fixtures import server_frame, wire


def _payload(raw: bytes) -> bytes:
    decoder = FrameDecoder()
    decoder.feed(raw)
    frame = decoder.next_frame()
    assert frame is not None
    frame_type, data = frame
    assert frame_type == FRAME_TYPE_RESPONSE
    return data


def test_simple_responses() -> None:
    assert _payload(server_frame("ok")) == OK
    assert _payload(server_frame("heartbeat")) == HEARTBEAT
    assert _payload(server_frame("close_wait")) == CLOSE_WAIT


def test_identify_response_youzan() -> None:
    data = _payload(server_frame("identify_response"))
    resp = IdentifyResponse.decode(data)
    assert resp is not None
    assert resp.max_rdy_count == 2500
    assert resp.version == "0.3.7-HA.1.13.0"
    assert resp.is_youzan
    assert resp.deflate_level == 0  # the youzan default the protocol notes warn about
    assert resp.output_buffer_size == 100
    assert resp.output_buffer_timeout == 50
    assert (resp.tls_v1, resp.snappy, resp.deflate, resp.auth_required) == (False,) * 4
    # The server-side encoder writes the same JSON, key order included.
    assert resp.encode() == data


def test_identify_response_classic() -> None:
    import json

    data = json.dumps(wire()["classic"]["identify_response_json"], separators=(",", ":")).encode()
    resp = IdentifyResponse.decode(data)
    assert resp is not None
    assert not resp.is_youzan
    assert resp.deflate_level == 6
    assert resp.encode() == data


def test_identify_without_negotiation_is_plain_ok() -> None:
    assert IdentifyResponse.decode(OK) is None


def test_identify_response_rejects_garbage() -> None:
    with pytest.raises(ProtocolError):
        IdentifyResponse.decode(b"{not json")
    with pytest.raises(ProtocolError):
        IdentifyResponse.decode(b'{"max_rdy_count": "many"}')


@pytest.mark.parametrize("case", wire()["receipts"], ids=lambda c: c["from"])
def test_trace_receipts(case: dict[str, Any]) -> None:
    data = _payload(bytes.fromhex(case["hex"]))
    receipt = TraceReceipt.decode(data)
    assert receipt == TraceReceipt(
        case["internal_id"], case["trace_id"], case["offset"], case["size"]
    )
    assert receipt.encode() == data


def test_trace_receipt_must_be_30_bytes() -> None:
    with pytest.raises(ProtocolError):
        TraceReceipt.decode(OK)
    with pytest.raises(ProtocolError):
        TraceReceipt.decode(b"NO" + bytes(28))


def test_auth_response_round_trip() -> None:
    data = b'{"identity":"svc","identity_url":"http://auth","permission_count":3}'
    resp = AuthResponse.decode(data)
    assert resp == AuthResponse("svc", "http://auth", 3)
    assert AuthResponse.decode(resp.encode()) == resp
    with pytest.raises(ProtocolError):
        AuthResponse.decode(b"[]")


def test_identify_request_always_sends_deflate_level() -> None:
    req = IdentifyRequest("c", "h", "ua", deflate=True, deflate_level=3)
    assert req.to_json()["deflate_level"] == 3
    assert "deflate_level" not in IdentifyRequest("c", "h", "ua").to_json()


def test_identical_identify_answers_share_one_read_only_response() -> None:
    # every connection to one nsqd gets the same answer: one object, not one per connection
    data = b'{"max_rdy_count": 2500, "version": "0.3.7-HA.1.13.0", "msg_timeout": 60000}'
    first = IdentifyResponse.decode(data)
    assert first is not None
    assert IdentifyResponse.decode(bytes(bytearray(data))) is first
    assert IdentifyResponse.decode(data.replace(b"2500", b"2000")) is not first
    with pytest.raises(TypeError):
        first.raw["version"] = "changed"  # type: ignore[index]


def test_a_config_makes_and_encodes_its_identify_once() -> None:
    config = ConnectionConfig(client_id="c", hostname="h")
    request = config.identify_request(extend_support=True, desired_tag=None)
    assert config.identify_request(extend_support=True, desired_tag=None) is request
    assert config.identify_request(extend_support=None, desired_tag=None) is not request
    assert request.encoded is request.encoded
    assert request.encoded == request.encode()
