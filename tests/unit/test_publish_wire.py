"""A publish on the wire (smartnsq.publishing.wire): which server takes which command, the
bytes of each command (the protocol's encoders and the captured bytes of real clients), and
nsqd's answers as results (OK, trace receipts, MPUB_TRACE offsets)."""

import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from smartnsq.errors import UnsupportedFeatureError, ValidationError
from smartnsq.protocol import commands as c
from smartnsq.protocol.responses import OK, TraceReceipt
from smartnsq.publishing.request import PublishRequest
from smartnsq.publishing.result import PublishResult
from smartnsq.publishing.routes import ANY_TOPIC, Route
from smartnsq.publishing.wire import DISK_OVERHEAD, PublishCodec
from tests.fixtures import command_bytes, wire

P0 = Route("127.0.0.1:4150", 0, True, False, "ptest")
E0 = Route("127.0.0.1:4150", 0, True, True, "etest")
CLASSIC = Route("127.0.0.1:4150", None, False, False, ANY_TOPIC)


def _request(
    command: str,
    bodies: list[bytes],
    topic: str = "ptest",
    trace_ids: list[int] | None = None,
    exts: list[bytes | None] | None = None,
    **fields: Any,
) -> PublishRequest:
    return PublishRequest(topic, command, bodies, trace_ids=trace_ids, exts=exts, **fields)


def _receipt(name: str) -> bytes:
    """The payload of a captured trace receipt (without the 8-byte frame header)."""
    found = [r for r in wire()["receipts"] if r["from"] == name]
    return bytes.fromhex(found[0]["hex"])[8:]


# --------------------------------------------------------------------------- encode


@pytest.mark.parametrize(
    ("captured", "request_", "partition"),
    [
        ("pub_ptest_0", _request("PUB", [b"pub-with-partition"]), 0),
        ("pub_ptest_no_partition", _request("PUB", [b"pub-no-partition"]), None),
        (
            "pub_trace_ptest_0",
            _request("PUB_TRACE", [b"pub-trace-body"], trace_ids=[0x0102030405060708]),
            0,
        ),
        ("mpub_ptest_0", _request("MPUB", [b"mp-1", b"mp-2"]), 0),
        ("mpub_trace_ptest_0", _request("MPUB_TRACE", [b"mt-1", b"mt-2"], trace_ids=[7, 8]), 0),
        (
            "pub_ext_etest_0_tag",
            _request(
                "PUB_EXT",
                [b"ext-body-2"],
                "etest",
                exts=[b'{"k2": "v2", "##client_dispatch_tag": "tagA"}'],
            ),
            0,
        ),
        (
            "mpub_ext_etest_0",
            _request(
                "MPUB_EXT", [b"mext-1", b"mext-2-nohdr"], "etest", exts=[b'{"k3":"v3"}', None]
            ),
            0,
        ),
    ],
)
def test_encode_writes_what_real_clients_sent(
    captured: str, request_: PublishRequest, partition: int | None
) -> None:
    assert PublishCodec().encode(request_, partition) == command_bytes(captured)


def test_encode_dpub_as_captured() -> None:
    request = _request("DPUB", [b"deferred"], delay_ms=1000)
    assert PublishCodec().encode(request, None) == command_bytes("dpub_ptest_1000")


@pytest.mark.parametrize("partition", [None, 0, 3])
def test_encode_agrees_with_the_protocol_encoders(partition: int | None) -> None:
    codec = PublishCodec()
    bodies = [b"a", b"bb" * 50, "caf\u00e9".encode()]
    ids = [1, 2, 1 << 63]
    exts: list[bytes | None] = [b'{"a":"1"}', None, b'{"b":"2"}']
    cases = [
        (_request("PUB", [b"one"], "t"), c.pub("t", b"one", partition)),
        (
            _request("PUB_TRACE", [b"one"], "t", trace_ids=[9]),
            c.pub_trace("t", b"one", 9, partition),
        ),
        (
            _request("PUB_EXT", [b"one"], "t", exts=[b'{"k":"v"}']),
            c.pub_ext("t", b"one", {"k": "v"}, partition),
        ),
        (_request("PUB_EXT", [b"one"], "t", exts=[None]), c.pub_ext("t", b"one", {}, partition)),
        (_request("MPUB", bodies, "t"), c.mpub("t", bodies, partition)),
        (
            _request("MPUB_TRACE", bodies, "t", trace_ids=ids),
            c.mpub_trace("t", bodies, ids, partition),
        ),
        (
            _request("MPUB_EXT", bodies, "t", exts=exts),
            c.mpub_ext("t", bodies, [{"a": "1"}, None, {"b": "2"}], partition),
        ),
    ]
    for request, expected in cases:
        assert codec.encode(request, partition) == expected, request.command


