"""The embedded nsqd's HTTP API answers like the real nodes: the recorded /pub, /mpub,
/pubtrace, /info, /stats and /channel/create answers (statuses, envelopes, bodies), the
publish rules shared with TCP, and classic nsqd's endpoints.

Node numbers follow the transcripts minus one (the transcripts' nsqd2 is node 1).
"""

from __future__ import annotations

import ast
import json
import re
import struct
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from smartnsq.protocol import commands as c
from smartnsq.protocol.message import MessageLayout
from smartnsq.testing import Cluster
from tests.integration.conftest import create_capture_topics
from tests.integration.rawclient import RawClient

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "nsqd_http"
V1 = {"Accept": "application/vnd.nsq; version=1.0"}
YOUZAN = MessageLayout.youzan()
CLASSIC = MessageLayout.classic()
BODY = b"0123456789"  # 10 bytes: the recorded receipts' rawsize is 40 (30 + 10)


def _url(cluster: Cluster, node: int, target: str) -> str:
    return f"http://{cluster.nsqd_http_addresses[node]}{target}"


def _ext(target: str, ext: str) -> str:
    return f"{target}&{urlencode({'ext': ext})}"


async def _post(
    cluster: Cluster, node: int, target: str, body: bytes = BODY, *, v1: bool = True, **kw: Any
) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as http:
        headers = {**(V1 if v1 else {}), **kw.pop("headers", {})}
        return await http.post(_url(cluster, node, target), content=body, headers=headers, **kw)


async def _get(cluster: Cluster, node: int, target: str, *, v1: bool = True) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as http:
        return await http.get(_url(cluster, node, target), headers=V1 if v1 else {})


def _answer(response: httpx.Response) -> tuple[int, bytes]:
    return response.status_code, response.content


def _v1_error(message: str) -> bytes:
    return b'{"message":"%s"}' % message.encode()


def _assert_empty_v1_answer(answer: httpx.Response) -> None:
    """nsqd's empty 200 answers (RespondV1 with no data) set no Content-Type, and Go's
    net/http only sniffs one from a body: the header is absent."""
    assert answer.headers["x-nsq-content-type"] == "nsq; version=1.0"
    assert "content-type" not in answer.headers
    assert answer.headers["content-length"] == "0"


def _legacy_error(message: str) -> bytes:
    return b'{"status_code":500,"status_txt":"%s","data":null}' % message.encode()


# --------------------------------------------------------------------------- recorded answers

_PUB_LINE = re.compile(r"^nsqd(\d) (\w+) (\S+) \[(v1|default)\] -> (?:HTTP )?(\d+) (.*)$")


def _recorded_pub_lines() -> list[tuple[int, str, str, bool, int, str]]:
    lines = []
    for text in (RECORDED / "nsqd_http_pub_responses.txt").read_text().splitlines():
        match = _PUB_LINE.match(text)
        assert match, text
        nsqd, method, target, envelope, status, body = match.groups()
        lines.append((int(nsqd) - 1, method, target, envelope == "v1", int(status), body))
    return lines


