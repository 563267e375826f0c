"""How the embedded nsqd answers malformed and refused commands: every check of the servers'
protocol_v2.go (youzan nsqd 0.3.7-HA and classic nsqd 1.x), with its code, text and
fatality, in the servers' order.

Texts come from the captures where they were recorded (test_cluster_tcp_conformance.py
replays those exchanges) and otherwise from the servers' source. Node numbers follow the
youzan fixture (conftest.py): node 1 leads ptest-0 and etest-0, node 2 is their replica, node
0 leads otest-1 and is a replica of otest-0, node 3 leads ptest-1.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from smartnsq.protocol import commands as c
from smartnsq.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, Frame
from smartnsq.protocol.message import MessageLayout
from smartnsq.protocol.responses import TraceReceipt
from smartnsq.testing import Cluster
from smartnsq.testing.tls import self_signed_contexts
from tests.integration.rawclient import RawClient, identify_json

OK = b"OK"
OK_FRAME = Frame(FRAME_TYPE_RESPONSE, OK)
YOUZAN = MessageLayout.youzan()
IDENTIFY = {"client_id": "probe", "heartbeat_interval": 30000, "feature_negotiation": True}
# A message id whose internal id (first 8 bytes) is positive and unknown to every channel.
UNKNOWN_ID = b"0123456789abcdef"
_UNKNOWN_SHOWN = "[" + " ".join(str(b) for b in UNKNOWN_ID) + "]"
SIX_MIB = 6 * 1024 * 1024
# Answered on every youzan node, never fatal: shows the connection is still open.
YOUZAN_PROBE = (
    b"INTERNAL_CREATE_TOPIC probe 0\n",
    b"E_CREATE_TOPIC_FAILED CREATE_TOPIC is not allowed here while cluster feature enabled.",
)
CLASSIC_PROBE = (c.pub("probe", b"alive"), OK)


def _body(line: bytes, body: bytes) -> bytes:
    return line + struct.pack(">i", len(body)) + body


def _size_only(line: bytes, size: int) -> bytes:
    """A body command whose size field is out of range: nsqd answers before any body."""
    return line + struct.pack(">i", size)


def _ext(header: bytes, payload: bytes = b"x") -> bytes:
    return struct.pack(">H", len(header)) + header + payload


def _mpub(elements: list[bytes], count: int | None = None) -> bytes:
    parts = [struct.pack(">i", len(elements) if count is None else count)]
    for element in elements:
        parts += [struct.pack(">i", len(element)), element]
    return b"".join(parts)


def _identify(**data: Any) -> bytes:
    return c.identify({**IDENTIFY, **data})


@dataclass(frozen=True)
class Case:
    """One command and nsqd's answer: ``answer`` is the error frame's text, or OK."""

    name: str
    send: bytes
    answer: bytes
    fatal: bool = True
    node: int = 1
    identify: dict[str, Any] | None = field(default_factory=dict)  # None: no IDENTIFY
    setup: tuple[bytes, ...] = ()  # commands answered OK first (SUB...)


def _bad_json_header(tail: str) -> bytes:
    return f"E_INVALID_JSON_HEADER fail to parse json header:cannot parse JSON: {tail}".encode()


EMPTY_JSON = _bad_json_header('cannot parse empty string; unparsed tail: ""')
SUB_PTEST = c.sub("ptest", "ch", 0)

YOUZAN_CASES = [
    # ---------------------------------------------------------------- Exec
    Case("unknown command", b"FOO a b\n", b"E_INVALID invalid command [[70 79 79] [97] [98]]"),
    Case("empty line", b"\n", b"E_INVALID invalid command [[]]"),
    # ---------------------------------------------------------------- IDENTIFY
    Case("IDENTIFY twice", _identify(), b"json", fatal=False),
    Case("IDENTIFY without negotiation, twice", c.identify({}), OK, fatal=False),
    Case("IDENTIFY null body", _body(b"IDENTIFY\n", b"null"), OK, fatal=False),
    Case(
        "IDENTIFY after SUB",
        _identify(),
        b"E_INVALID cannot IDENTIFY in current state",
        setup=(SUB_PTEST,),
    ),
    Case(
        "IDENTIFY empty body",
        _size_only(b"IDENTIFY\n", 0),
        b"E_BAD_BODY IDENTIFY invalid body size 0",
        identify=None,
    ),
    Case(
        "IDENTIFY body too big",
        _size_only(b"IDENTIFY\n", SIX_MIB),
        b"E_BAD_BODY IDENTIFY body too big 6291456 > 5242880",
        identify=None,
    ),
    Case(
        "IDENTIFY not JSON",
        _body(b"IDENTIFY\n", b"{nope"),
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        identify=None,
    ),
    Case(
        "IDENTIFY not an object",
        _body(b"IDENTIFY\n", b"[1]"),
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        identify=None,
    ),
    Case(
        "IDENTIFY wrong type",
        _identify(heartbeat_interval="30000"),
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        identify=None,
    ),
    Case(
        "IDENTIFY float for an int",
        _identify(msg_timeout=60000.0),
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        identify=None,
    ),
    Case(
        "IDENTIFY heartbeat interval",
        _identify(heartbeat_interval=500),
        b"E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid",
        identify=None,
    ),
    Case(
        "IDENTIFY output buffer size",
        _identify(output_buffer_size=10),
        b"E_BAD_BODY IDENTIFY output buffer size (10) is invalid",
        identify=None,
    ),
    Case(
        "IDENTIFY output buffer timeout",
        _identify(output_buffer_timeout=1001),
        b"E_BAD_BODY IDENTIFY output buffer timeout (1001) is invalid",
        identify=None,
    ),
    Case(
        "IDENTIFY sample rate",
        _identify(sample_rate=100),
        b"E_BAD_BODY IDENTIFY sample rate (100) is invalid",
        identify=None,
    ),
    Case(
        "IDENTIFY msg timeout",
        _identify(msg_timeout=999),
        b"E_BAD_BODY IDENTIFY msg timeout (999) is invalid",
        identify=None,
    ),
    Case(
        "IDENTIFY desired tag",
        _identify(desired_tag="t" * 101),
        b"E_BAD_BODY IDENTIFY invalid tag len 101, exceed limit 100",
        identify=None,
    ),
    Case(
        "IDENTIFY snappy and deflate",
        _identify(snappy=True, deflate=True, deflate_level=1),
        b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
        identify=None,
    ),
    # ---------------------------------------------------------------- AUTH (not configured)
    Case("AUTH disabled", _body(b"AUTH\n", b"secret"), b"E_AUTH_DISABLED AUTH Disabled"),
    Case(
        "AUTH disabled, before IDENTIFY",
        _body(b"AUTH\n", b"secret"),
        b"E_AUTH_DISABLED AUTH Disabled",
        identify=None,
    ),
    Case(
        "AUTH with a parameter",
        _body(b"AUTH x\n", b"secret"),
        b"E_INVALID AUTH invalid number of parameters",
    ),
    Case("AUTH empty body", _size_only(b"AUTH\n", 0), b"E_BAD_BODY AUTH invalid body size 0"),
    Case(
        "AUTH after SUB",
        _body(b"AUTH\n", b"secret"),
        b"E_INVALID cannot AUTH in current state",
        setup=(SUB_PTEST,),
    ),
    # ---------------------------------------------------------------- SUB family
    Case(
        "SUB twice",
        c.sub("ptest", "other", 0),
        b"E_INVALID cannot SUB in current state",
        setup=(SUB_PTEST,),
    ),
    Case(
        "SUB_ORDERED after SUB",
        c.sub_ordered("ptest", "other", 0),
        b"E_INVALID cannot SUB in current state",
        setup=(SUB_PTEST,),
    ),
    Case("SUB one word", b"SUB ptest\n", b"E_INVALID SUB insufficient number of parameters"),
    Case(
        "SUB_ADVANCED bad topic",
        b"SUB_ADVANCED bad!t ch 0\n",
        b'E_BAD_TOPIC SUB topic name "bad!t" is not valid',
    ),
    Case(
        "SUB_ORDERED bad channel",
        b"SUB_ORDERED otest bad!c 1\n",
        b'E_BAD_CHANNEL SUB channel name "bad!c" is not valid',
        node=0,
    ),
    Case(
        "SUB bad partition",
        b"SUB ptest ch x1\n",
        b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x1": invalid syntax',
    ),
    Case(
        "SUB partition out of int64",
        b"SUB ptest ch 99999999999999999999\n",
        b"E_BAD_PARTITION topic partition is not valid: strconv.Atoi: "
        b'parsing "99999999999999999999": value out of range',
    ),
    Case("SUB partition -1: the one this node leads", b"SUB ptest ch -1\n", OK, fatal=False),
    Case("SUB partition -2", b"SUB ptest ch -2\n", b"E_TOPIC_NOT_EXIST "),
    Case("SUB no partition, replica only", b"SUB ptest ch\n", b"E_TOPIC_NOT_EXIST ", node=2),
    Case("SUB_ORDERED without partition", b"SUB_ORDERED otest ch\n", OK, fatal=False, node=0),
    Case(
        "SUB on an ordered topic's replica: order checked before leadership",
        c.sub("otest", "ch", 0),
        b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub",
        node=0,
    ),
    Case(
        "SUB on an ext topic's replica: ext checked before leadership",
        c.sub("etest", "ch", 0),
        b"E_SUB_EXTEND_NEED this topic is extended and should identify as extend support.",
        node=2,
    ),
    Case(
        "SUB_ORDERED with a sample rate",
        c.sub_ordered("otest", "ch", 1),
        b"E_INVALID order consume is not allowed while sample rate is not 0",
        node=0,
        identify={"sample_rate": 5},
    ),
    Case(
        "SUB_ADVANCED unknown position type",
        b"SUB_ADVANCED ptest ch 0 offset:1\n",
        b"E_INVALID invalid consume offset:offset:1",
    ),
    Case(
        "SUB_ADVANCED position without a value",
        b"SUB_ADVANCED ptest ch 0 msgcount\n",
        b"E_INVALID invalid consume offset:msgcount",
    ),
    Case(
        "SUB_ADVANCED position not a number",
        b"SUB_ADVANCED ptest ch 0 msgcount:x\n",
        b'E_INVALID strconv.ParseInt: parsing "x": invalid syntax',
    ),
    Case(
        "SUB_ADVANCED position parsed before the state",
        b"SUB_ADVANCED ptest ch 0 msgcount:x\n",
        b'E_INVALID strconv.ParseInt: parsing "x": invalid syntax',
        setup=(SUB_PTEST,),
    ),
    Case(
        "SUB_ADVANCED special other than -1",
        b"SUB_ADVANCED ptest ch 0 special:5\n",
        b"E_INVALID not supported offset type",
    ),
    # ---------------------------------------------------------------- PUB family
    Case("PUB no topic", _body(b"PUB\n", b"x"), b"E_INVALID insufficient number of parameters"),
    Case("PUB invalid topic name", _body(b"PUB bad!t 0\n", b"x"), b"E_TOPIC_NOT_EXIST "),
    Case(
        "PUB bad partition before the body",
        _size_only(b"PUB ptest x\n", 0),
        b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax',
    ),
    Case("PUB partition -1", _body(b"PUB ptest -1\n", b"x"), OK, fatal=False),
    Case("PUB partition -2", _body(b"PUB ptest -2\n", b"x"), b"E_TOPIC_NOT_EXIST "),
    Case("PUB a fourth word", _body(b"PUB ptest 0 x\n", b"x"), OK, fatal=False),
    Case("PUB no partition, replica only", c.pub("ptest", b"x"), b"E_TOPIC_NOT_EXIST ", node=2),
    Case(
        "MPUB no partition, replica only",
        c.mpub("ptest", [b"x"]),
        b"E_TOPIC_NOT_EXIST ",
        node=2,
    ),
    Case(
        "PUB body checked before the topic",
        _size_only(b"PUB no_such_topic 0\n", 0),
        b"E_BAD_BODY invalid body size 0",
    ),
    Case(
        "PUB message too big",
        _size_only(b"PUB ptest 0\n", SIX_MIB),
        b"E_BAD_MESSAGE message too big 6291456 > 1048576",
    ),
    Case(
        "PUB_EXT message too big",
        _size_only(b"PUB_EXT etest 0\n", SIX_MIB),
        b"E_BAD_MESSAGE message too big 6291456 > 1048576",
    ),
    Case(
        "MPUB body too big",
        _size_only(b"MPUB ptest 0\n", SIX_MIB),
        b"E_BAD_BODY body too big 6291456 > 5242880",
    ),
    Case(
        "PUB_TRACE body too short",
        _body(b"PUB_TRACE ptest 0\n", b"12345678"),
        b"E_BAD_BODY invalid body size 8 with trace id enabled",
    ),
    Case(
        "PUB_EXT empty header, ext topic",
        _body(b"PUB_EXT etest 0\n", _ext(b"")),
        EMPTY_JSON,
        fatal=False,
    ),
    Case(
        "PUB_EXT empty header, plain topic",
        _body(b"PUB_EXT ptest 0\n", _ext(b"")),
        EMPTY_JSON,
        fatal=False,
    ),
    Case(
        "PUB_EXT bad header, plain topic: parsed before the topic's ext check",
        _body(b"PUB_EXT ptest 0\n", _ext(b"{")),
        _bad_json_header("cannot parse object: missing '}'; unparsed tail: \"\""),
        fatal=False,
    ),
    Case(
        "PUB_EXT bad header on a replica: parsed before the write",
        _body(b"PUB_EXT etest 0\n", _ext(b"")),
        EMPTY_JSON,
        fatal=False,
        node=2,
    ),
    Case(
        "PUB_EXT valid header on a replica",
        c.pub_ext("etest", b"x", {"k": "v"}, 0),
        b"E_FAILED_ON_NOT_LEADER ",
        fatal=False,
        node=2,
    ),
    Case(
        "PUB_EXT any JSON value is a header",
        _body(b"PUB_EXT etest 0\n", _ext(b"[1]")),
        OK,
        fatal=False,
    ),
    Case(
        "PUB_EXT body of 2 bytes",
        _body(b"PUB_EXT etest 0\n", b"\x00\x00"),
        b"E_BAD_BODY invalid body size 2 with ext json header enabled",
    ),
    Case(
        "PUB_EXT header longer than the body",
        _body(b"PUB_EXT etest 0\n", b"\x00\x03{}x"),
        b"E_BAD_BODY invalid body size 5 in ext json header content length",
    ),
    Case(
        "PUB_EXT trace id not a string",
        _body(b"PUB_EXT etest 0\n", _ext(b'{"##trace_id":12}')),
        b"INVALID_TRACE_ID passin trace id should be string",
        fatal=False,
    ),
    Case(
        "PUB_EXT trace id not decimal",
        _body(b"PUB_EXT etest 0\n", _ext(b'{"##trace_id":"0x1"}')),
        b"INVALID_TRACE_ID invalid trace id",
        fatal=False,
    ),
    Case(
        "PUB_EXT trace id before the topic's ext check",
        _body(b"PUB_EXT ptest 0\n", _ext(b'{"##trace_id":"x"}')),
        b"INVALID_TRACE_ID invalid trace id",
        fatal=False,
    ),
    Case(
        "MPUB invalid count",
        _body(b"MPUB ptest 0\n", _mpub([], count=0)),
        b"E_BAD_BODY MPUB invalid message count 0",
    ),
    Case(
        "MPUB empty message",
        _body(b"MPUB ptest 0\n", _mpub([b"a", b""])),
        b"E_BAD_MESSAGE MPUB invalid message(1) body size 0",
    ),
    Case(
        "MPUB truncated",
        _body(b"MPUB ptest 0\n", _mpub([b"a", b"b"])[:-3]),
        b"E_BAD_MESSAGE MPUB failed to read message(1) body size",
    ),
    Case(
        "MPUB bad message on a replica: read before the leader check",
        _body(b"MPUB ptest 0\n", _mpub([b""])),
        b"E_BAD_MESSAGE MPUB invalid message(0) body size 0",
        node=2,
    ),
    Case(
        "MPUB_TRACE message too short",
        _body(b"MPUB_TRACE ptest 0\n", _mpub([b"123456789", b"12345678"])),
        b"E_BAD_MESSAGE MPUB invalid message(1) body size 8 for tracing",
    ),
    Case(
        "MPUB_EXT without headers, plain topic",
        _body(b"MPUB_EXT ptest 0\n", _mpub([_ext(b""), _ext(b"")])),
        OK,
        fatal=False,
    ),
    Case(
        "MPUB_EXT a header, plain topic",
        _body(b"MPUB_EXT ptest 0\n", _mpub([_ext(b""), _ext(b"{}")])),
        b"E_EXT_NOT_SUPPORT ext content not supported in topic ptest",
        fatal=False,
    ),
    Case(
        "MPUB_EXT bad header",
        _body(b"MPUB_EXT etest 0\n", _mpub([_ext(b"{}"), _ext(b"{")])),
        _bad_json_header("cannot parse object: missing '}'; unparsed tail: \"\""),
        fatal=False,
    ),
    Case(
        "MPUB_EXT header longer than its message",
        _body(b"MPUB_EXT etest 0\n", _mpub([b"\x00\x05{}"])),
        b"E_BAD_BODY invalid body size 4 in ext json header content length",
    ),
    Case(
        "MPUB_EXT errors in message order",
        _body(b"MPUB_EXT etest 0\n", _mpub([_ext(b"{"), b""])),
        _bad_json_header("cannot parse object: missing '}'; unparsed tail: \"\""),
        fatal=False,
    ),
    # ---------------------------------------------------------------- consumer commands
    Case("RDY before SUB", c.rdy(1), b"E_INVALID cannot RDY in current state"),
    Case(
        "RDY not a number",
        b"RDY x\n",
        b"E_INVALID RDY could not parse count x",
        setup=(SUB_PTEST,),
    ),
    Case(
        "RDY with a sign",
        b"RDY +1\n",
        b"E_INVALID RDY could not parse count +1",
        setup=(SUB_PTEST,),
    ),
    Case("FIN before SUB", c.fin(UNKNOWN_ID), b"E_INVALID cannot FIN in current state"),
    Case(
        "FIN internal id 0",
        c.fin(bytes(16)),
        b"E_INVALID Invalid Message ID",
        setup=(SUB_PTEST,),
    ),
    Case(
        "FIN unknown id",
        c.fin(UNKNOWN_ID),
        f"E_FIN_FAILED FIN {_UNKNOWN_SHOWN} failed ErrType:7 ErrCode:0 : "
        "Message ID not in flight".encode(),
        fatal=False,
        setup=(SUB_PTEST,),
    ),
    Case(
        "REQ without timeout",
        b"REQ " + UNKNOWN_ID + b"\n",
        b"E_INVALID REQ insufficient number of params",
        setup=(SUB_PTEST,),
    ),
    Case(
        "REQ timeout not a number (youzan also prints the raw id)",
        b"REQ " + UNKNOWN_ID + b" -5\n",
        b"E_INVALID REQ could not parse timeout " + UNKNOWN_ID + b", -5",
        setup=(SUB_PTEST,),
    ),
    Case(
        "REQ unknown id",
        c.req(UNKNOWN_ID, 0),
        f"E_REQ_FAILED REQ {_UNKNOWN_SHOWN} failed ErrType:7 ErrCode:0 : "
        "Message ID not in flight".encode(),
        fatal=False,
        setup=(SUB_PTEST,),
    ),
    Case(
        "REQ with a delay, ordered channel: ignored, known id or not",
        c.req(UNKNOWN_ID, 1000),
        b"",
        fatal=False,
        node=0,
        setup=(c.sub_ordered("otest", "ch", 1),),
    ),
    Case("TOUCH before SUB", c.touch(UNKNOWN_ID), b"E_INVALID cannot TOUCH in current state"),
    Case("CLS before SUB", c.cls(), b"E_INVALID cannot CLS in current state"),
    Case(
        "CLS twice",
        c.cls(),
        b"E_INVALID cannot CLS in current state",
        setup=(SUB_PTEST, c.cls()),
    ),
    Case("RDY after CLS: ignored", c.rdy(5), b"", fatal=False, setup=(SUB_PTEST, c.cls())),
    Case(
        "FIN after CLS",
        c.fin(UNKNOWN_ID),
        f"E_FIN_FAILED FIN {_UNKNOWN_SHOWN} failed ErrType:7 ErrCode:0 : "
        "Message ID not in flight".encode(),
        fatal=False,
        setup=(SUB_PTEST, c.cls()),
    ),
    # ---------------------------------------------------------------- INTERNAL_CREATE_TOPIC
    Case(
        "INTERNAL_CREATE_TOPIC in a cluster",
        b"INTERNAL_CREATE_TOPIC t 0 true\n",
        YOUZAN_PROBE[1],
        fatal=False,
        identify=None,
    ),
    Case(
        "INTERNAL_CREATE_TOPIC one word",
        b"INTERNAL_CREATE_TOPIC t\n",
        b"E_INVALID CREATE_TOPIC insufficient number of parameters",
    ),
    Case(
        "INTERNAL_CREATE_TOPIC bad topic",
        b"INTERNAL_CREATE_TOPIC bad! 0\n",
        b'E_BAD_TOPIC topic name "bad!" is not valid',
    ),
    Case(
        "INTERNAL_CREATE_TOPIC negative partition",
        b"INTERNAL_CREATE_TOPIC t -1\n",
        b"E_BAD_PARTITION partition should not less than 0",
    ),
    Case(
        "INTERNAL_CREATE_TOPIC bad ext flag",
        b"INTERNAL_CREATE_TOPIC t 0 maybe\n",
        b'E_BAD_EXT topic ext is not valid: strconv.ParseBool: parsing "maybe": invalid syntax',
    ),
]

CLASSIC_CASES = [
    Case("unknown command", b"FOO a\n", b"E_INVALID invalid command FOO", node=0),
    Case(
        "youzan command",
        c.sub_ordered("t", "c", 0),
        b"E_INVALID invalid command SUB_ORDERED",
        node=0,
    ),
    Case(
        "PUB no topic",
        _body(b"PUB\n", b"x"),
        b"E_INVALID PUB insufficient number of parameters",
        node=0,
    ),
    Case(
        "PUB empty body",
        _size_only(b"PUB t\n", 0),
        b"E_BAD_MESSAGE PUB invalid message body size 0",
        node=0,
    ),
    Case(
        "PUB too big",
        _size_only(b"PUB t\n", SIX_MIB),
        b"E_BAD_MESSAGE PUB message too big 6291456 > 1048576",
        node=0,
    ),
    Case("PUB with a partition: ignored", c.pub("t", b"x", 3), OK, fatal=False, node=0),
    Case(
        "MPUB bad topic (nsqd repeats the code)",
        _body(b"MPUB bad!\n", _mpub([b"x"])),
        b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad!" is not valid',
        node=0,
    ),
    Case(
        "MPUB empty body",
        _size_only(b"MPUB t\n", 0),
        b"E_BAD_BODY MPUB invalid body size 0",
        node=0,
    ),
    Case(
        "MPUB too big",
        _size_only(b"MPUB t\n", SIX_MIB),
        b"E_BAD_BODY MPUB body too big 6291456 > 5242880",
        node=0,
    ),
    Case(
        "MPUB invalid count",
        _body(b"MPUB t\n", _mpub([], count=0)),
        b"E_BAD_BODY MPUB invalid message count 0",
        node=0,
    ),
    Case(
        "DPUB no timeout",
        _body(b"DPUB t\n", b"x"),
        b"E_INVALID DPUB insufficient number of parameters",
        node=0,
    ),
    Case(
        "DPUB bad topic",
        _body(b"DPUB bad! 1\n", b"x"),
        b'E_BAD_TOPIC DPUB topic name "bad!" is not valid',
        node=0,
    ),
    Case(
        "DPUB negative timeout",
        _body(b"DPUB t -5\n", b"x"),
        b"E_INVALID DPUB could not parse timeout -5",
        node=0,
    ),
    Case(
        "DPUB timeout out of range",
        _body(b"DPUB t 3600001\n", b"x"),
        b"E_INVALID DPUB timeout 3600001 out of range 0-3600000",
        node=0,
    ),
    Case(
        "DPUB empty body",
        _size_only(b"DPUB t 5\n", 0),
        b"E_BAD_MESSAGE DPUB invalid message body size 0",
        node=0,
    ),
    Case(
        "IDENTIFY output buffer size above the maximum",
        _identify(output_buffer_size=65537),
        b"E_BAD_BODY IDENTIFY output buffer size (65537) is invalid",
        node=0,
        identify=None,
    ),
    Case(
        "IDENTIFY output buffer timeout checked first",
        _identify(output_buffer_size=1, output_buffer_timeout=30001),
        b"E_BAD_BODY IDENTIFY output buffer timeout (30001) is invalid",
        node=0,
        identify=None,
    ),
    Case(
        "IDENTIFY desired tag: not a classic field",
        _identify(desired_tag="t" * 101),
        b"json",
        fatal=False,
        node=0,
        identify=None,
    ),
    Case("AUTH disabled", _body(b"AUTH\n", b"s"), b"E_AUTH_DISABLED AUTH Disabled", node=0),
    Case(
        "FIN id not 16 bytes",
        b"FIN 0123\n",
        b"E_INVALID invalid message ID",
        node=0,
        setup=(c.sub("t", "c"),),
    ),
    Case(
        "REQ timeout not a number",
        b"REQ 0123456789abcdef x\n",
        b"E_INVALID REQ could not parse timeout x",
        node=0,
        setup=(c.sub("t", "c"),),
    ),
    Case(
        "REQ delay above the maximum: clamped",
        c.req(UNKNOWN_ID, 4_000_000),
        b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight",
        fatal=False,
        node=0,
        setup=(c.sub("t", "c"),),
    ),
]


async def _check(cluster: Cluster, case: Case, probe: tuple[bytes, bytes]) -> None:
    client = await RawClient.connect(cluster.nsqd_addresses[case.node])
    try:
        if case.identify is not None:
            frame = await client.request(_identify(**case.identify))
            assert frame.type == FRAME_TYPE_RESPONSE, frame
        for command in case.setup:
            frame = await client.request(command)
            assert frame.type == FRAME_TYPE_RESPONSE, (command, frame)
        client.send(case.send)
        if case.answer == b"json":
            assert identify_json(await client.frame())["version"]
        elif case.answer:
            frame = await client.frame()
            kind = FRAME_TYPE_RESPONSE if case.answer == OK else FRAME_TYPE_ERROR
            assert frame == Frame(kind, case.answer), frame
        if case.fatal:
            assert await client.closed()
        else:
            frame = await client.request(probe[0])
            assert frame.data == probe[1], frame  # still open, nothing else was sent
    finally:
        await client.close()


@pytest.mark.parametrize("case", YOUZAN_CASES, ids=lambda case: case.name)
async def test_youzan_answers(youzan: Cluster, case: Case) -> None:
    await _check(youzan, case, YOUZAN_PROBE)


@pytest.mark.parametrize("case", CLASSIC_CASES, ids=lambda case: case.name)
async def test_classic_answers(classic: Cluster, case: Case) -> None:
    await _check(classic, case, CLASSIC_PROBE)


# --------------------------------------------------------------------------- beyond the table


async def test_sub_advanced_with_a_position_takes_the_default_partition() -> None:
    """internalSUB reads the partition only from a 4-word command: with a start position
    (5 words), nsqd subscribes to the partition it leads, whatever the third word says."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 2, 1, placement={0: [0], 1: [0]})
        producer = await RawClient.identified(cluster.nsqd_addresses[0])
        await producer.ok(c.pub("t", b"on partition 0", 0))
        await producer.ok(c.pub("t", b"on partition 1", 1))
        consumer = await RawClient.identified(cluster.nsqd_addresses[0])
        start = c.StartPosition.message_count(1)
        await consumer.ok(c.sub_advanced("t", "new", 1, start))
        consumer.send(c.rdy(5))
        message = await consumer.message(MessageLayout.youzan(detail=True))
        assert message.body == b"on partition 0"
        assert cluster.subscriber_rdy("t", "new", 0) == [5]
        assert cluster.subscriber_rdy("t", "new", 1) == []
        for client in (producer, consumer):
            await client.close()