def test_the_pub_head_is_cached_per_topic_and_partition() -> None:
    codec = PublishCodec()
    first = codec.encode(_request("PUB", [b"x"], "t"), 1)
    assert codec.encode(_request("PUB", [b"y"], "t"), 1) == c.pub("t", b"y", 1)
    assert codec.encode(_request("PUB", [b"x"], "t"), 2) == c.pub("t", b"x", 2)
    assert codec.encode(_request("PUB", [b"x"], "u"), 1) == c.pub("u", b"x", 1)
    assert codec.encode(_request("PUB", [b"x"], "t"), 1) == first


def test_encode_checks_the_limits_it_was_given() -> None:
    codec = PublishCodec(max_msg_size=16, max_body_size=32)
    with pytest.raises(ValidationError):  # 8 bytes of trace id leave 8 for the body
        codec.encode(_request("PUB_TRACE", [b"123456789"], trace_ids=[1]), 0)
    with pytest.raises(ValidationError, match="over the maximum of 32"):
        codec.encode(_request("MPUB", [b"x" * 10] * 3), 0)
    assert codec.encode(_request("MPUB", [b"x" * 10] * 2), 0) == c.mpub("ptest", [b"x" * 10] * 2, 0)


def test_a_command_without_its_data_cannot_be_encoded() -> None:
    with pytest.raises(ValidationError, match="cannot encode PUB_TRACE"):
        PublishCodec().encode(_request("PUB_TRACE", [b"x"]), 0)  # no trace id
    with pytest.raises(ValidationError, match="cannot encode SUB"):
        PublishCodec().encode(_request("SUB", [b"x"]), 0)


# --------------------------------------------------------------------------- prepare (spans)


class _Span:
    def __init__(self, recording: bool = True) -> None:
        self.recording = recording

    def is_recording(self) -> bool:
        return self.recording


def _inject(carrier: MutableMapping[str, Any], span: Any) -> None:
    carrier["traceparent"] = f"00-{id(span):032x}-{1:016x}-01"


def _header(data: bytes, head: bytes) -> dict[str, Any]:
    """The ext header of a PUB_EXT frame."""
    assert data.startswith(head)
    element = data[len(head) + 4 :]
    size = int.from_bytes(element[:2], "big")
    parsed: dict[str, Any] = json.loads(element[2 : 2 + size])
    return parsed


def test_prepare_without_a_span_encodes_the_command() -> None:
    codec = PublishCodec(inject=_inject)
    request = _request("PUB", [b"x"], "etest")
    assert codec.prepare(request, E0, True) == ("PUB", c.pub("etest", b"x", 0), None)
    traced = _request("MPUB_TRACE", [b"x", b"y"], "etest", trace_ids=[1, 2])
    assert codec.prepare(traced, E0, True) == (
        "MPUB_TRACE",
        c.mpub_trace("etest", [b"x", b"y"], [1, 2], 0),
        [1, 2],
    )


def test_a_recording_span_travels_in_the_ext_header() -> None:
    codec = PublishCodec(inject=_inject)
    span = _Span()
    request = _request("PUB_TRACE", [b"body"], "etest", trace_ids=[42])
    command, data, trace_ids = codec.prepare(request, E0, True, span)
    assert (command, trace_ids) == ("PUB_EXT", [42])
    header = _header(data, b"PUB_EXT etest 0\n")
    assert header == {"traceparent": f"00-{id(span):032x}-{1:016x}-01", "##trace_id": "42"}
    assert data.endswith(b"body")


def test_the_span_joins_the_callers_ext_header() -> None:
    codec = PublishCodec(inject=_inject)
    request = _request("PUB_EXT", [b"body"], "etest", exts=[b'{"k":"v"}'])
    command, data, _ = codec.prepare(request, E0, True, _Span())
    assert command == "PUB_EXT"
    header = _header(data, b"PUB_EXT etest 0\n")
    assert header["k"] == "v"
    assert "traceparent" in header
    assert "##trace_id" not in header


