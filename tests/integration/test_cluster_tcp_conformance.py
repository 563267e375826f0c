"""The embedded nsqd replays the TCP exchanges recorded from real servers and answers the same:
same frames, same error strings, same fatal/non-fatal behaviour, same message layouts.

Node numbers follow the transcripts minus one (the transcripts' nsqd2 is node 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from smartnsq.protocol import commands as c
from smartnsq.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, Frame
from smartnsq.protocol.lookupd import ACCEPT_V1
from smartnsq.protocol.message import MessageLayout, encode_message_frame
from smartnsq.protocol.responses import TraceReceipt
from smartnsq.testing import Cluster
from tests.fixtures import command_bytes, server_frame, wire
from tests.integration.rawclient import RawClient

NSQD1, NSQD2, NSQD3, NSQD4 = 0, 1, 2, 3
YOUZAN = MessageLayout.youzan()
OK_FRAME = Frame(FRAME_TYPE_RESPONSE, b"OK")


def _payload(raw: bytes) -> bytes:
    return raw[8:]


async def _client(cluster: Cluster, node: int, **identify: object) -> RawClient:
    client = await RawClient.connect(cluster.nsqd_addresses[node])
    body = {"client_id": "probe", "hostname": "probehost", "user_agent": "realnsq-probe/0.1"}
    body |= {"heartbeat_interval": 30000, "feature_negotiation": True, "msg_timeout": 60000}
    body |= identify
    frame = await client.request(c.identify(body))
    assert frame.type == FRAME_TYPE_RESPONSE
    return client


# --------------------------------------------------------------------------- IDENTIFY


async def test_identify_answer_is_byte_identical(youzan: Cluster) -> None:
    for name in ("identify_negotiation", "identify_extend_support"):
        client = await RawClient.connect(youzan.nsqd_addresses[NSQD2])
        client.send(command_bytes(name))
        frame = await client.frame()
        assert frame == Frame(FRAME_TYPE_RESPONSE, _payload(server_frame("identify_response")))
        await client.close()


async def test_identify_without_negotiation_is_plain_ok(youzan: Cluster) -> None:
    client = await RawClient.connect(youzan.nsqd_addresses[NSQD2])
    client.send(command_bytes("identify_no_negotiation"))
    assert await client.frame() == OK_FRAME
    await client.close()


async def test_heartbeat_frame_and_read_deadline(youzan: Cluster) -> None:
    client = await _client(youzan, NSQD2, heartbeat_interval=1000)
    client.skip_heartbeats = False
    frame = await client.frame(timeout=2.5)
    assert frame == Frame(FRAME_TYPE_RESPONSE, _payload(server_frame("heartbeat")))
    # Never answering: youzan drops the client after 3 heartbeat intervals without a read.
    assert await client.closed(timeout=6)


async def test_answering_heartbeats_keeps_the_connection(youzan: Cluster) -> None:
    client = await _client(youzan, NSQD2, heartbeat_interval=1000)
    client.skip_heartbeats = True  # the raw client answers each with NOP
    assert await client.silent(3.6)  # no EOF although the 3-interval deadline passed
    await client.ok(c.pub("ptest", b"still here", 0))
    await client.close()


# --------------------------------------------------------------------------- PUB variants


async def test_pub_variants(youzan: Cluster) -> None:
    client = await _client(youzan, NSQD2)
    assert await client.request(command_bytes("pub_ptest_0")) == OK_FRAME
    assert await client.request(command_bytes("pub_ptest_no_partition")) == OK_FRAME
    frame = await client.request(command_bytes("pub_trace_ptest_0"))
    receipt = TraceReceipt.decode(frame.data)
    # internal id 4 = the third message of a fresh partition (ids start at 2)
    assert receipt.internal_id == 4
    assert receipt.trace_id == 0x0102030405060708
    assert receipt.size == 44  # the captured raw size for this body
    first_two = youzan.messages("ptest", 0)[:2]
    assert receipt.offset == sum(r.raw_size for r in first_two)
    assert await client.request(command_bytes("mpub_ptest_0")) == OK_FRAME
    frame = await client.request(command_bytes("mpub_trace_ptest_0"))
    batch = TraceReceipt.decode(frame.data)
    assert batch.trace_id == 0
    assert batch.size == 68  # total of the batch, as captured
    assert batch.internal_id == 7
    bodies = [r.body for r in youzan.messages("ptest", 0)]
    assert bodies == [
        b"pub-with-partition",
        b"pub-no-partition",
        b"pub-trace-body",
        b"mp-1",
        b"mp-2",
        b"mt-1",
        b"mt-2",
    ]
    assert [r.trace_id for r in youzan.messages("ptest", 0)][-2:] == [7, 8]
    text = await client.error(command_bytes("pub_trace_body_too_short"))
    assert text == "E_BAD_BODY invalid body size 8 with trace id enabled"
    assert await client.closed()


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("pub_empty_body", "E_BAD_BODY invalid body size 0"),
        (
            "dpub_ptest_1000",
            "E_INVALID invalid command [[68 80 85 66] [112 116 101 115 116] [49 48 48 48]]",
        ),
    ],
)
async def test_fatal_publish_errors(youzan: Cluster, command: str, expected: str) -> None:
    client = await _client(youzan, NSQD2)
    assert await client.error(command_bytes(command)) == expected
    assert await client.closed()


async def test_pub_errors_on_replica_and_outsider(youzan: Cluster) -> None:
    replica = await _client(youzan, NSQD3)  # replica of ptest-0, not its leader
    assert await replica.error(c.pub("ptest", b"to-non-leader", 0)) == "E_FAILED_ON_NOT_LEADER "
    # non-fatal: the same connection still answers
    assert await replica.error(command_bytes("mpub_ptest_0_single")) == "E_FAILED_ON_NOT_LEADER "
    # no partition on a node that leads none of ptest: default partition -1
    assert await replica.error(c.pub("ptest", b"x")) == "E_TOPIC_NOT_EXIST "
    assert await replica.closed()

    for node, body in ((NSQD1, c.pub("ptest", b"x", 0)), (NSQD2, c.pub("ptest", b"x", 7))):
        client = await _client(youzan, node)
        assert await client.error(body) == "E_TOPIC_NOT_EXIST "
        assert await client.closed()

    client = await _client(youzan, NSQD2)
    assert await client.error(c.pub("no_such_topic", b"x", 0)) == "E_TOPIC_NOT_EXIST "
    assert await client.closed()

    client = await _client(youzan, NSQD2)
    text = await client.error(command_bytes("pub_ptest_bad_partition"))
    assert text == (
        'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "abc": invalid syntax'
    )
    assert await client.closed()

    client = await _client(youzan, NSQD1)  # leader of otest-1; ordered topics need a partition
    text = await client.error(c.pub("otest", b"x"))
    assert text == "E_BAD_PARTITION topic partition is not valid for multi partition: -1"
    assert await client.closed()


def test_captured_errors_are_all_covered() -> None:
    """Every error string of the captures appears in these tests (kept in sync)."""
    source = Path(__file__).read_text()
    missing = [e["text"] for e in wire()["errors"] if e["text"].split(" ", 1)[0] not in source]
    assert missing == []


# --------------------------------------------------------------------------- SUB


async def test_sub_errors(youzan: Cluster) -> None:
    cases = [
        (NSQD3, {}, c.sub("ptest", "ch", 0), "E_FAILED_ON_NOT_LEADER "),
        (NSQD1, {}, c.sub("ptest", "ch", 0), "E_TOPIC_NOT_EXIST "),
        (
            NSQD1,
            {},
            c.sub("otest", "ch", 1),
            "E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub",
        ),
        (
            NSQD2,
            {},
            c.sub("etest", "ch", 0),
            "E_SUB_EXTEND_NEED this topic is extended and should identify as extend support.",
        ),
        (
            NSQD2,
            {"extend_support": True},
            c.sub("ptest", "ch", 0),
            "E_SUB_EXTEND_FORBIDDON this topic is not extended and should not identify as "
            "extend support.",
        ),
        (
            NSQD2,
            {"heartbeat_interval": -1},
            c.sub("ptest", "ch", 0),
            "E_INVALID cannot SUB with heartbeats disabled",
        ),
    ]
    for node, identify, command, expected in cases:
        client = await _client(youzan, node, **identify)
        assert await client.error(command) == expected
        assert await client.closed(), expected


async def test_sub_without_partition_or_identify(youzan: Cluster) -> None:
    client = await _client(youzan, NSQD2)
    assert await client.request(command_bytes("sub_ptest_chnopart")) == OK_FRAME
    await client.close()
    bare = await RawClient.connect(youzan.nsqd_addresses[NSQD2])
    assert await bare.request(c.sub("ptest", "chnoident", 0)) == OK_FRAME
    await bare.close()


async def test_sub_message_touch_req_fin_cls(youzan: Cluster) -> None:
    producer = await _client(youzan, NSQD2)
    consumer = await _client(youzan, NSQD2)
    assert await consumer.request(command_bytes("sub_ptest_chsub_0")) == OK_FRAME
    consumer.send(command_bytes("rdy_1"))
    for i in (1, 2, 3):
        await producer.ok(c.pub("ptest", f"hello-sub-{i}".encode(), 0))
    first = await consumer.message(YOUZAN)
    assert (first.body, first.attempts, first.trace_id) == (b"hello-sub-1", 1, 0)
    assert first.offset is None  # plain SUB: no queue-position block
    assert first.internal_id == 2
    consumer.send(c.touch(first.id))
    consumer.send(c.req(first.id, 0))
    consumer.send(command_bytes("rdy_5"))
    got = [await consumer.message(YOUZAN) for _ in range(3)]
    assert sorted((m.body, m.attempts) for m in got) == [
        (b"hello-sub-1", 2),
        (b"hello-sub-2", 1),
        (b"hello-sub-3", 1),
    ]
    for message in got:
        consumer.send(c.fin(message.id))
    text = await consumer.error(command_bytes("fin_hex_text_id"))
    assert text == (
        "E_FIN_FAILED FIN [48 48 48 48 48 48 48 48 48 48 48 48 48 48 48 49] failed "
        "ErrType:7 ErrCode:0 : Message ID not in flight"
    )
    assert await consumer.request(command_bytes("cls")) == Frame(
        FRAME_TYPE_RESPONSE, _payload(server_frame("close_wait"))
    )
    record = youzan.channel_record("ptest", "chsub")
    assert sorted(record.finished) == [(0, 2), (0, 3), (0, 4)]
    await producer.close()
    await consumer.close()


async def test_sub_ordered_one_in_flight(youzan: Cluster) -> None:
    producer = await _client(youzan, NSQD1)
    consumer = await _client(youzan, NSQD1)
    assert await consumer.request(command_bytes("sub_ordered_otest_chord_1")) == OK_FRAME
    consumer.send(command_bytes("rdy_2"))
    for i in range(3):
        assert (
            await producer.request(
                command_bytes("pub_otest_1_ordered_0").replace(
                    b"ordered-0", f"ordered-{i}".encode()
                )
            )
            == OK_FRAME
        )
    frame = await producer.request(command_bytes("pub_trace_otest_1"))
    captured = TraceReceipt.decode(bytes.fromhex(wire()["receipts"][2]["hex"])[8:])
    assert TraceReceipt.decode(frame.data) == captured  # byte-identical, ids included
    expected = [(m["expect"]) for m in wire()["messages"] if m["from"] == "tcp_sub_ordered.txt"]
    layout = MessageLayout.youzan(detail=True)
    for exp in expected:
        message = await consumer.message(layout)
        assert await consumer.silent(0.15)  # RDY 2, yet nothing more until FIN
        assert message.id.hex() == exp["id_hex"]
        assert (message.offset, message.raw_size) == (exp["offset"], exp["raw_size"])
        assert message.body.decode() == exp["body"]
        consumer.send(c.fin(message.id))
    await producer.close()
    await consumer.close()


async def test_sub_advanced_from_first_message(youzan: Cluster) -> None:
    producer = await _client(youzan, NSQD2)
    for body in (b"http-pub-p0", b"http-pub-p0", b"http-pub-nopart"):
        await producer.ok(c.pub("ptest", body, 0))
    consumer = await _client(youzan, NSQD2)
    frame = await consumer.request(command_bytes("sub_advanced_ptest_chadv_0_msgcount_0"))
    assert frame == OK_FRAME
    consumer.send(command_bytes("rdy_3"))
    expected = [m["expect"] for m in wire()["messages"] if m["from"] == "tcp_sub_advanced.txt"]
    layout = MessageLayout.youzan(detail=True)
    for exp in expected:
        message = await consumer.message(layout)
        assert message.id.hex() == exp["id_hex"]
        assert (message.offset, message.raw_size) == (exp["offset"], exp["raw_size"])
        consumer.send(c.fin(message.id))
    await producer.close()
    await consumer.close()


async def test_new_channel_starts_at_the_end_of_the_queue(youzan: Cluster) -> None:
    producer = await _client(youzan, NSQD2)
    await producer.ok(c.pub("ptest", b"before the channel", 0))
    consumer = await _client(youzan, NSQD2)
    await consumer.ok(c.sub("ptest", "late", 0))
    consumer.send(c.rdy(10))
    assert await consumer.silent(0.2)
    await producer.ok(c.pub("ptest", b"after", 0))
    assert (await consumer.message(YOUZAN)).body == b"after"
    await producer.close()
    await consumer.close()


# --------------------------------------------------------------------------- ext topics


async def test_ext_topic_exchange(youzan: Cluster) -> None:
    consumer = await _client(youzan, NSQD2, extend_support=True)
    assert await consumer.request(command_bytes("sub_etest_chext_0")) == OK_FRAME
    consumer.send(c.rdy(5))
    producer = await _client(youzan, NSQD2)
    frame = await producer.request(command_bytes("pub_ext_etest_0_trace"))
    assert frame.data == _payload(bytes.fromhex(wire()["receipts"][3]["hex"]))
    assert await producer.request(command_bytes("pub_ext_etest_0_tag")) == OK_FRAME
    assert await producer.request(command_bytes("pub_etest_0_plain")) == OK_FRAME
    assert await producer.request(command_bytes("mpub_ext_etest_0")) == OK_FRAME
    text = await producer.error(command_bytes("pub_ext_invalid_json"))
    assert text.startswith("E_INVALID_JSON_HEADER fail to parse json header:")
    await producer.ok(c.nop() + c.pub("etest", b"still open", 0))  # non-fatal
    layout = MessageLayout.youzan(ext=True)
    captured = [m for m in wire()["messages"] if m["from"] == "tcp_ext.txt"]
    for case in captured:
        message = await consumer.message(layout)
        exp = case["expect"]
        assert message.id.hex() == exp["id_hex"]
        assert message.trace_id == exp["trace_id"]
        assert message.ext_version == exp["ext_version"]
        assert message.ext_raw == (exp["ext"].encode() if exp["ext_version"] else None)
        assert message.body.decode() == exp["body"]
        # The whole frame is the captured one but for the timestamp.
        rebuilt = encode_message_frame(
            exp["timestamp"],
            message.attempts,
            message.id,
            message.body,
            ext_version=message.ext_version,
            ext_raw=message.ext_raw or b"",
        )
        assert rebuilt.hex() == case["hex"]
        consumer.send(c.fin(message.id))
    await consumer.close()

    other = await _client(youzan, NSQD2)
    for _ in range(2):
        text = await other.error(
            c.pub_ext("ptest", b"x", {"k2": "v2", "##client_dispatch_tag": "tagA"}, 0)
        )
        assert text == "E_EXT_NOT_SUPPORT ext content not supported in topic ptest"
    await other.ok(c.pub("ptest", b"connection survived", 0))
    await other.close()


async def test_invalid_trace_id_in_ext_is_not_fatal(youzan: Cluster) -> None:
    producer = await _client(youzan, NSQD2)
    bad = b'{"##trace_id":12}'
    element = len(bad).to_bytes(2, "big") + bad + b"x"
    text = await producer.error(b"PUB_EXT etest 0\n" + len(element).to_bytes(4, "big") + element)
    assert text.startswith("INVALID_TRACE_ID")
    await producer.ok(c.pub("etest", b"ok", 0))
    await producer.close()


# --------------------------------------------------------------------------- classic nsqd


async def test_classic_session(classic: Cluster) -> None:
    address = classic.nsqd_addresses[0]
    client = await RawClient.connect(address)
    frame = await client.request(c.identify({"client_id": "c", "feature_negotiation": True}))
    assert json.loads(frame.data) == wire()["classic"]["identify_response_json"]
    frame = await client.request(c.pub("t1", b"hello tcp"))
    assert frame == Frame(FRAME_TYPE_RESPONSE, b"OK")
    assert await client.request(c.mpub("t1", [b"m-1", b"m-2"])) == OK_FRAME
    assert await client.request(c.dpub("t1", b"later", 1000)) == OK_FRAME
    text = await client.error(b"PUB bad!topic\n\x00\x00\x00\x01x")
    assert text == wire()["classic"]["errors"][0]["text"]
    assert await client.closed()

    consumer = await RawClient.identified(address)
    assert await consumer.request(c.sub("t1", "c1")) == OK_FRAME
    consumer.send(c.rdy(10))
    got = [await consumer.message(MessageLayout.classic()) for _ in range(3)]
    assert [m.body for m in got] == [
        b"hello tcp",
        b"m-1",
        b"m-2",
    ]  # the first channel gets the backlog
    for message in got:
        assert len(message.id) == 16
        int(message.id, 16)  # ASCII hex
        assert message.internal_id is None
        consumer.send(c.fin(message.id))
    late = await consumer.message(MessageLayout.classic(), timeout=3)
    assert late.body == b"later"  # DPUB: delivered after its delay
    text = await consumer.error(c.fin(b"0000000000000000"))
    assert text == wire()["classic"]["errors"][1]["text"]
    await consumer.close()


async def test_classic_rejects_youzan_commands(classic: Cluster) -> None:
    client = await RawClient.identified(classic.nsqd_addresses[0])
    text = await client.error(c.pub_trace("t1", b"x", 1))
    assert text.startswith("E_INVALID invalid command")
    assert await client.closed()


async def test_error_frame_type(youzan: Cluster) -> None:
    client = await _client(youzan, NSQD3)
    frame = await client.request(c.pub("ptest", b"x", 0))
    assert frame.type == FRAME_TYPE_ERROR
    await client.close()


# --------------------------------------------------------------------------- answers once wrong
# Each of these answered differently from the real servers once (issue 12); the table of
# every check is test_cluster_tcp_error_paths.py.


def _with_body(line: bytes, body: bytes) -> bytes:
    return line + len(body).to_bytes(4, "big") + body


async def test_bad_protocol_magic_is_a_bare_error_then_close(youzan: Cluster) -> None:
    client = await RawClient.connect(youzan.nsqd_addresses[NSQD2], magic=False)
    client.send(b"  V1" + c.nop())
    assert await client.frame() == Frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL")  # no description
    assert await client.closed()


async def test_auth_without_auth_configured_is_auth_disabled(youzan: Cluster) -> None:
    identified = await _client(youzan, NSQD2)
    bare = await RawClient.connect(youzan.nsqd_addresses[NSQD2])  # AUTH needs no IDENTIFY
    for client in (identified, bare):
        assert await client.error(c.auth("secret")) == "E_AUTH_DISABLED AUTH Disabled"
        assert await client.closed()


async def test_a_second_identify_is_answered_like_the_first(youzan: Cluster) -> None:
    client = await _client(youzan, NSQD2)
    frame = await client.request(
        c.identify({"client_id": "again", "feature_negotiation": True, "msg_timeout": 5000})
    )
    assert frame.type == FRAME_TYPE_RESPONSE
    assert json.loads(frame.data)["msg_timeout"] == 5000
    assert await client.request(c.identify({"client_id": "third"})) == OK_FRAME
    await client.ok(c.pub("ptest", b"still open", 0))
    await client.close()


@pytest.mark.parametrize("command", [b"PUB", b"MPUB", b"PUB_TRACE", b"PUB_EXT", b"MPUB_EXT"])
async def test_publishing_to_an_invalid_topic_name_is_topic_not_exist(
    youzan: Cluster, command: bytes
) -> None:
    client = await _client(youzan, NSQD2)
    body = c.pub_trace("t", b"x", 1)[-9:] if command == b"PUB_TRACE" else b"\x00\x02{}x"
    if command.startswith(b"MPUB"):
        body = (1).to_bytes(4, "big") + len(body).to_bytes(4, "big") + body
    assert await client.error(_with_body(command + b" bad!topic 0\n", body)) == (
        "E_TOPIC_NOT_EXIST "
    )
    assert await client.closed()


async def test_partition_minus_one_is_the_partition_the_node_leads(youzan: Cluster) -> None:
    leader = await _client(youzan, NSQD2)  # leads ptest-0
    await leader.ok(_with_body(b"PUB ptest -1\n", b"minus one"))
    mpub = c.mpub("ptest", [b"m1", b"m2"], 0).replace(b"MPUB ptest 0\n", b"MPUB ptest -1\n")
    await leader.ok(mpub)
    assert [r.body for r in youzan.messages("ptest", 0)] == [b"minus one", b"m1", b"m2"]
    await leader.close()
    replica = await _client(youzan, NSQD3)  # leads no partition of ptest
    assert await replica.error(_with_body(b"PUB ptest -1\n", b"x")) == "E_TOPIC_NOT_EXIST "
    assert await replica.closed()


async def test_publishing_without_partition_to_a_replica_only_node() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("p", 1, 2, channels=["c"], placement={0: [0, 1]})
        await cluster.create_topic("o", 1, 2, ordered=True, channels=["c"], placement={0: [0, 1]})
        for command in (
            c.pub("p", b"x"),
            c.mpub("p", [b"x"]),
            c.pub_trace("p", b"x", 1),
            c.pub("o", b"x"),  # ordered: the partition is looked up before it is required
        ):
            replica = await _client(cluster, 1)
            assert await replica.error(command) == "E_TOPIC_NOT_EXIST ", command
            assert await replica.closed()
        assert cluster.messages("p") == cluster.messages("o") == []


async def test_a_plain_topic_on_four_nodes_puts_each_replica_on_a_node_of_its_own() -> None:
    """nsqlookupd places a plain topic's partitions on nodes of their own (the captures' ptest,
    2x2 on 4 nodes: {0: [1, 2], 1: [3, 0]}), so a node holding a replica leads nothing of the
    topic and a publish without a partition has no default partition there: fatal
    E_TOPIC_NOT_EXIST, over TCP (PUB, MPUB) and HTTP (/pub, /mpub). The leaders take it."""
    async with Cluster(nodes=4) as cluster:  # smartnsq cluster --nodes 4 --topic p:2:2
        await cluster.create_topic("p", 2, 2, channels=["c"])
        layout = cluster.topology("p")
        holders = sorted(node for part in layout.values() for node in part["replicas"])
        assert holders == [0, 1, 2, 3]
        for part in layout.values():
            (replica,) = (node for node in part["replicas"] if node != part["leader"])
            for command in (c.pub("p", b"x"), c.mpub("p", [b"x"])):
                client = await _client(cluster, replica)
                assert await client.error(command) == "E_TOPIC_NOT_EXIST ", (replica, command)
                assert await client.closed()
            async with httpx.AsyncClient() as http:
                for path in ("/pub", "/mpub"):
                    url = f"http://{cluster.nsqd_http_addresses[replica]}{path}?topic=p"
                    answer = await http.post(url, content=b"x", headers={"Accept": ACCEPT_V1})
                    assert answer.status_code == 404, (replica, path)
                    assert answer.json() == {"message": "E_TOPIC_NOT_EXIST"}
            leader = await _client(cluster, part["leader"])
            await leader.ok(c.pub("p", b"to the leader"))
            await leader.close()
        for pid in layout:
            assert [r.body for r in cluster.messages("p", pid)] == [b"to the leader"]


async def test_pub_ext_with_an_empty_header_is_a_non_fatal_invalid_json_header(
    youzan: Cluster,
) -> None:
    expected = (
        "E_INVALID_JSON_HEADER fail to parse json header:cannot parse JSON: "
        'cannot parse empty string; unparsed tail: ""'
    )
    for topic in (b"etest", b"ptest"):  # ext topic and plain topic alike
        client = await _client(youzan, NSQD2)
        text = await client.error(_with_body(b"PUB_EXT " + topic + b" 0\n", b"\x00\x00payload"))
        assert text == expected
        await client.ok(c.pub(topic.decode(), b"still open", 0))
        await client.close()
    assert [r.body for r in youzan.messages("etest", 0)] == [b"still open"]


async def test_sub_ordered_without_partition_takes_the_led_partition(youzan: Cluster) -> None:
    consumer = await _client(youzan, NSQD1)  # leads otest-1 (and is a replica of otest-0)
    assert await consumer.request(b"SUB_ORDERED otest chnopart\n") == OK_FRAME
    consumer.send(c.rdy(1))
    producer = await _client(youzan, NSQD1)
    await producer.ok(c.pub("otest", b"ordered, no partition given", 1))
    message = await consumer.message(MessageLayout.youzan(detail=True))
    assert message.body == b"ordered, no partition given"
    assert youzan.subscriber_rdy("otest", "chnopart", 1) == [1]
    await producer.close()
    await consumer.close()
