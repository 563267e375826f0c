"""nsqd's side of IDENTIFY (protocol/server_session.py): what it sets and what it answers,
byte for byte against the recorded answers, and against the client's own session."""

from __future__ import annotations

import json
from typing import Any

import pytest

from smartnsq.protocol.compression import SnappyCodec
from smartnsq.protocol.identify import IdentifyRequest
from smartnsq.protocol.responses import OK
from smartnsq.protocol.server import encode_response
from smartnsq.protocol.server_session import (
    Peer,
    ServerFeatures,
    UpgradeConflict,
    negotiate,
)
from smartnsq.protocol.session import ClientSession
from smartnsq.protocol.session_events import Ready
from smartnsq.protocol.session_states import State
from tests.fixtures import command_bytes, server_frame, wire

YOUZAN = ServerFeatures(youzan=True, version="0.3.7-HA.1.13.0")
CLASSIC = ServerFeatures(youzan=False, version="1.3.0")


def _peer(features: ServerFeatures) -> Peer:
    return Peer.initial(youzan=features.youzan, heartbeat_interval=30.0, msg_timeout=60.0)


def _body(name: str) -> dict[str, Any]:
    """A recorded IDENTIFY's JSON (after ``IDENTIFY\\n`` and the size)."""
    parsed: dict[str, Any] = json.loads(command_bytes(name)[13:])
    return parsed


def test_the_recorded_youzan_answer_byte_for_byte() -> None:
    data = _body("identify_negotiation")
    peer = _peer(YOUZAN).identified(data, YOUZAN)
    assert (peer.client_id, peer.hostname, peer.user_agent) == (
        "probe",
        "probehost",
        "realnsq-probe/0.1",
    )
    negotiation = negotiate(data, peer, YOUZAN)
    assert negotiation.reply == server_frame("identify_response")[8:]
    assert (negotiation.tls, negotiation.snappy, negotiation.deflate) == (False, False, False)


def test_the_recorded_classic_answer() -> None:
    data = _body("identify_negotiation")
    negotiation = negotiate(data, _peer(CLASSIC).identified(data, CLASSIC), CLASSIC)
    assert json.loads(negotiation.reply) == wire()["classic"]["identify_response_json"]


def test_without_feature_negotiation_a_plain_ok() -> None:
    data = _body("identify_no_negotiation")
    negotiation = negotiate(data, _peer(YOUZAN).identified(data, YOUZAN), YOUZAN)
    assert (negotiation.reply, negotiation.negotiated) == (OK, False)
    assert server_frame("ok")[8:] == OK


@pytest.mark.parametrize(
    ("features", "data", "text"),
    [
        (YOUZAN, {"heartbeat_interval": 500}, "heartbeat interval (500) is invalid"),
        (YOUZAN, {"output_buffer_size": 63}, "output buffer size (63) is invalid"),
        (YOUZAN, {"output_buffer_timeout": 1001}, "output buffer timeout (1001) is invalid"),
        (CLASSIC, {"output_buffer_size": 65537}, "output buffer size (65537) is invalid"),
        (YOUZAN, {"sample_rate": 100}, "sample rate (100) is invalid"),
        (YOUZAN, {"msg_timeout": 999}, "msg timeout (999) is invalid"),
        (YOUZAN, {"desired_tag": "t" * 101}, "invalid tag len 101, exceed limit 100"),
        # the order of the checks: the heartbeat first, then the buffer (classic: timeout first)
        (YOUZAN, {"heartbeat_interval": 5, "sample_rate": 100}, "heartbeat interval (5)"),
        (
            CLASSIC,
            {"output_buffer_size": 1, "output_buffer_timeout": 40_000},
            "output buffer timeout (40000)",
        ),
    ],
)
def test_identify_refuses_as_nsqd_does(
    features: ServerFeatures, data: dict[str, Any], text: str
) -> None:
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
        _peer(features).identified(data, features)


def test_what_identify_sets() -> None:
    peer = _peer(YOUZAN)
    assert (peer.output_buffer_size, peer.output_buffer_timeout) == (100, 50)
    assert (_peer(CLASSIC).output_buffer_size, _peer(CLASSIC).output_buffer_timeout) == (
        16 * 1024,
        250,
    )
    peer = peer.identified(
        {
            "short_id": "old",
            "heartbeat_interval": -1,
            "output_buffer_size": 100_000,
            "output_buffer_timeout": 5,
            "desired_tag": "blue",
            "extend_support": True,
        },
        YOUZAN,
    )
    assert peer.client_id == "old"  # youzan still reads the deprecated names
    assert peer.heartbeat_interval == 0.0
    assert (peer.output_buffer_size, peer.output_buffer_timeout) == (64 * 1024, 10)
    assert peer.buffer_size_chosen
    again = peer.identified({"desired_tag": "", "extend_support": False}, YOUZAN)
    assert (again.desired_tag, again.extend_support) == ("blue", True)  # kept
    classic = _peer(CLASSIC).identified({"output_buffer_size": -1}, CLASSIC)
    assert (classic.output_buffer_size, classic.output_buffer_timeout) == (1, 0)


@pytest.mark.parametrize(
    ("features", "data", "level"),
    [
        (YOUZAN, {"deflate": True}, 0),  # youzan's missing-level bug: 0, a stored stream
        (YOUZAN, {"deflate": True, "deflate_level": 9}, 6),
        (CLASSIC, {"deflate": True}, 6),
        (CLASSIC, {}, 6),
    ],
)
def test_the_deflate_level(features: ServerFeatures, data: dict[str, Any], level: int) -> None:
    data = {"feature_negotiation": True, **data}
    negotiation = negotiate(data, _peer(features), features)
    assert negotiation.deflate_level == level
    assert json.loads(negotiation.reply)["deflate_level"] == level


def test_upgrades_need_the_server_to_offer_them() -> None:
    data = {"feature_negotiation": True, "tls_v1": True, "snappy": True}
    negotiation = negotiate(data, _peer(YOUZAN), YOUZAN)
    assert not negotiation.tls  # no certificate configured
    assert negotiation.snappy
    offered = ServerFeatures(youzan=True, version="v", tls=True, snappy=False)
    negotiation = negotiate(data, _peer(offered), offered)
    assert negotiation.tls
    assert not negotiation.snappy
    with pytest.raises(UpgradeConflict, match="cannot enable both deflate and snappy"):
        negotiate(
            {"feature_negotiation": True, "snappy": True, "deflate": True}, _peer(YOUZAN), YOUZAN
        )


def test_the_client_session_and_the_server_side_agree() -> None:
    """The client's IDENTIFY, negotiated by the server side, and the answer fed back: the
    client is ready, with snappy on both sides."""
    answers: list[tuple[int, bytes]] = []
    client = ClientSession(
        IdentifyRequest(client_id="c", hostname="h", user_agent="u", snappy=True),
        on_response=lambda token, data: answers.append((token, data)),
    )
    sent = client.initiate()
    data = json.loads(sent[17:])
    peer = _peer(YOUZAN).identified(data, YOUZAN)
    assert (peer.client_id, peer.hostname, peer.user_agent) == ("c", "h", "u")
    negotiation = negotiate(data, peer, YOUZAN)
    assert negotiation.snappy
    server = SnappyCodec()
    events = client.receive_data(
        encode_response(negotiation.reply) + server.compress(encode_response(OK))
    )
    assert [type(event) for event in events] == [Ready]
    assert client.state is State.READY
    assert client.youzan
    assert client.compression == "SnappyCodec"
