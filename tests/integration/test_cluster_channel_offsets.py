"""The embedded nsqd moves a channel's consume position as real youzan nsqd does.

Fixtures come from ``channel_setoffset.txt`` (a copy of the capture): the same topic (1
partition x 2 replicas, channel auto-creation disabled, channel "c" registered), the same
messages (50 single PUBs a0..a49, then one MPUB of b0..b49) and, for each body of
``POST /channel/setoffset``, what the next 4-word SUB_ADVANCED read delivered. The error
answers follow youzan's ``doSetChannelOffset`` (nsqdserver/http.go), ``ConsumeOffset.FromBytes``
(nsqdserver/protocol_v2.go) and ``SetChannelOffset`` (nsqdserver/context.go).
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from smartnsq.protocol import commands as c
from smartnsq.protocol.message import MessageFrame, MessageLayout
from smartnsq.testing import Cluster
from tests.integration.rawclient import RawClient

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "nsqd_http" / "channel_setoffset.txt"
V1 = {"Accept": "application/vnd.nsq; version=1.0"}
DETAIL = MessageLayout.youzan(detail=True)
TOPIC, CHANNEL = "T", "c"
LEADER, REPLICA = 0, 1
NAMES = [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(50)]


def _capture_rows() -> list[tuple[str, int, bool]]:
    """(body, messages delivered, in queue order) for each row of the capture's table."""
    rows = []
    for line in RECORDED.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or ":" not in cells[0] or cells[0].startswith("body"):
            continue
        body, delivered = cells[0].split()[0], cells[1]
        counted = re.findall(r"(\d+) messages|\((\d+)\)", delivered)
        count = int("".join(counted[0])) if counted else 0  # "nothing": 0
        rows.append((body, count, "NOT in queue order" not in delivered))
    return rows


ROWS = _capture_rows()


def test_the_capture_table_is_read() -> None:
    assert [body for body, _, _ in ROWS] == [
        "virtual_queue:1960",
        "virtual_queue:1965",
        "msgcount:1",
        "msgcount:50",
        "msgcount:0",
        "timestamp:<unix",
        "special:-1",
    ]
    assert [count for _, count, _ in ROWS] == [40, 39, 100, 51, 100, 50, 0]


async def _setup(cluster: Cluster, *, next_second: bool = False) -> int:
    """The capture's set-up; returns the unix second from which b0..b49 were published
    (with ``next_second``, a later one than a0..a49's)."""
    await cluster.create_topic(TOPIC, 1, 2, channels=[CHANNEL], placement={0: [LEADER, REPLICA]})
    producer = await RawClient.identified(cluster.nsqd_addresses[LEADER])
    for name in NAMES[:50]:
        await producer.ok(c.pub(TOPIC, name.encode(), 0))
    second = int(time.time())
    if next_second:
        # the capture waited 2.5 s: here only until the clock enters the next second
        second += 1
        await cluster.wait_for(lambda: time.time() >= second, timeout=2)
    await producer.ok(c.mpub(TOPIC, [name.encode() for name in NAMES[50:]], 0))
    await producer.close()
    return second


async def _read(cluster: Cluster, count: int, node: int = LEADER) -> list[MessageFrame]:
    """A 4-word SUB_ADVANCED read of ``count`` messages, each FINed, then nothing more."""
    client = await RawClient.identified(cluster.nsqd_addresses[node])
    await client.ok(c.sub_advanced(TOPIC, CHANNEL, 0))
    client.send(c.rdy(200))
    seen = []
    for _ in range(count):
        message = await client.message(DETAIL)
        client.send(c.fin(message.id))
        seen.append(message)
    assert await client.silent(0.2)
    await client.close()
    await cluster.wait_for(
        lambda: not cluster.topics[TOPIC].partitions[0].log.channels[CHANNEL].clients
    )
    return seen