async def test_a_desired_tag_is_dropped_on_a_topic_without_ext(youzan: Cluster) -> None:
    consumer = await RawClient.identified(youzan.nsqd_addresses[1], desired_tag="tagA")
    await consumer.ok(c.sub("ptest", "tagged", 0))
    consumer.send(c.rdy(1))
    producer = await RawClient.identified(youzan.nsqd_addresses[1])
    await producer.ok(c.pub("ptest", b"untagged", 0))
    assert (await consumer.message(YOUZAN)).body == b"untagged"
    for client in (producer, consumer):
        await client.close()


@pytest.mark.parametrize(
    ("flavour", "identify", "expected"),
    [
        ("youzan", {}, {"output_buffer_size": 100, "output_buffer_timeout": 50}),
        ("youzan", {"output_buffer_size": -1}, {"output_buffer_size": 1}),
        ("youzan", {"output_buffer_timeout": -1}, {"output_buffer_timeout": 0}),
        ("youzan", {"output_buffer_size": 100_000}, {"output_buffer_size": 65536}),
        ("youzan", {"output_buffer_timeout": 5}, {"output_buffer_timeout": 10}),
        ("youzan", {"deflate_level": 6}, {"deflate": False, "deflate_level": 0}),
        ("classic", {}, {"output_buffer_size": 16384, "output_buffer_timeout": 250}),
        (
            "classic",
            {"output_buffer_size": -1},
            {"output_buffer_size": 1, "output_buffer_timeout": 0},
        ),
        ("classic", {"output_buffer_timeout": 5000}, {"output_buffer_timeout": 5000}),
        ("classic", {"deflate_level": 3}, {"deflate": False, "deflate_level": 6}),
        ("classic", {"desired_tag": "t", "extend_support": True}, {"tls_v1": False}),
    ],
)
async def test_identify_answer_reports_the_settings_in_force(
    flavour: str, identify: dict[str, Any], expected: dict[str, Any]
) -> None:
    async with Cluster(classic=flavour == "classic") as cluster:
        client = await RawClient.connect(cluster.nsqd_addresses[0])
        reply = identify_json(await client.request(_identify(**identify)))
        assert {key: reply[key] for key in expected} == expected
        assert "desired_tag" not in reply
        await client.close()