async def test_recorded_pub_answers(youzan: Cluster) -> None:
    """nsqd_http_pub_responses.txt replayed in order on the captured topology."""
    lines = _recorded_pub_lines()
    assert len(lines) == 21
    for node, method, target, v1, status, body in lines:
        async with httpx.AsyncClient(timeout=5) as http:
            answer = await http.request(
                method, _url(youzan, node, target), content=BODY, headers=V1 if v1 else {}
            )
        assert answer.status_code == status, (node, target, v1)
        if target.startswith("/pubtrace") and status == 200:
            recorded = json.loads(ast.literal_eval(body))
            receipt = answer.json()
            assert list(receipt) == list(recorded)
            assert [type(v) for v in receipt.values()] == [type(v) for v in recorded.values()]
            assert receipt["status"] == "OK"
            assert receipt["trace_id"] == recorded["trace_id"] == "4242"
            assert receipt["rawsize"] == recorded["rawsize"] == 40
            stored = {r.internal_id: r for r in youzan.messages("ptest", 0)}[receipt["id"]]
            assert (stored.offset, stored.trace_id, stored.body) == (
                receipt["queue_offset"],
                4242,
                BODY,
            )
        elif target == "/info":
            recorded = json.loads(body)
            info = answer.json()
            assert list(info) == list(recorded)
            assert [type(v) for v in info.values()] == [type(v) for v in recorded.values()]
            assert info["version"] == recorded["version"]
            assert info["ha_support"] is True
            assert f"{info['broadcast_address']}:{info['tcp_port']}" == youzan.nsqd_addresses[1]
            assert f"127.0.0.1:{info['http_port']}" == youzan.nsqd_http_addresses[1]
        else:
            assert answer.content == ast.literal_eval(body), (node, target, v1)
            if status == 200:
                assert answer.headers["content-type"].startswith("text/plain")
            else:
                assert answer.headers["content-type"] == "application/json; charset=utf-8"
        assert ("x-nsq-content-type" in answer.headers) == (v1 or target.startswith("/pubtrace"))
    # each recorded success wrote (4 pubs, 2 mpubs, 2 pubtraces)
    assert [r.body for r in youzan.messages("ptest", 0)] == [BODY] * 8


_CREATE_LINE = re.compile(r"^nsqd(\d) \((leader|replica)\) POST (\S+) -> HTTP (\d+) (.*)$")


async def test_recorded_channel_create_answers() -> None:
    """The nsqd /channel/create calls of nsqlookupd_lookup_no_channel_yet.txt."""
    lines = []
    for text in (RECORDED / "nsqlookupd_lookup_no_channel_yet.txt").read_text().splitlines():
        match = _CREATE_LINE.match(text)
        if match:
            lines.append(match.groups())
    assert len(lines) == 22
    async with Cluster(nodes=4) as cluster:
        await create_capture_topics(cluster, channels=())
        for nsqd, role, target, status, body in lines:
            args = dict(re.findall(r"(\w+)=(\w+)", target))
            log_ = cluster.topics[args["topic"]].partitions[int(args["partition"])].log
            before = "init" in log_.channels
            answer = await _post(cluster, int(nsqd) - 1, target, b"", v1=False)
            expected = (int(status), ast.literal_eval(body))
            assert _answer(answer) == expected, (nsqd, target)
            assert answer.headers["x-nsq-content-type"] == "nsq; version=1.0"
            # only the leader creates the channel
            assert ("init" in log_.channels) == (before or role == "leader")


# --------------------------------------------------------------------------- /stats


async def test_stats_like_the_recording(youzan: Cluster) -> None:
    """Ten 8-byte messages on ptest-0, as when nsqd_stats_ptest.v1.json was recorded."""
    recorded = json.loads((RECORDED / "nsqd_stats_ptest.v1.json").read_text())
    producer = await RawClient.identified(youzan.nsqd_addresses[1])
    for i in range(10):
        await producer.ok(c.pub("ptest", b"message%d" % i, 0))
    await producer.close()
    answer = await _get(youzan, 1, "/stats?format=json&topic=ptest")
    assert answer.status_code == 200
    stats = answer.json()
    _same_shape(recorded, stats, "$")
    assert (stats["version"], stats["health"]) == (recorded["version"], "OK")
    assert stats["start_time"] == youzan.nodes[1].start_time
    [topic] = stats["topics"]
    [rec_topic] = recorded["topics"]
    facts = (
        "topic_name",
        "topic_full_name",
        "topic_partition",
        "channel_num",
        "depth",
        "backend_depth",
        "backend_start",
        "message_count",
        "is_leader",
        "client_pub_stats",
        "client_num",
        "msg_size_stats",
        "is_multi_ordered",
        "is_multi_part",
        "is_ext",
        "is_channel_auto_create_disabled",
        "statsd_name",
        "pub_failed_cnt",
        "e2e_processing_latency",
    )
    assert {k: topic[k] for k in facts} == {k: rec_topic[k] for k in facts}
    [channel] = topic["channels"]
    [rec_channel] = rec_topic["channels"]
    facts = (
        "channel_name",
        "depth",
        "depth_size",
        "backend_depth",
        "in_flight_count",
        "deferred_count",
        "message_count",
        "requeue_count",
        "timeout_count",
        "clients",
        "client_num",
        "paused",
        "delayed_queue_recent",
        "msg_consume_latency_stats",
    )
    assert {k: channel[k] for k in facts} == {k: rec_channel[k] for k in facts}
    first = youzan.messages("ptest", 0)[0]
    assert channel["depth_ts_nano"] == first.timestamp
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \+0000 UTC", channel["depth_ts"])
    # the legacy envelope wraps the same data
    legacy = await _get(youzan, 1, "/stats?format=json&topic=ptest", v1=False)
    assert list(legacy.json()) == ["status_code", "status_txt", "data"]
    assert legacy.json()["data"]["topics"][0]["message_count"] == 10