async def _setoffset(
    cluster: Cluster, body: bytes, node: int = LEADER, query: str | None = None
) -> httpx.Response:
    target = query if query is not None else f"topic={TOPIC}&partition=0&channel={CHANNEL}"
    url = f"http://{cluster.nsqd_http_addresses[node]}/channel/setoffset?{target}"
    async with httpx.AsyncClient(timeout=5) as http:
        return await http.post(url, content=body, headers=V1)


def _v1_error(message: str) -> bytes:
    # nsqd formats the body with Sprintf: quotes in the message are not escaped
    return b'{"message":"%s"}' % message.encode()


def _names(messages: list[MessageFrame]) -> list[str]:
    return [m.body.decode() for m in messages]


async def test_queue_offsets_are_the_captured_ones() -> None:
    async with Cluster(nodes=2) as cluster:
        await _setup(cluster)
        records = {r.body.decode(): r for r in cluster.messages(TOPIC, 0)}
        text = RECORDED.read_text()
        for name, offset in re.findall(r"([ab]\d+) at (\d+)", text):
            assert records[name].offset == int(offset), name
        assert records["b49"].raw_size == int(re.findall(r"raw size (\d+)", text)[0])


async def test_each_captured_body_moves_the_channel_as_recorded() -> None:
    async with Cluster(nodes=2) as cluster:
        second = await _setup(cluster, next_second=True)
        first = await _read(cluster, 100)
        assert _names(first) == NAMES  # a fresh registered channel: its first read is in order
        for body, count, in_order in ROWS:
            body = body.replace("<unix", str(second))
            answer = await _setoffset(cluster, body.encode())
            assert (answer.status_code, answer.content) == (200, b""), body
            seen = await _read(cluster, count)
            # every position delivers a suffix of the queue: the last `count` messages
            assert sorted(_names(seen), key=NAMES.index) == NAMES[len(NAMES) - count :], body
            if not in_order:
                assert _names(seen) != NAMES[len(NAMES) - count :], body


async def test_each_delivery_carries_its_queue_offset_and_raw_size() -> None:
    async with Cluster(nodes=2) as cluster:
        await _setup(cluster)
        assert (await _setoffset(cluster, b"virtual_queue:1960")).status_code == 200
        seen = await _read(cluster, 40)
        records = {r.body: r for r in cluster.messages(TOPIC, 0)}
        assert {(m.body, m.offset, m.raw_size) for m in seen} == {
            (body, r.offset, r.raw_size)
            for body, r in records.items()
            if body.startswith(b"b") and r.offset >= 1960
        }


async def test_a_reader_that_assumes_queue_order_after_a_seek_fails() -> None:
    """After a seek the capture saw b24, b31, b12...: the emulator re-reads the first messages
    after the new position in a shuffled order, so the chain offset -> offset + raw size breaks
    at once for a reader that takes deliveries in arrival order; one that orders by offset
    itself gets the exact chain."""
    async with Cluster(nodes=2) as cluster:
        await _setup(cluster)
        assert (await _setoffset(cluster, b"virtual_queue:1960")).status_code == 200
        seen = await _read(cluster, 40)

        def chained(messages: list[MessageFrame]) -> bool:
            return all(
                (a.offset or 0) + (a.raw_size or 0) == b.offset
                for a, b in itertools.pairwise(messages)
            )

        assert not chained(seen)
        ordered = sorted(seen, key=lambda m: m.offset or 0)
        assert chained(ordered)
        assert ordered[0].offset == 1960