async def test_no_upgrade_without_feature_negotiation(youzan: Cluster) -> None:
    client = await RawClient.connect(youzan.nsqd_addresses[1])
    plain = c.identify({"feature_negotiation": False, "snappy": True, "deflate": False})
    assert await client.request(plain) == OK_FRAME
    await client.ok(c.pub("ptest", b"in the clear", 0))  # no snappy stream was started
    await client.close()


@pytest.mark.parametrize("classic", [False, True])
async def test_auth_checks_order_and_texts(classic: bool) -> None:
    cluster = Cluster(classic=classic, nodes=1, auth_secrets={"s3cret": "svc"})
    async with cluster:
        if not classic:
            await cluster.create_topic("t", 1, 1, channels=["c"])
        address = cluster.nsqd_addresses[0]
        before = [
            (c.sub("t", "c", None if classic else 0), "SUB"),
            (c.pub("t", b"x", None if classic else 0), "PUB"),
            # youzan checks every publish as "PUB", classic names the command
            (c.mpub("t", [b"x"], None if classic else 0), "MPUB" if classic else "PUB"),
        ]
        if classic:
            before.append((c.dpub("t", b"x", 5), "DPUB"))
        else:
            before.append((b"INTERNAL_CREATE_TOPIC t 0\n", "CREATE_TOPIC"))
            # the topic partition is looked up before the auth check
            before.append((c.pub("no_such_topic", b"x", 0), "E_TOPIC_NOT_EXIST "))
        for command, name in before:
            client = await RawClient.identified(address)
            expected = (
                name if name.startswith("E_") else f"E_AUTH_FIRST AUTH required before {name}"
            )
            assert await client.error(command) == expected
            assert await client.closed()
        client = await RawClient.identified(address)
        assert await client.error(c.auth("wrong")) == "E_AUTH_FAILED AUTH failed"
        assert await client.closed()
        client = await RawClient.identified(address)
        answer = await client.request(c.auth("s3cret"))
        assert identify_json(answer) == {
            "identity": "svc",
            "identity_url": "",
            "permission_count": 1,
        }
        await client.ok(c.pub("t", b"authorised", None if classic else 0))
        assert await client.error(c.auth("s3cret")) == "E_INVALID AUTH Already set"
        assert await client.closed()