def _same_shape(recorded: Any, emulated: Any, where: str) -> None:
    assert type(emulated) is type(recorded) or (
        recorded is None and where.endswith("percentiles")
    ), where
    if isinstance(recorded, dict):
        assert list(emulated) == list(recorded), where
        for key, value in recorded.items():
            _same_shape(value, emulated[key], f"{where}.{key}")
    elif isinstance(recorded, list) and recorded:
        assert len(emulated) >= 1, where
        for i, item in enumerate(emulated):
            _same_shape(recorded[0], item, f"{where}[{i}]")


CLIENT_KEYS = [
    "name",
    "client_id",
    "hostname",
    "version",
    "remote_address",
    "state",
    "ready_count",
    "in_flight_count",
    "message_count",
    "finish_count",
    "requeue_count",
    "timeout_count",
    "deferred_count",
    "connect_ts",
    "sample_rate",
    "deflate",
    "snappy",
    "user_agent",
    "desired_tag",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
]


async def test_stats_counts_clients_in_flight_requeues_and_timeouts() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("t", 1, 2, channels=["c"], placement={0: [0, 1]})
        producer = await RawClient.identified(cluster.nsqd_addresses[0])
        await producer.ok(c.mpub("t", [b"a", b"b", b"c", b"d"], 0))
        consumer = await RawClient.identified(
            cluster.nsqd_addresses[0], client_id="stats-probe", msg_timeout=1000
        )
        await consumer.ok(c.sub("t", "c", 0))
        consumer.send(c.rdy(3))
        got = [await consumer.message(YOUZAN) for _ in range(3)]
        consumer.send(c.req(got[0].id, 0))
        consumer.send(c.fin(got[1].id))
        await cluster.wait_for(lambda: cluster.channel_record("t", "c").finished != [])

        def channel_stats(stats: dict[str, Any]) -> dict[str, Any]:
            channel: dict[str, Any] = stats["topics"][0]["channels"][0]
            return channel

        # got[2] and the requeued got[0] (redelivered) time out after 1 s
        await cluster.wait_for(lambda: cluster.channel_record("t", "c").timed_out != [], timeout=5)
        stats = (await _get(cluster, 0, "/stats?format=json")).json()
        channel = channel_stats(stats)
        assert channel["requeue_count"] == 1
        assert channel["timeout_count"] >= 1
        assert channel["message_count"] == 4
        # youzan's depth counts from the confirmed position: "a" is unfinished, so the
        # finished "b" still counts (nsqd/channel.go Depth)
        assert cluster.unfinished("t", "c") == 3
        assert (channel["depth"], channel["backend_depth"]) == (4, 4)
        [client] = channel["clients"]
        assert list(client) == CLIENT_KEYS
        assert (client["client_id"], client["ready_count"], client["state"]) == (
            "stats-probe",
            3,
            3,
        )
        assert 0 <= client["in_flight_count"] <= 3
        assert client["message_count"] >= 3
        assert client["remote_address"].startswith("127.0.0.1:")
        assert channel["client_num"] == 1
        assert stats["topics"][0]["is_leader"] is True
        # the replica lists the partition too, not as leader, without clients
        replica = (await _get(cluster, 1, "/stats?format=json")).json()
        assert replica["topics"][0]["is_leader"] is False
        assert channel_stats(replica)["clients"] == []
        leader_only = (await _get(cluster, 1, "/stats?format=json&leaderOnly=true")).json()
        assert leader_only["topics"] == []
        text = await _get(cluster, 0, "/stats")
        assert text.headers["content-type"].startswith("text/plain")
        assert "[t-0" in text.text
        assert "[c " in text.text
        for client_ in (producer, consumer):
            await client_.close()