async def test_messages_in_flight_are_forgotten_by_a_seek() -> None:
    """drainChannelWaiting (nsqd/channel.go): the in-flight messages are dropped, their
    owners' in-flight counts released; their FINs then fail, and the new position is read."""
    async with Cluster(nodes=2) as cluster:
        await _setup(cluster)
        client = await RawClient.identified(cluster.nsqd_addresses[LEADER])
        await client.ok(c.sub_advanced(TOPIC, CHANNEL, 0))
        client.send(c.rdy(3))
        held = [await client.message(DETAIL) for _ in range(3)]
        assert _names(held) == ["a0", "a1", "a2"]
        assert await client.silent(0.1)  # RDY 3: three in flight, nothing more
        assert (await _setoffset(cluster, b"msgcount:51")).status_code == 200  # b0
        after = [await client.message(DETAIL) for _ in range(3)]  # its RDY room came back
        assert set(_names(after)) <= set(NAMES[50:])
        error = await client.error(c.fin(held[0].id))
        assert error.startswith("E_FIN_FAILED")
        await client.close()


async def test_a_seek_reaches_the_replicas_copy_of_the_channel() -> None:
    """SetChannelConsumeOffsetToCluster syncs the new position to every replica (one that
    lacks the channel creates it there): after a failover the new leader resumes from it."""
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic(TOPIC, 1, 2, placement={0: [LEADER, REPLICA]})
        consumer = await RawClient.identified(cluster.nsqd_addresses[LEADER])
        await consumer.ok(c.sub_advanced(TOPIC, CHANNEL, 0))  # SUB creates it, leader only
        await consumer.close()
        producer = await RawClient.identified(cluster.nsqd_addresses[LEADER])
        await producer.ok(c.mpub(TOPIC, [f"m{i}".encode() for i in range(10)], 0))
        await producer.close()
        assert (await _setoffset(cluster, b"msgcount:4")).status_code == 200
        await cluster.stop_node(LEADER)
        await cluster.wait_for(lambda: cluster.leader(TOPIC, 0) == REPLICA)
        seen = await _read(cluster, 7, node=REPLICA)
        assert sorted(_names(seen)) == [f"m{i}" for i in range(3, 10)]


async def _channel_stats(cluster: Cluster, node: int) -> tuple[dict[str, Any], dict[str, Any]]:
    url = f"http://{cluster.nsqd_http_addresses[node]}/stats?format=json&topic={TOPIC}"
    async with httpx.AsyncClient(timeout=5) as http:
        [topic] = (await http.get(url, headers=V1)).json()["topics"]
    [channel] = topic["channels"]
    return topic, channel


async def test_stats_show_the_queue_and_the_channel_position_as_nsqd_names_them() -> None:
    """nsqd/stats.go: the topic's backend_start and backend_depth are the queue's first and
    end offsets; a channel's depth and backend_depth count the messages after its confirmed
    position, depth_size the bytes (so end - depth_size is where it resumes), backlogs the
    messages not read yet (diskQueueReader.updateDepth, Channel.Backlogs)."""
    async with Cluster(nodes=2) as cluster:
        await _setup(cluster)
        end = 3247 + 33
        topic, channel = await _channel_stats(cluster, LEADER)
        assert (topic["backend_start"], topic["backend_depth"], topic["depth"]) == (0, end, end)
        assert topic["message_count"] == 100
        client = await RawClient.identified(cluster.nsqd_addresses[LEADER])
        await client.ok(c.sub_advanced(TOPIC, CHANNEL, 0))
        client.send(c.rdy(3))
        held = [await client.message(DETAIL) for _ in range(3)]
        client.send(c.rdy(0) + c.fin(held[1].id) + c.fin(held[2].id))  # a0 stays in flight
        await cluster.wait_for(lambda: cluster.in_flight(TOPIC, CHANNEL, 0) == 1)
        _, channel = await _channel_stats(cluster, LEADER)
        # a0 holds the confirmed position at 0: a1 and a2 are finished but still counted
        assert (channel["depth"], channel["backend_depth"], channel["depth_size"]) == (
            100,
            100,
            end,
        )
        assert (channel["backlogs"], channel["in_flight_count"]) == (97, 1)
        assert (await _setoffset(cluster, b"virtual_queue:1960")).status_code == 200
        for node in (LEADER, REPLICA):
            _, channel = await _channel_stats(cluster, node)
            assert (channel["depth"], channel["depth_size"]) == (40, end - 1960), node
        await client.close()


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"", 406, "MSG_EMPTY"),
        (b"bogus", 400, "invalid consume offset:bogus"),
        (b"msgcount:1:2", 400, "invalid consume offset:msgcount:1:2"),
        (b"offset:5", 400, "invalid consume offset:offset:5"),
        (b"msgcount:x", 400, 'strconv.ParseInt: parsing "x": invalid syntax'),
        (b"virtual_queue:1960\n", 400, 'strconv.ParseInt: parsing "1960\\n": invalid syntax'),
        (b"special:-2", 500, "not supported offset type"),
        (b"timestamp:-1", 500, "Invalid timestamp -1"),
    ],
)
async def test_body_errors(body: bytes, status: int, message: str) -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic(TOPIC, 1, 2, channels=[CHANNEL], placement={0: [0, 1]})
        producer = await RawClient.identified(cluster.nsqd_addresses[LEADER])
        await producer.ok(c.pub(TOPIC, b"one", 0))
        await producer.close()
        answer = await _setoffset(cluster, body)
        assert (answer.status_code, answer.content) == (status, _v1_error(message))