async def test_tls_required_answers_everything_but_identify_first(tmp_path: Path) -> None:
    server_ctx, _ = self_signed_contexts(tmp_path)
    async with Cluster(nodes=1, tls_context=server_ctx, tls_required=True) as cluster:
        for command, name in ((b"FOO\n", "FOO"), (_body(b"DPUB t 5\n", b"x"), "DPUB")):
            client = await RawClient.connect(cluster.nsqd_addresses[0])
            expected = f"E_INVALID cannot {name} in current state (TLS required)"
            assert await client.error(command) == expected
            assert await client.closed()


async def test_ext_compatible_nodes_drop_internal_headers_on_plain_topics() -> None:
    async with Cluster(nodes=1, allow_ext_compatible=True) as cluster:
        await cluster.create_topic("plain", 1, 1, channels=["c"])
        client = await RawClient.identified(cluster.nsqd_addresses[0])
        frame = await client.request(c.pub_ext("plain", b"traced", {"##trace_id": "77"}, 0))
        receipt = TraceReceipt.decode(frame.data)  # a receipt, as nsqd answers
        assert receipt.trace_id == 77
        await client.ok(c.pub_ext("plain", b"tested", {"zan_test": "true", "##k": "v"}, 0))
        mpub = c.mpub_ext("plain", [b"m1", b"m2"], [{"##k": "v"}, None], 0)
        await client.ok(mpub)
        text = await client.error(c.pub_ext("plain", b"x", {"k": "v"}, 0))
        assert text == "E_EXT_NOT_SUPPORT ext content not supported in topic plain"
        records = cluster.messages("plain")
        assert [(r.body, r.trace_id, r.ext_raw) for r in records] == [
            (b"traced", 77, b""),
            (b"tested", 0, b""),
            (b"m1", 0, b""),
            (b"m2", 0, b""),
        ]
        await client.close()