@pytest.mark.parametrize(
    ("route", "command", "recording", "inject"),
    [
        (P0, "PUB", True, True),  # not an ext topic
        (E0, "PUB", False, True),  # the span records nothing
        (E0, "MPUB", True, True),  # a batch carries no span
        (E0, "PUB", True, False),  # no injector
    ],
)
def test_spans_travel_only_on_single_messages_of_ext_topics(
    route: Route, command: str, recording: bool, inject: bool
) -> None:
    codec = PublishCodec(inject=_inject if inject else None)
    request = _request(command, [b"x"], route.pool_topic)
    prepared = codec.prepare(request, route, True, _Span(recording))
    assert prepared == (command, codec.encode(request, 0), None)


# --------------------------------------------------------------------------- fit


def test_fit_drops_a_switched_on_trace_for_classic_nsqd() -> None:
    for command, plain in (("PUB_TRACE", "PUB"), ("MPUB_TRACE", "MPUB")):
        request = _request(command, [b"x"], trace_ids=[1], auto_trace=True)
        assert PublishCodec.fit(request, CLASSIC, youzan=False) == (plain, None)
        command_, data, trace_ids = PublishCodec().prepare(request, CLASSIC, False)
        assert (command_, trace_ids) == (plain, None)
        assert data == (c.pub("ptest", b"x") if plain == "PUB" else c.mpub("ptest", [b"x"]))
        assert (request.command, request.trace_ids) == (command, [1])  # left as asked


def test_fit_keeps_a_switched_on_trace_for_youzan() -> None:
    request = _request("PUB_TRACE", [b"x"], trace_ids=[1], auto_trace=True)
    assert PublishCodec.fit(request, P0, youzan=True) == ("PUB_TRACE", [1])


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("PUB_TRACE", "has no trace ids"),
        ("MPUB_TRACE", "has no trace ids"),
        ("PUB_EXT", "has no ext headers"),
        ("MPUB_EXT", "has no ext headers"),
    ],
)
def test_classic_nsqd_refuses_what_it_lacks(command: str, message: str) -> None:
    exts: list[bytes | None] | None = [b"{}"] if "EXT" in command else None
    request = _request(command, [b"x"], trace_ids=None if exts else [1], exts=exts)
    with pytest.raises(UnsupportedFeatureError, match=f"127.0.0.1:4150 {message}"):
        PublishCodec.fit(request, CLASSIC, youzan=False)


def test_classic_nsqd_has_no_partitions() -> None:
    request = _request("PUB", [b"x"], partition=1)
    with pytest.raises(UnsupportedFeatureError, match="no partitions"):
        PublishCodec.fit(request, CLASSIC, youzan=False)
    with pytest.raises(UnsupportedFeatureError, match="no partitions"):
        PublishCodec().prepare(request, CLASSIC, False)  # the PUB fast path too


def test_youzan_nsqd_has_no_dpub_but_classic_has() -> None:
    for route in (P0, CLASSIC):  # a youzan layout's route, or a youzan nsqd in direct mode
        with pytest.raises(UnsupportedFeatureError, match="DPUB"):
            PublishCodec.fit(_request("DPUB", [b"x"]), route, youzan=True)
    assert PublishCodec.fit(_request("DPUB", [b"x"]), CLASSIC, youzan=False) == ("DPUB", None)


def test_ext_headers_need_an_ext_topic() -> None:
    request = _request("PUB_EXT", [b"x"], exts=[b'{"k":"v"}'])
    with pytest.raises(UnsupportedFeatureError, match="'ptest' is not an ext topic"):
        PublishCodec.fit(request, P0, youzan=True)
    assert PublishCodec.fit(request, E0, youzan=True) == ("PUB_EXT", None)
    # in direct mode nothing says whether the topic is an ext topic: nsqd answers
    assert PublishCodec.fit(request, CLASSIC, youzan=True) == ("PUB_EXT", None)


# --------------------------------------------------------------------------- results


