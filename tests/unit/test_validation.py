"""Bad arguments raise a ValueError subclass naming the field, before anything is encoded."""

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from smartnsq.errors import NSQError, ValidationError
from smartnsq.protocol import commands as c
from smartnsq.protocol.identify import IdentifyRequest
from smartnsq.protocol.validation import (
    MAX_BODY_SIZE,
    MAX_MSG_SIZE,
    check_auto_create,
    check_bodies,
    encode_ext,
)

ID = bytes(16)


@pytest.mark.parametrize(
    ("field", "call"),
    [
        ("topic", lambda: c.pub("", b"x")),
        ("topic", lambda: c.pub("a" * 65, b"x")),
        ("topic", lambda: c.pub("bad!topic", b"x")),
        ("topic", lambda: c.pub("t#ephemeral#ephemeral", b"x")),
        ("topic", lambda: c.pub(b"bytes", b"x")),  # type: ignore[arg-type]
        ("channel", lambda: c.sub("t", "bad channel")),
        ("channel", lambda: c.sub("t", "x" * 55 + "#ephemeral")),
        ("partition", lambda: c.pub("t", b"x", -1)),
        ("partition", lambda: c.pub("t", b"x", True)),  # type: ignore[arg-type]
        ("partition", lambda: c.sub_ordered("t", "c", "1")),  # type: ignore[arg-type]
        ("body", lambda: c.pub("t", b"")),
        ("body", lambda: c.pub("t", b"x" * (MAX_MSG_SIZE + 1))),
        ("body", lambda: c.pub("t", 123)),  # type: ignore[arg-type]
        ("body", lambda: c.pub_trace("t", b"x" * (MAX_MSG_SIZE - 7), 1, 0)),
        ("bodies", lambda: c.mpub("t", [])),
        ("bodies", lambda: c.mpub("t", b"abc")),
        ("bodies[1]", lambda: c.mpub("t", [b"a", b""])),
        ("bodies[2]", lambda: c.mpub("t", [b"a", "b", 7])),  # type: ignore[list-item]
        ("bodies[1]", lambda: c.mpub("t", [b"a", b"x" * (MAX_MSG_SIZE + 1)])),
        ("bodies[0]", lambda: c.mpub("t", [bytearray()])),
        ("bodies", lambda: c.mpub("t", [b"x" * MAX_MSG_SIZE] * 5)),
        ("trace_id", lambda: c.pub_trace("t", b"x", -1, 0)),
        ("trace_id", lambda: c.pub_trace("t", b"x", 2**64, 0)),
        ("trace_ids", lambda: c.mpub_trace("t", [b"a", b"b"], [1], 0)),
        ("ext", lambda: c.pub_ext("t", b"x", {"k": object()}, 0)),
        ("ext", lambda: c.pub_ext("t", b"x", b"[1, 2]", 0)),
        ("ext", lambda: c.pub_ext("t", b"x", b"{nope", 0)),
        ("ext", lambda: c.pub_ext("t", b"x", {"k": "v" * 65536}, 0)),
        ("ext", lambda: c.pub_ext("t", b"x", "string", 0)),  # type: ignore[arg-type]
        ("ext['##trace_id']", lambda: c.pub_ext("t", b"x", {"##trace_id": 12345}, 0)),
        ("ext['##trace_id']", lambda: c.pub_ext("t", b"x", {"##trace_id": "12a"}, 0)),
        ("ext['##trace_id']", lambda: c.pub_ext("t", b"x", {"##trace_id": str(2**64)}, 0)),
        ("exts", lambda: c.mpub_ext("t", [b"a"], [None, None], 0)),
        ("rdy", lambda: c.rdy(-1)),
        ("rdy", lambda: c.rdy(2501)),
        ("rdy", lambda: c.rdy(1.5)),  # type: ignore[arg-type]
        ("message_id", lambda: c.fin(b"short")),
        ("message_id", lambda: c.touch("0" * 16)),  # type: ignore[arg-type]
        ("delay", lambda: c.req(ID, -5)),
        ("delay", lambda: c.dpub("t", b"x", 3600 * 1000 + 1)),
        ("auth_secret", lambda: c.auth(b"")),
        ("start.kind", lambda: c.StartPosition("yesterday", 1)),
        ("start.value", lambda: c.StartPosition("special", 0)),
        ("start.value", lambda: c.StartPosition("msgcount", -3)),
        ("heartbeat_interval", lambda: IdentifyRequest("c", "h", "u", heartbeat_interval=500)),
        ("output_buffer_size", lambda: IdentifyRequest("c", "h", "u", output_buffer_size=10)),
        (
            "output_buffer_timeout",
            lambda: IdentifyRequest("c", "h", "u", output_buffer_timeout=5000),
        ),
        ("deflate", lambda: IdentifyRequest("c", "h", "u", snappy=True, deflate=True)),
        ("deflate_level", lambda: IdentifyRequest("c", "h", "u", deflate=True, deflate_level=0)),
        ("sample_rate", lambda: IdentifyRequest("c", "h", "u", sample_rate=100)),
        ("msg_timeout", lambda: IdentifyRequest("c", "h", "u", msg_timeout=999)),
        ("desired_tag", lambda: IdentifyRequest("c", "h", "u", desired_tag="t" * 101)),
        ("ext_filter.type", lambda: IdentifyRequest("c", "h", "u", ext_filter={"type": 9})),
        (
            "ext_filter.filter_data_list",
            lambda: IdentifyRequest("c", "h", "u", ext_filter={"type": 4, "filter_ext_key": "any"}),
        ),
    ],
)
def test_invalid_argument_names_field(field: str, call: Callable[[], object]) -> None:
    with pytest.raises(ValidationError) as info:
        call()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, NSQError)