async def test_size_limits_include_trace_ids_and_ext_headers() -> None:
    """PUB_TRACE's and PUB_EXT's bodies count against max_msg_size whole, as do the elements
    of every MPUB variant."""
    async with Cluster(nodes=1, max_msg_size=100, max_body_size=1000) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        await cluster.create_topic("e", 1, 1, ext=True, channels=["c"])
        cases = [
            (_body(b"PUB_TRACE t 0\n", bytes(101)), "E_BAD_MESSAGE message too big 101 > 100"),
            (
                _body(b"PUB_EXT e 0\n", _ext(b"{}", bytes(97))),
                "E_BAD_MESSAGE message too big 101 > 100",
            ),
            (
                _body(b"MPUB t 0\n", _mpub([bytes(101)])),
                "E_BAD_MESSAGE MPUB message too big 101 > 100",
            ),
            (
                _body(b"MPUB_TRACE t 0\n", _mpub([bytes(101)])),
                "E_BAD_MESSAGE MPUB message too big 101 > 100",
            ),
            (_size_only(b"MPUB t 0\n", 1001), "E_BAD_BODY body too big 1001 > 1000"),
        ]
        for command, expected in cases:
            client = await RawClient.identified(cluster.nsqd_addresses[0])
            assert await client.error(command) == expected
            assert await client.closed()
        client = await RawClient.identified(cluster.nsqd_addresses[0])
        frame = await client.request(_body(b"PUB_TRACE t 0\n", bytes(100)))
        assert len(frame.data) == 30  # exactly the limit: accepted
        await client.close()