async def test_stats_filters(youzan: Cluster) -> None:
    everything = (await _get(youzan, 3, "/stats?format=json")).json()
    names = [t["topic_full_name"] for t in everything["topics"]]
    assert names == sorted(names)
    assert {n for n in names} == {
        f"{topic}-{pid}"
        for topic in ("ptest", "otest", "etest", "p3", "r3test")
        for pid, info in youzan.topology(topic).items()
        if 3 in info["replicas"]
    }
    ordered = (await _get(youzan, 3, "/stats?format=json&topic=otest&partition=3")).json()
    [otest3] = ordered["topics"]
    assert (otest3["topic_partition"], otest3["is_leader"], otest3["statsd_name"]) == (
        "3",
        False,
        "otest.3",
    )
    assert otest3["is_multi_ordered"] is True
    none = (await _get(youzan, 3, "/stats?format=json&topic=no_such_topic")).json()
    assert none["topics"] == []


# --------------------------------------------------------------------------- publishing


async def test_empty_and_too_big_bodies_are_checked_first() -> None:
    async with Cluster(nodes=1, max_msg_size=16, max_body_size=64) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        for target in ("/pub?topic=t", "/pub", "/pub_ext?topic=t", "/pubtrace?topic=t"):
            answer = await _post(cluster, 0, target, b"")
            assert _answer(answer) == (406, _v1_error("MSG_EMPTY")), target
            answer = await _post(cluster, 0, target, b"x" * 17)
            assert _answer(answer) == (413, _v1_error("MSG_TOO_BIG")), target
        legacy = await _post(cluster, 0, "/pub?topic=t", b"", v1=False)
        assert _answer(legacy) == (500, _legacy_error("MSG_EMPTY"))
        trace = await _post(cluster, 0, "/pubtrace?topic=t", b"", v1=False)
        assert _answer(trace) == (406, _v1_error("MSG_EMPTY"))  # /pubtrace is v1 only
        too_big = await _post(cluster, 0, "/mpub?topic=t", b"x\n" * 33)
        assert _answer(too_big) == (413, _v1_error("BODY_TOO_BIG"))
        line = await _post(cluster, 0, "/mpub?topic=t", b"ok\n" + b"x" * 17)
        assert _answer(line) == (413, _v1_error("MSG_TOO_BIG"))
        assert cluster.messages("t") == []


async def test_topic_argument_errors(youzan: Cluster) -> None:
    # /pub reports every topic lookup failure as E_TOPIC_NOT_EXIST; /mpub passes them on
    for target in ("/pub", "/pub?topic=", "/pub?topic=bad!name", "/pub?topic=ptest&partition=x"):
        answer = await _post(youzan, 1, target)
        assert _answer(answer) == (404, _v1_error("E_TOPIC_NOT_EXIST")), target
    cases = {
        "/mpub": (400, _v1_error("MISSING_ARG_TOPIC")),
        "/mpub?topic=bad!name": (400, _v1_error("INVALID_ARG_TOPIC")),
        # Go's error text, quotes included, in a Sprintf'd body (invalid JSON, as nsqd)
        "/mpub?topic=ptest&partition=x": (
            400,
            b'{"message":"strconv.Atoi: parsing "x": invalid syntax"}',
        ),
        "/mpub?topic=ptest&partition=1": (404, _v1_error("E_TOPIC_NOT_EXIST")),
        "/mpub?topic=ptest&partition=0": (400, _v1_error("E_FAILED_ON_NOT_LEADER")),
        # -1 is the default partition: the one this node leads (none here)
        "/mpub?topic=ptest&partition=-1": (404, _v1_error("E_TOPIC_NOT_EXIST")),
    }
    for target, expected in cases.items():
        assert _answer(await _post(youzan, 2, target)) == expected, target
    assert _answer(await _post(youzan, 1, "/mpub?topic=ptest&partition=-1")) == (200, b"OK")


