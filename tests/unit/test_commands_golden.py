"""Encoders produce exactly the bytes real clients sent to real servers (captures)."""

import json

import pytest

from smartnsq.protocol import commands as c
from smartnsq.protocol.server import CommandParser
from tests.fixtures import command_bytes

ID_22 = bytes.fromhex("00000000000000160000000000000000")
ID_23 = bytes.fromhex("00000000000000170000000000000000")
ID_ORDERED_TRACED = bytes.fromhex("00040000000000050000000000000063")
ID_EXT_TRACED = bytes.fromhex("00000000000000020000000000003039")


@pytest.mark.parametrize(
    ("name", "encoded"),
    [
        ("magic", c.MAGIC_V2),
        ("nop", c.nop()),
        ("cls", c.cls()),
        ("pub_ptest_0", c.pub("ptest", b"pub-with-partition", 0)),
        ("pub_ptest_no_partition", c.pub("ptest", "pub-no-partition")),
        ("pub_trace_ptest_0", c.pub_trace("ptest", b"pub-trace-body", 0x0102030405060708, 0)),
        ("mpub_ptest_0", c.mpub("ptest", [b"mp-1", b"mp-2"], 0)),
        ("mpub_trace_ptest_0", c.mpub_trace("ptest", [b"mt-1", b"mt-2"], [7, 8], 0)),
        ("mpub_ptest_0_single", c.mpub("ptest", [b"x"], 0)),
        ("dpub_ptest_1000", c.dpub("ptest", b"deferred", 1000)),
        ("sub_ptest_chsub_0", c.sub("ptest", "chsub", 0)),
        ("sub_ptest_chnopart", c.sub("ptest", "chnopart")),
        ("sub_ordered_otest_chord_1", c.sub_ordered("otest", "chord", 1)),
        (
            "sub_advanced_ptest_chadv_0_msgcount_0",
            # the wire form as captured (message_count() refuses 0)
            c.sub_advanced("ptest", "chadv", 0, c.StartPosition("msgcount", 0)),
        ),
        ("sub_etest_chext_0", c.sub("etest", "chext", 0)),
        ("rdy_1", c.rdy(1)),
        ("rdy_2", c.rdy(2)),
        ("rdy_3", c.rdy(3)),
        ("rdy_5", c.rdy(5)),
        ("touch_id_22", c.touch(ID_22)),
        ("req_id_22_0", c.req(ID_22, 0)),
        ("fin_id_23", c.fin(ID_23)),
        ("fin_otest_id_traced", c.fin(ID_ORDERED_TRACED)),
        ("fin_ext_id_traced", c.fin(ID_EXT_TRACED)),
        ("fin_hex_text_id", c.fin(b"0000000000000001")),
        ("pub_otest_1_ordered_0", c.pub("otest", b"ordered-0", 1)),
        ("pub_trace_otest_1", c.pub_trace("otest", b"ordered-traced", 99, 1)),
        ("pub_etest_0_plain", c.pub("etest", b"plain-on-ext", 0)),
        (
            "pub_ext_etest_0_trace",
            c.pub_ext("etest", b"ext-body-1", b'{"##trace_id": "12345", "k1": "v1"}', 0),
        ),
        (
            "pub_ext_etest_0_tag",
            c.pub_ext("etest", b"ext-body-2", b'{"k2": "v2", "##client_dispatch_tag": "tagA"}', 0),
        ),
        (
            "mpub_ext_etest_0",
            c.mpub_ext("etest", [b"mext-1", b"mext-2-nohdr"], [b'{"k3":"v3"}', None], 0),
        ),
    ],
)
def test_encoder_matches_capture(name: str, encoded: bytes) -> None:
    assert encoded == command_bytes(name)


def test_fin_req_touch_sizes_are_fixed() -> None:
    assert len(c.fin(ID_22)) == 21
    assert len(c.touch(ID_22)) == 23
    assert c.req(ID_22, 1500) == b"REQ " + ID_22 + b" 1500\n"


@pytest.mark.parametrize(
    "name", ["identify_negotiation", "identify_no_negotiation", "identify_extend_support"]
)
def test_identify_framing_matches_capture(name: str) -> None:
    captured = command_bytes(name)
    assert captured.startswith(b"IDENTIFY\n")
    obj = json.loads(captured[13:])
    ours = c.identify(obj)
    # Same framing; our JSON is compact, so compare what the server parses.
    assert ours[:9] == b"IDENTIFY\n"
    assert int.from_bytes(ours[9:13], "big") == len(ours) - 13
    parser = CommandParser()
    parser.feed(c.MAGIC_V2 + ours)
    cmd = parser.next_command()
    assert cmd is not None
    assert cmd.name == b"IDENTIFY"
    assert cmd.body is not None
    assert json.loads(cmd.body) == obj