@pytest.mark.parametrize(
    ("query", "node", "status", "message"),
    [
        ("partition=0&channel=c", LEADER, 400, "MISSING_ARG_TOPIC"),
        ("topic=T!&partition=0&channel=c", LEADER, 400, "INVALID_ARG_TOPIC"),
        ("topic=T&partition=x&channel=c", LEADER, 400, 'strconv.Atoi: parsing "x": invalid syntax'),
        ("topic=T&partition=0", LEADER, 400, "MISSING_ARG_CHANNEL"),
        ("topic=T&partition=0&channel=c!", LEADER, 400, "INVALID_ARG_CHANNEL"),
        ("topic=U&partition=0&channel=c", LEADER, 404, "E_TOPIC_NOT_EXIST"),
        ("topic=T&partition=1&channel=c", LEADER, 404, "E_TOPIC_NOT_EXIST"),
        ("topic=T&partition=0&channel=other", LEADER, 404, "CHANNEL_NOT_FOUND"),
        # a replica holds the registered channel: the leader check comes after the body's
        ("topic=T&partition=0&channel=c", REPLICA, 400, "E_FAILED_ON_NOT_LEADER"),
        # without a partition argument, nsqd's GetTopicPartitionArgs takes 0
        ("topic=T&channel=c", REPLICA, 400, "E_FAILED_ON_NOT_LEADER"),
    ],
)
async def test_query_errors_and_the_not_leader_answer(
    query: str, node: int, status: int, message: str
) -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic(TOPIC, 1, 2, channels=[CHANNEL], placement={0: [0, 1]})
        producer = await RawClient.identified(cluster.nsqd_addresses[LEADER])
        await producer.ok(c.pub(TOPIC, b"one", 0))
        await producer.close()
        answer = await _setoffset(cluster, b"msgcount:1", node=node, query=query)
        assert (answer.status_code, answer.content) == (status, _v1_error(message))


async def test_a_replica_without_the_channel_answers_channel_not_found() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic(TOPIC, 1, 2, placement={0: [0, 1]})
        await cluster.create_channel_on_leaders(TOPIC, CHANNEL)
        answer = await _setoffset(cluster, b"msgcount:1", node=REPLICA)
        assert (answer.status_code, answer.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"msgcount:1", 500, "commit log end of file"),
        (b"virtual_queue:0", 500, "commit log end of file"),
        (b"timestamp:1", 500, "commit log end of file"),
        (b"timestamp:-1", 500, "Invalid timestamp -1"),
        (b"special:-1", 200, None),
    ],
)
async def test_an_empty_partition(body: bytes, status: int, message: str | None) -> None:
    """The commit log search finds nothing in an empty partition; only the end exists."""
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic(TOPIC, 1, 2, channels=[CHANNEL], placement={0: [0, 1]})
        answer = await _setoffset(cluster, body)
        assert answer.status_code == status
        if message is not None:
            assert answer.json() == {"message": message}