def test_valid_edge_values() -> None:
    assert c.pub("a" * 64, b"x").startswith(b"PUB " + b"a" * 64)
    assert c.sub("t", "c" * 54 + "#ephemeral")
    assert c.pub("t.x_y-z", "é")[-2:] == "é".encode()
    assert c.rdy(0) == b"RDY 0\n"
    assert c.rdy(2500) == b"RDY 2500\n"
    assert c.pub_trace("t", b"x", 2**64 - 1, 0)
    assert c.pub_ext("t", b"x", {"##trace_id": str(2**64 - 1)}, 0)
    assert c.pub("t", bytearray(b"ab")) == c.pub("t", memoryview(b"ab"))
    mixed = c.mpub("t", [b"ab", "é", bytearray(b"c"), memoryview(b"d")])
    assert mixed == c.mpub("t", [b"ab", "é".encode(), b"c", b"d"])
    assert mixed.endswith(
        b"\x00\x00\x00\x02ab\x00\x00\x00\x02\xc3\xa9\x00\x00\x00\x01c\x00\x00\x00\x01d"
    )
    assert c.sub_advanced("t", "c", 0, c.StartPosition.end()).endswith(b" special:-1\n")
    assert c.sub_advanced("t", "c", 0, c.StartPosition.timestamp(1700000000)).endswith(
        b" timestamp:1700000000\n"
    )
    assert c.sub_advanced("t", "c", 0, c.StartPosition.queue_offset(42)).endswith(
        b" virtual_queue:42\n"
    )


def test_batch_at_the_limit() -> None:
    per = (MAX_BODY_SIZE - 4) // 5 - 4  # bodies sized so that 5 fill the frame exactly
    bodies = [b"x" * per] * 5
    check_bodies(bodies)
    with pytest.raises(ValidationError):
        check_bodies([*bodies, b"y"])


def test_ext_mapping_is_compact_json() -> None:
    cmd = c.pub_ext("t", b"body", {"a": "1", "##trace_id": "7"}, 2)
    assert cmd == b'PUB_EXT t 2\n\x00\x00\x00\x20\x00\x1a{"a":"1","##trace_id":"7"}body'


def test_pub_from_a_kept_head_is_the_same_frame() -> None:
    head = c.pub_head("t", 3)
    assert head == b"PUB t 3\n"
    assert c.pub_with_head(head, b"body") == c.pub("t", b"body", 3)
    assert c.pub_with_head(c.pub_head("t"), b"x") == c.pub("t", b"x")
    with pytest.raises(ValidationError, match="topic"):
        c.pub_head("bad topic")