async def test_mpub_bodies(youzan: Cluster) -> None:
    text = await _post(youzan, 1, "/mpub?topic=ptest&partition=0", b"a\n\nb\n\n")
    assert _answer(text) == (200, b"OK")
    binary_body = (
        struct.pack(">i", 2) + struct.pack(">i", 3) + b"c\nd" + struct.pack(">i", 1) + b"e"
    )
    binary = await _post(youzan, 1, "/mpub?topic=ptest&partition=0&binary=true", binary_body)
    assert _answer(binary) == (200, b"OK")
    assert [r.body for r in youzan.messages("ptest", 0)] == [b"a", b"b", b"c\nd", b"e"]
    bad_count = await _post(youzan, 1, "/mpub?topic=ptest&partition=0&binary", b"\0\0\0\0")
    assert _answer(bad_count) == (413, _v1_error("BAD_BODY"))
    bad_size = struct.pack(">ii", 1, 0)
    bad_message = await _post(youzan, 1, "/mpub?topic=ptest&partition=0&binary", bad_size)
    assert _answer(bad_message) == (413, _v1_error("BAD_MESSAGE"))
    legacy = await _post(youzan, 1, "/mpub?topic=ptest&partition=0&binary", bad_size, v1=False)
    assert _answer(legacy) == (500, _legacy_error("BAD_MESSAGE"))
    # only empty lines: nsqd's handler panics after the (empty) write
    empty = await _post(youzan, 1, "/mpub?topic=ptest&partition=0", b"\n\n", v1=False)
    assert _answer(empty) == (500, _v1_error("INTERNAL_ERROR"))
    assert len(youzan.messages("ptest", 0)) == 4


async def test_unwritable_partition(youzan: Cluster) -> None:
    await youzan.set_writable("ptest", 0, False)
    for target in ("/pub?topic=ptest&partition=0", "/mpub?topic=ptest&partition=0"):
        answer = await _post(youzan, 1, target)
        assert _answer(answer) == (400, _v1_error("E_FAILED_ON_NOT_WRITABLE"))
        legacy = await _post(youzan, 1, target, v1=False)
        assert _answer(legacy) == (500, _legacy_error("E_FAILED_ON_NOT_WRITABLE"))
    await youzan.set_writable("ptest", 0, True)
    assert _answer(await _post(youzan, 1, "/pub?topic=ptest&partition=0")) == (200, b"OK")


async def test_http_and_tcp_messages_share_the_log(youzan: Cluster) -> None:
    """A consumer cannot tell HTTP from TCP publishes: one log, one id sequence."""
    producer = await RawClient.identified(youzan.nsqd_addresses[1])
    await producer.ok(c.pub("ptest", b"tcp-1", 0))
    await _post(youzan, 1, "/pub?topic=ptest&partition=0&trace_id=77", b"http-1")
    await _post(youzan, 1, "/mpub?topic=ptest", b"http-2\nhttp-3")  # default partition: 0
    await producer.ok(c.pub("ptest", b"tcp-2", 0))
    consumer = await RawClient.identified(youzan.nsqd_addresses[1])
    await consumer.ok(c.sub("ptest", "fresh", 0))
    consumer.send(c.rdy(10))
    # a new youzan channel starts at the end of the queue: publish again
    await _post(youzan, 1, "/pub?topic=ptest&partition=0", b"http-4")
    await producer.ok(c.pub("ptest", b"tcp-3", 0))
    got = [await consumer.message(YOUZAN) for _ in range(2)]
    assert [m.body for m in got] == [b"http-4", b"tcp-3"]
    records = youzan.messages("ptest", 0)
    assert [r.body for r in records] == [
        b"tcp-1",
        b"http-1",
        b"http-2",
        b"http-3",
        b"tcp-2",
        b"http-4",
        b"tcp-3",
    ]
    ids = [r.internal_id for r in records]
    assert ids == list(range(ids[0], ids[0] + 7))
    assert records[1].trace_id == 77  # /pub keeps a valid trace_id argument
    assert [m.internal_id for m in got] == ids[5:]
    for client in (producer, consumer):
        await client.close()


