"""The server-side parser: fixed-offset ids, bodies, fragmentation, corrupt input."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import ProtocolError
from smartnsq.protocol import commands as c
from smartnsq.protocol.server import (
    CLASSIC_BODY_COMMANDS,
    ClientCommand,
    CommandParser,
    MpubFormatError,
    split_mpub,
)
from tests.fixtures import command_bytes

NASTY_ID = b"\n \n  \n\n\x00FIN \n\r\n1"


def _parse_all(stream: bytes, **kwargs: object) -> list[ClientCommand]:
    parser = CommandParser(**kwargs)  # type: ignore[arg-type]
    parser.feed(stream)
    out = []
    while (cmd := parser.next_command()) is not None:
        out.append(cmd)
    return out


def test_ids_with_newlines_and_spaces() -> None:
    stream = c.MAGIC_V2 + c.fin(NASTY_ID) + c.req(NASTY_ID, 250) + c.touch(NASTY_ID) + c.nop()
    cmds = _parse_all(stream)
    assert cmds == [
        ClientCommand(b"FIN", (NASTY_ID,)),
        ClientCommand(b"REQ", (NASTY_ID, b"250")),
        ClientCommand(b"TOUCH", (NASTY_ID,)),
        ClientCommand(b"NOP"),
    ]


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=10),
    body=st.binary(min_size=1, max_size=50),
    cuts=st.lists(st.integers(0, 5000), max_size=30),
)
def test_fragmented_stream(ids: list[bytes], body: bytes, cuts: list[int]) -> None:
    parts = [c.MAGIC_V2, c.identify({"client_id": "x"})]
    expected = [b"IDENTIFY"]
    for message_id in ids:
        parts += [c.pub("t", body, 3), c.fin(message_id), c.req(message_id, 7), c.rdy(10)]
        expected += [b"PUB", b"FIN", b"REQ", b"RDY"]
    stream = b"".join(parts)
    parser = CommandParser()
    points = sorted({x % (len(stream) + 1) for x in cuts})
    got: list[ClientCommand] = []
    last = 0
    for p in [*points, len(stream)]:
        parser.feed(stream[last:p])
        last = p
        while (cmd := parser.next_command()) is not None:
            got.append(cmd)
    assert [g.name for g in got] == expected
    assert [g.params[0] for g in got if g.name == b"FIN"] == ids
    assert all(g.body == body and g.params == (b"t", b"3") for g in got if g.name == b"PUB")


def test_bad_magic() -> None:
    parser = CommandParser()
    parser.feed(b"  V1PUB t\n")
    with pytest.raises(ProtocolError):
        parser.next_command()


def test_invalid_body_size_stops_parsing() -> None:
    stream = c.MAGIC_V2 + b"PUB t 0\n" + struct.pack(">i", 0) + c.nop()
    cmds = _parse_all(stream)
    assert cmds == [ClientCommand(b"PUB", (b"t", b"0"), None, 0)]
    huge = c.MAGIC_V2 + b"MPUB t\n" + struct.pack(">i", 6 * 1024 * 1024)
    assert _parse_all(huge) == [ClientCommand(b"MPUB", (b"t",), None, 6 * 1024 * 1024)]


def test_dpub_body_only_in_classic_mode() -> None:
    stream = command_bytes("dpub_ptest_1000")
    youzan = _parse_all(c.MAGIC_V2 + stream)
    assert youzan[0] == ClientCommand(b"DPUB", (b"ptest", b"1000"))
    classic = _parse_all(c.MAGIC_V2 + stream, body_commands=CLASSIC_BODY_COMMANDS)
    assert classic == [ClientCommand(b"DPUB", (b"ptest", b"1000"), b"deferred", 8)]


def test_captured_client_bytes_parse() -> None:
    stream = c.MAGIC_V2 + command_bytes("pub_ext_invalid_json") + command_bytes("fin_hex_text_id")
    cmds = _parse_all(stream)
    assert cmds[0].name == b"PUB_EXT"
    assert cmds[0].body == b"\x00\t{not jsonx"
    assert cmds[1] == ClientCommand(b"FIN", (b"0000000000000001",))


def test_split_mpub() -> None:
    cmd = _parse_all(c.MAGIC_V2 + command_bytes("mpub_ptest_0"))[0]
    assert cmd.body is not None
    assert split_mpub(cmd.body, 1024) == [b"mp-1", b"mp-2"]
    with pytest.raises(MpubFormatError):
        split_mpub(struct.pack(">i", 0), 1024)
    with pytest.raises(MpubFormatError):
        split_mpub(struct.pack(">ii", 1, 5000) + b"x" * 5000, 1024)
    with pytest.raises(MpubFormatError):
        split_mpub(struct.pack(">ii", 2, 1) + b"x", 1024)


# --------------------------------------------------------------------------- take_fins


def _parse_with_fin_runs(parser: CommandParser) -> list[ClientCommand]:
    """What a server taking FIN runs sees, as ClientCommands (for comparison)."""
    out: list[ClientCommand] = []
    while True:
        fins = parser.take_fins()
        if fins:
            out += [ClientCommand(b"FIN", (message_id,)) for message_id in fins]
            continue
        cmd = parser.next_command()
        if cmd is None:
            return out
        out.append(cmd)


def test_take_fins_takes_a_run_and_stops_at_anything_else() -> None:
    ids = [NASTY_ID, b"0000000000000001", b"FIN FIN FIN FIN "]
    stream = c.MAGIC_V2 + b"".join(c.fin(i) for i in ids) + c.rdy(5) + c.fin(ids[0])
    parser = CommandParser()
    parser.feed(stream)
    assert parser.take_fins() == []  # the magic comes first
    assert parser.next_command() == ClientCommand(b"FIN", (ids[0],))
    assert parser.take_fins() == ids[1:]
    assert parser.take_fins() == []
    assert parser.next_command() == ClientCommand(b"RDY", (b"5",))
    assert parser.take_fins() == [ids[0]]
    assert parser.take_fins() == []
    assert parser.next_command() is None


def test_take_fins_leaves_malformed_and_partial_fins() -> None:
    parser = CommandParser()
    parser.feed(c.MAGIC_V2 + c.nop() + c.fin(NASTY_ID) + b"FIN not-16-bytes-long\n")
    assert parser.next_command() == ClientCommand(b"NOP")
    assert parser.take_fins() == [NASTY_ID]
    assert parser.take_fins() == []  # malformed: left for next_command
    # youzan nsqd takes bytes 4..20 as the id, whatever they are
    assert parser.next_command() == ClientCommand(b"FIN", (b"not-16-bytes-lon",))
    parser.feed(c.fin(NASTY_ID)[:10])
    assert parser.take_fins() == []  # incomplete
    parser.feed(c.fin(NASTY_ID)[10:])
    assert parser.take_fins() == [NASTY_ID]


def test_take_fins_after_a_broken_stream() -> None:
    parser = CommandParser()
    parser.feed(c.MAGIC_V2 + b"PUB t\n" + struct.pack(">i", 0) + c.fin(NASTY_ID))
    assert parser.next_command() == ClientCommand(b"PUB", (b"t",), None, 0)
    assert parser.take_fins() == []


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.binary(min_size=16, max_size=16).map(c.fin),
            st.just(b"FIN short\n"),
            st.just(c.nop()),
            st.binary(min_size=16, max_size=16).map(lambda i: c.req(i, 5)),
            st.just(c.pub("t", b"x\ny", 1)),
        ),
        max_size=40,
    ),
    cuts=st.lists(st.integers(0, 3000), max_size=20),
)
@pytest.mark.parametrize("fixed_ids", [True, False])
def test_take_fins_parses_like_next_command(
    fixed_ids: bool, ops: list[bytes], cuts: list[int]
) -> None:
    stream = c.MAGIC_V2 + b"".join(ops)
    fast, slow = CommandParser(fixed_ids=fixed_ids), CommandParser(fixed_ids=fixed_ids)
    got: list[ClientCommand] = []
    last = 0
    for point in [*sorted({x % (len(stream) + 1) for x in cuts}), len(stream)]:
        fast.feed(stream[last:point])
        last = point
        got += _parse_with_fin_runs(fast)
    slow.feed(stream)
    expected = []
    while (cmd := slow.next_command()) is not None:
        expected.append(cmd)
    assert got == expected


# --------------------------------------------------------------------------- youzan vs classic


def test_youzan_reads_fixed_offsets_whatever_the_bytes() -> None:
    """youzan nsqd's IOLoop: FIN/REQ lines run to the first newline at or after byte 20, the
    id is bytes 4..20 and REQ's timeout bytes 21..newline (a \\r stays); TOUCH lines are 23
    bytes unless their first newline comes later."""
    stream = c.MAGIC_V2 + b"FIN abc\n0123456789\nNOP\n"
    assert _parse_all(stream) == [ClientCommand(b"FIN", (b"abc\n0123456789\nN",))]
    assert _parse_all(c.MAGIC_V2 + b"FIN" + NASTY_ID + b"x\n") == [
        ClientCommand(b"FIN", (NASTY_ID[1:] + b"x",))
    ]
    assert _parse_all(c.MAGIC_V2 + b"REQ " + NASTY_ID + b" 100\r\n") == [
        ClientCommand(b"REQ", (NASTY_ID, b"100\r"))
    ]
    assert _parse_all(c.MAGIC_V2 + b"REQ " + NASTY_ID + b"\n") == [
        ClientCommand(b"REQ", (NASTY_ID,))
    ]
    short_touch = b"TOUCH x\n" + bytes(15) + c.nop()
    assert _parse_all(c.MAGIC_V2 + short_touch) == [
        ClientCommand(b"TOUCH", (b"x\n" + bytes(14),)),
        ClientCommand(b"NOP"),
    ]
    long_touch = b"TOUCH " + NASTY_ID.replace(b"\n", b"-") + b" extra\n" + c.nop()
    assert _parse_all(c.MAGIC_V2 + long_touch) == [
        ClientCommand(b"TOUCH", (NASTY_ID.replace(b"\n", b"-"),)),
        ClientCommand(b"NOP"),
    ]
    parser = CommandParser()
    parser.feed(c.MAGIC_V2 + b"FIN short\n")
    assert parser.next_command() is None  # nsqd waits for more bytes too


def test_classic_splits_fin_req_touch_lines() -> None:
    stream = c.MAGIC_V2 + b"FIN abc\nREQ 0123456789abcdef 5\r\nTOUCH x y\n"
    assert _parse_all(stream, fixed_ids=False) == [
        ClientCommand(b"FIN", (b"abc",)),
        ClientCommand(b"REQ", (b"0123456789abcdef", b"5")),
        ClientCommand(b"TOUCH", (b"x", b"y")),
    ]


def test_classic_fin_runs_leave_ids_that_split() -> None:
    spaced = b"0123456 89abcdef"
    parser = CommandParser(fixed_ids=False)
    parser.feed(c.MAGIC_V2 + c.fin(b"0123456789abcdef") + c.fin(spaced))
    assert parser.next_command() == ClientCommand(b"FIN", (b"0123456789abcdef",))
    assert parser.take_fins() == []  # split at its space by classic nsqd
    assert parser.next_command() == ClientCommand(b"FIN", (b"0123456", b"89abcdef"))


def test_split_mpub_texts_and_the_messages_read_before_an_error() -> None:
    body = struct.pack(">iib", 2, 1, 0x61) + struct.pack(">i", 0)
    with pytest.raises(MpubFormatError, match=r"MPUB invalid message\(1\) body size 0") as caught:
        split_mpub(body, 1024)
    assert caught.value.elements == [b"a"]
    cases = {
        b"\x00\x00": "MPUB failed to read message count",
        struct.pack(">i", 0): "MPUB invalid message count 0",
        struct.pack(">ii", 1, 2000) + bytes(2000): "MPUB message too big 2000 > 1024",
        struct.pack(">ii", 2, 1) + b"a" + b"\x00": r"MPUB failed to read message\(1\) body size",
        struct.pack(">ii", 1, 5) + b"ab": "MPUB failed to read message body",
    }
    for data, text in cases.items():
        with pytest.raises(MpubFormatError, match=text):
            split_mpub(data, 1024)