@pytest.mark.parametrize("partition", [None, 0, 3])
@pytest.mark.parametrize("bodies", [[b"x"], [b"one", b"two\n", bytes(300)], [b"y" * 70_000] * 3])
def test_mpub_from_a_kept_head_is_the_same_frame(
    partition: int | None, bodies: list[bytes]
) -> None:
    head = c.mpub_head("t", partition)
    assert head == (b"MPUB t\n" if partition is None else b"MPUB t %d\n" % partition)
    assert c.mpub_with_head(head, bodies) == c.mpub("t", bodies, partition)
    assert c.mpub_with_head(head, bodies, 300_000) == c.mpub(
        "t", bodies, partition, max_body_size=300_000
    )


@pytest.mark.parametrize("partition", [None, 0, 3])
@pytest.mark.parametrize(
    "exts",
    [
        [{"k": "v"}],
        [None],
        [b'{"a":1}', None, {"##trace_id": "7", "x": "\u00e9"}],
        [None, None, {}],
    ],
)
def test_mpub_ext_from_a_kept_head_and_encoded_exts_is_the_same_frame(
    partition: int | None, exts: list[Mapping[str, Any] | bytes | None]
) -> None:
    bodies = [b"body-%d" % i for i in range(len(exts))]
    raw = [None if e is None else encode_ext(e) for e in exts]
    head = c.mpub_ext_head("t", partition)
    assert head == (b"MPUB_EXT t\n" if partition is None else b"MPUB_EXT t %d\n" % partition)
    expected = c.mpub_ext("t", bodies, exts, partition)
    assert c.mpub_ext_with_head(head, bodies, raw) == expected


def test_batch_heads_are_validated() -> None:
    for make_head in (c.mpub_head, c.mpub_ext_head):
        with pytest.raises(ValidationError, match="topic"):
            make_head("bad topic")
        with pytest.raises(ValidationError, match="partition"):
            make_head("t", -1)


def test_kept_head_batches_check_the_frame_size_as_the_validating_encoders() -> None:
    bodies = [b"x" * 10] * 3  # 4 + 3 * (4 + 10) = 46 bytes on the wire
    with pytest.raises(ValidationError) as validating:
        c.mpub("t", bodies, max_body_size=45)
    with pytest.raises(ValidationError) as kept:
        c.mpub_with_head(c.mpub_head("t"), bodies, 45)
    assert str(kept.value) == str(validating.value)
    assert c.mpub_with_head(c.mpub_head("t"), bodies, 46) == c.mpub("t", bodies, max_body_size=46)

    exts = [{"k": "v"}, None, None]  # the header's 2 + 9 bytes push the frame over
    raw = [None if e is None else encode_ext(e) for e in exts]
    with pytest.raises(ValidationError) as validating:
        c.mpub_ext("t", bodies, exts, max_body_size=56)
    with pytest.raises(ValidationError) as kept:
        c.mpub_ext_with_head(c.mpub_ext_head("t"), bodies, raw, 56)
    assert str(kept.value) == str(validating.value)


def test_kept_head_mpub_ext_needs_one_header_per_body() -> None:
    with pytest.raises(ValidationError, match="exts"):
        c.mpub_ext_with_head(c.mpub_ext_head("t"), [b"a", b"b"], [None])
    with pytest.raises(ValidationError, match="exts"):
        c.mpub_ext_with_head(c.mpub_ext_head("t"), [b"a"], [None, None])


def test_registered_channels_turn_channel_auto_creation_off() -> None:
    # the default follows the channels; registered ones cannot go with auto-creation
    assert check_auto_create(True, None) is True
    assert check_auto_create(False, None) is False
    assert check_auto_create(False, True) is True
    assert check_auto_create(False, False) is False
    assert check_auto_create(True, True) is True
    with pytest.raises(ValidationError, match="need disable_channel_auto_create=True") as info:
        check_auto_create(True, False)
    assert info.value.field == "channels"