async def test_pubtrace_needs_a_valid_trace_id(youzan: Cluster) -> None:
    for trace in ("", "x", "-1", "18446744073709551616"):
        for v1 in (True, False):
            answer = await _post(
                youzan, 1, f"/pubtrace?topic=ptest&partition=0&trace_id={trace}", v1=v1
            )
            assert _answer(answer) == (400, _v1_error("INVALID_TRACE_ID")), trace
    ok = await _post(youzan, 1, "/pubtrace?topic=ptest&partition=0&trace_id=18446744073709551615")
    assert ok.json()["trace_id"] == "18446744073709551615"


async def test_pub_ext(youzan: Cluster) -> None:
    consumer = await RawClient.identified(youzan.nsqd_addresses[1], extend_support=True)
    await consumer.ok(c.sub("etest", "ext", 0))
    consumer.send(c.rdy(10))
    target = "/pub_ext?topic=etest&partition=0"
    plain = await _post(youzan, 1, _ext(target, '{"k":"v","<":"&"}'), b"e1")
    assert _answer(plain) == (200, b"OK")
    traced = await _post(
        youzan,
        1,
        _ext(target, '{"##trace_id":"12345"}'),
        b"e2",
        headers={"X-Nsqext-Zone": "eu"},
        v1=False,
    )
    receipt = traced.json()
    assert list(receipt) == ["status_code", "status_txt", "data"]  # negotiated envelope
    assert list(receipt["data"]) == ["status", "id", "trace_id", "queue_offset", "rawsize"]
    assert receipt["data"]["trace_id"] == "12345"
    layout = MessageLayout.youzan(ext=True)
    first, second = [await consumer.message(layout) for _ in range(2)]
    # stored re-marshalled the Go way: keys sorted, <, >, & escaped
    assert first.ext_raw == b'{"\\u003c":"\\u0026","k":"v"}'
    assert json.loads(second.ext_raw or b"") == {"##trace_id": "12345", "zone": "eu"}
    assert (second.trace_id, second.internal_id) == (12345, receipt["data"]["id"])
    errors = {
        '{"k":': "E_INVALID_JSON_HEADER",
        "[1]": "E_INVALID_JSON_HEADER",
        '{"##trace_id":12345}': "INVALID_TRACE_ID",
    }
    for ext, message in errors.items():
        answer = await _post(youzan, 1, _ext(target, ext))
        assert _answer(answer) == (400, _v1_error(message)), ext
    missing = await _post(youzan, 1, target)
    assert _answer(missing) == (400, _v1_error("E_INVALID_JSON_HEADER"))
    not_ext = await _post(youzan, 1, _ext("/pub_ext?topic=ptest&partition=0", "{}"))
    assert _answer(not_ext) == (400, _v1_error("E_EXT_NOT_SUPPORT"))
    await consumer.close()


async def test_routing_errors_are_always_v1(youzan: Cluster) -> None:
    for v1 in (True, False):
        assert _answer(await _get(youzan, 0, "/nope", v1=v1)) == (404, _v1_error("NOT_FOUND"))
        wrong = await _get(youzan, 0, "/pub?topic=ptest", v1=v1)
        assert _answer(wrong) == (405, _v1_error("METHOD_NOT_ALLOWED"))
    ping = await _get(youzan, 0, "/ping", v1=False)
    assert _answer(ping) == (200, b"OK")
    legacy_info = (await _get(youzan, 0, "/info", v1=False)).json()
    assert legacy_info["data"]["ha_support"] is True