@pytest.mark.parametrize(
    ("body", "first"),
    [
        (b"virtual_queue:-5", "a0"),  # before the start: the first message
        (b"virtual_queue:99999", None),  # past the end: the end
        (b"msgcount:-3", "a0"),
        (b"msgcount:101", None),
        (b"timestamp:4102444800", None),  # 2100
        (b"timestamp:0", "a0"),
    ],
)
async def test_positions_outside_the_queue(body: bytes, first: str | None) -> None:
    """The commit-log searches clamp: a position before the queue lands on its first
    message, one past it on the end (SearchLogByMsgOffset/Cnt/Timestamp)."""
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic(TOPIC, 1, 2, channels=[CHANNEL], placement={0: [0, 1]})
        producer = await RawClient.identified(cluster.nsqd_addresses[LEADER])
        await producer.ok(c.mpub(TOPIC, [name.encode() for name in NAMES], 0))
        await producer.close()
        assert (await _setoffset(cluster, body)).status_code == 200
        seen = await _read(cluster, 100 if first else 0)
        assert sorted(_names(seen), key=NAMES.index) == (NAMES if first else [])


async def test_classic_nsqd_has_no_setoffset() -> None:
    async with Cluster(classic=True) as cluster:
        url = f"http://{cluster.nsqd_http_addresses[0]}/channel/setoffset?topic=t&channel=c"
        async with httpx.AsyncClient(timeout=5) as http:
            answer = await http.post(url, content=b"msgcount:1", headers=V1)
        assert (answer.status_code, answer.json()) == (404, {"message": "NOT_FOUND"})


async def test_sub_advanced_msgcount_is_one_based_too() -> None:
    """SUB_ADVANCED's start position goes through the same SetChannelOffset search: msgcount
    N starts at the N-th message (tcp_sub_advanced.txt's msgcount:0 starts at the first)."""
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic(TOPIC, 1, 2, channels=[CHANNEL], placement={0: [0, 1]})
        producer = await RawClient.identified(cluster.nsqd_addresses[LEADER])
        await producer.ok(c.mpub(TOPIC, [name.encode() for name in NAMES[:5]], 0))
        await producer.close()
        client = await RawClient.identified(cluster.nsqd_addresses[LEADER])
        await client.ok(c.sub_advanced(TOPIC, CHANNEL, 0, c.StartPosition.message_count(2)))
        client.send(c.rdy(10))
        seen = [await client.message(DETAIL) for _ in range(4)]
        assert _names(seen) == ["a1", "a2", "a3", "a4"]  # in order, as tcp_sub_advanced.txt
        await client.close()


async def test_sub_advanced_with_four_words_honours_the_partition() -> None:
    """4 words: the partition named is the one subscribed, and every frame carries the
    queue block of that partition's queue (tcp_sub_advanced.txt)."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic(TOPIC, 2, 1, placement={0: [0], 1: [0]})
        client = await RawClient.identified(cluster.nsqd_addresses[0])
        await client.ok(c.sub_advanced(TOPIC, CHANNEL, 1))
        client.send(c.rdy(5))
        producer = await RawClient.identified(cluster.nsqd_addresses[0])
        await producer.ok(c.pub(TOPIC, b"on zero", 0))
        await producer.ok(c.pub(TOPIC, b"one", 1))
        await producer.ok(c.pub(TOPIC, b"two", 1))
        seen = [await client.message(DETAIL) for _ in range(2)]
        assert [(m.body, m.offset, m.raw_size) for m in seen] == [(b"one", 0, 33), (b"two", 33, 33)]
        for client_ in (client, producer):
            await client_.close()