def test_an_ok_gives_one_result_per_message() -> None:
    codec = PublishCodec()
    results = codec.results(_request("MPUB", [b"a", b"b", b"c"]), P0, OK, 1)
    assert results == [PublishResult("ptest", 0, "127.0.0.1:4150")] * 3


def test_a_first_try_ok_is_the_same_result_each_time() -> None:
    codec = PublishCodec()
    first = codec.results(_request("PUB", [b"a"]), P0, OK, 1)[0]
    assert codec.results(_request("PUB", [b"b"]), P0, OK, 1)[0] is first
    elsewhere = codec.results(_request("PUB", [b"b"]), CLASSIC, OK, 1)[0]
    assert elsewhere == PublishResult("ptest", None, "127.0.0.1:4150")


def test_the_trace_ids_sent_name_the_results() -> None:
    request = _request("MPUB_TRACE", [b"mt-1", b"mt-2"], trace_ids=[7, 8])
    frame = _receipt("MPUB_TRACE ptest 0 (2 messages)")
    results = PublishCodec().results(request, P0, frame, 1, [9, 10])
    assert [r.trace_id for r in results] == [9, 10]


def test_a_retried_ok_counts_its_tries() -> None:
    result = PublishCodec().results(_request("PUB", [b"a"]), P0, OK, 3)[0]
    assert result == PublishResult("ptest", 0, "127.0.0.1:4150", tries=3)


def test_a_pub_trace_receipt() -> None:
    request = _request("PUB_TRACE", [b"pub-trace-body"], trace_ids=[0x0102030405060708])
    results = PublishCodec().results(request, P0, _receipt("PUB_TRACE ptest 0"), 1)
    assert results == [
        PublishResult("ptest", 0, "127.0.0.1:4150", 14, 0x0102030405060708, 474, 44, 1)
    ]


def test_mpub_trace_offsets_follow_from_the_sizes_on_disk() -> None:
    """The captured receipt of MPUB_TRACE ptest 0 [mt-1, mt-2]: first id 17, offset 586,
    68 bytes in all; each message takes 30 bytes beyond its body."""
    request = _request("MPUB_TRACE", [b"mt-1", b"mt-2"], trace_ids=[7, 8])
    results = PublishCodec().results(request, P0, _receipt("MPUB_TRACE ptest 0 (2 messages)"), 2)
    assert results == [
        PublishResult("ptest", 0, "127.0.0.1:4150", 17, 7, 586, 34, 2),
        PublishResult("ptest", 0, "127.0.0.1:4150", 18, 8, 620, 34, 2),
    ]


def test_an_ext_topic_stores_one_more_byte_per_message() -> None:
    bodies = [b"a" * 5, b"b" * 10, b"c"]
    sizes = [DISK_OVERHEAD + 1 + len(b) for b in bodies]
    frame = TraceReceipt(100, 0, 1000, sum(sizes)).encode()
    request = _request("MPUB_TRACE", bodies, "etest", trace_ids=[1, 2, 3])
    results = PublishCodec().results(request, E0, frame, 1)
    assert [r.offset for r in results] == [1000, 1000 + sizes[0], 1000 + sizes[0] + sizes[1]]
    assert [r.size for r in results] == sizes
    assert [r.internal_id for r in results] == [100, 101, 102]
    assert [r.trace_id for r in results] == [1, 2, 3]


def test_offsets_that_do_not_add_up_are_not_guessed() -> None:
    """A receipt whose size differs from the sum (another layout on disk): only the first
    message's offset is known; ids still follow each other."""
    bodies = [b"mt-1", b"mt-2"]
    frame = TraceReceipt(17, 0, 586, 70).encode()
    results = PublishCodec().results(_request("MPUB_TRACE", bodies, trace_ids=[7, 8]), P0, frame, 1)
    assert [(r.internal_id, r.offset, r.size) for r in results] == [
        (17, 586, None),
        (18, None, None),
    ]
    assert [r.trace_id for r in results] == [7, 8]


def test_an_untraced_batch_answered_by_a_receipt_has_trace_id_zero() -> None:
    frame = TraceReceipt(5, 0, 0, 2 * (DISK_OVERHEAD + 1)).encode()
    results = PublishCodec().results(_request("MPUB", [b"a", b"b"]), P0, frame, 1)
    assert [(r.internal_id, r.trace_id, r.offset) for r in results] == [(5, 0, 0), (6, 0, 31)]