async def test_channel_create_errors(youzan: Cluster) -> None:
    cases = {
        "/channel/create?topic=ptest&partition=0": (400, "MISSING_ARG_CHANNEL"),
        "/channel/create?topic=ptest&partition=0&channel=bad!": (400, "INVALID_ARG_CHANNEL"),
        "/channel/create?topic=ptest&partition=1&channel=c": (404, "E_TOPIC_NOT_EXIST"),
        "/channel/create?channel=c": (400, "MISSING_ARG_TOPIC"),
        "/channel/create?topic=ptest&partition=0&channel=c": (200, ""),
    }
    for target, (status, message) in cases.items():
        answer = await _post(youzan, 1, target, b"", v1=False)
        body = _v1_error(message) if message else b""
        assert _answer(answer) == (status, body), target
        if not message:
            _assert_empty_v1_answer(answer)
    assert "c" in youzan.topics["ptest"].partitions[0].log.channels
    assert "c" not in youzan.topics["ptest"].partitions[1].log.channels


# --------------------------------------------------------------------------- classic nsqd


async def test_classic_pub_mpub_and_defer(classic: Cluster) -> None:
    consumer = await RawClient.identified(classic.nsqd_addresses[0])
    await consumer.ok(c.sub("t", "c"))
    consumer.send(c.rdy(10))
    for v1 in (True, False):  # nsqd 1.x answers v1 whatever the Accept header
        answer = await _post(classic, 0, "/pub?topic=t", b"now", v1=v1)
        assert _answer(answer) == (200, b"OK")
        assert answer.headers["x-nsq-content-type"] == "nsq; version=1.0"
    started = time.monotonic()
    assert _answer(await _post(classic, 0, "/pub?topic=t&defer=500", b"later")) == (200, b"OK")
    assert _answer(await _post(classic, 0, "/mpub?topic=t", b"m1\n\nm2")) == (200, b"OK")
    binary = struct.pack(">ii", 1, 2) + b"m3"
    assert _answer(await _post(classic, 0, "/mpub?topic=t&binary=true", binary)) == (200, b"OK")
    assert _answer(await _post(classic, 0, "/mpub?topic=t&binary=false", b"m4")) == (200, b"OK")
    got = [await consumer.message(CLASSIC) for _ in range(7)]
    bodies = [m.body for m in got]
    assert bodies[:2] == [b"now", b"now"]
    assert bodies[-1] == b"later"  # deferred: delivered after everything published later
    assert time.monotonic() - started >= 0.5
    assert bodies[2:6] == [b"m1", b"m2", b"m3", b"m4"]
    assert all(re.fullmatch(rb"[0-9a-f]{16}", m.id) for m in got)  # classic hex ids
    await consumer.close()


async def test_classic_errors(classic: Cluster) -> None:
    cases = {
        "/pub?topic=t&defer=x": (400, "INVALID_DEFER"),
        "/pub?topic=t&defer=-1": (400, "INVALID_DEFER"),
        "/pub?topic=t&defer=3600001": (400, "INVALID_DEFER"),
        "/pub": (400, "MISSING_ARG_TOPIC"),
        "/pub?topic=": (400, "INVALID_TOPIC"),
        "/pub?topic=bad!": (400, "INVALID_TOPIC"),
        "/mpub?topic=t&binary": (413, "BAD_BODY"),
    }
    for v1 in (True, False):
        for target, (status, message) in cases.items():
            answer = await _post(classic, 0, target, v1=v1)
            assert _answer(answer) == (status, _v1_error(message)), target
        empty = await _post(classic, 0, "/pub?topic=t", b"", v1=v1)
        assert _answer(empty) == (400, _v1_error("MSG_EMPTY"))  # classic: 400, youzan: 406
    assert classic.messages("t") == []  # the topic exists (created by the argument check)
    assert "t" in classic.nodes[0].classic_topics


async def test_classic_topic_and_channel_create(classic: Cluster) -> None:
    answer = await _post(classic, 0, "/channel/create?topic=t&channel=c", b"")
    assert _answer(answer) == (404, _v1_error("TOPIC_NOT_FOUND"))
    for target in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
        answer = await _post(classic, 0, target, b"")
        assert _answer(answer) == (200, b"")
        _assert_empty_v1_answer(answer)
    cases = {
        "/topic/create": "MISSING_ARG_TOPIC",
        "/topic/create?topic=bad!": "INVALID_TOPIC",
        "/channel/create?channel=c": "MISSING_ARG_TOPIC",
        "/channel/create?topic=bad!&channel=c": "INVALID_ARG_TOPIC",
        "/channel/create?topic=t": "MISSING_ARG_CHANNEL",
        "/channel/create?topic=t&channel=bad!": "INVALID_ARG_CHANNEL",
    }
    for target, message in cases.items():
        assert _answer(await _post(classic, 0, target, b"")) == (400, _v1_error(message))
    async with httpx.AsyncClient(timeout=5) as http:
        lookup = await http.get(f"{classic.lookupd_url}/lookup", params={"topic": "t"}, headers=V1)
    assert lookup.json()["channels"] == ["c"]


async def test_classic_stats(classic: Cluster) -> None:
    await _post(classic, 0, "/pub?topic=t", b"before-the-channel")
    topic = (await _get(classic, 0, "/stats?format=json")).json()["topics"][0]
    assert (topic["depth"], topic["message_count"]) == (1, 1)  # waits in the topic
    consumer = await RawClient.identified(classic.nsqd_addresses[0], client_id="cl")
    await consumer.ok(c.sub("t", "c"))
    consumer.send(c.rdy(5))
    await consumer.message(CLASSIC)
    await _post(classic, 0, "/mpub?topic=t", b"x\ny")
    await classic.wait_for(lambda: classic.in_flight("t", "c") == 3)
    stats = (await _get(classic, 0, "/stats?format=json")).json()
    assert list(stats) == ["version", "health", "start_time", "topics", "memory", "producers"]
    assert stats["version"] == "1.3.0"
    [topic] = stats["topics"]
    assert list(topic) == [
        "topic_name",
        "channels",
        "depth",
        "backend_depth",
        "message_count",
        "message_bytes",
        "paused",
        "e2e_processing_latency",
    ]
    assert (topic["topic_name"], topic["depth"], topic["message_count"]) == ("t", 0, 3)
    assert topic["message_bytes"] == len(b"before-the-channel") + 2
    [channel] = topic["channels"]
    assert list(channel) == [
        "channel_name",
        "depth",
        "backend_depth",
        "in_flight_count",
        "deferred_count",
        "message_count",
        "requeue_count",
        "timeout_count",
        "client_count",
        "clients",
        "paused",
        "e2e_processing_latency",
    ]
    assert (channel["in_flight_count"], channel["message_count"], channel["client_count"]) == (
        3,
        3,
        1,
    )
    [client] = channel["clients"]
    assert client["client_id"] == "cl"
    assert "desired_tag" not in client
    assert "name" not in client
    assert stats["producers"] == []  # the publishes came over HTTP
    lean = (await _get(classic, 0, "/stats?format=json&include_clients=false&include_mem=0")).json()
    assert "memory" not in lean
    assert lean["topics"][0]["channels"][0]["clients"] is None
    await consumer.close()


@pytest.mark.parametrize("target", ["/pub_ext?topic=t", "/pubtrace?topic=t", "/nope"])
async def test_classic_has_no_youzan_endpoints(classic: Cluster, target: str) -> None:
    assert _answer(await _post(classic, 0, target)) == (404, _v1_error("NOT_FOUND"))
