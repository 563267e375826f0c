"""Admin.seek and Admin.offsets against the embedded cluster: a channel's position per
partition, moved through each partition's leader (/channel/setoffset) and read from its
/stats; classic nsqd has no offsets."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Literal

import httpx
import pytest

from smartnsq.admin import Admin, PartitionOffsets, SeekResult
from smartnsq.errors import (
    AdminError,
    NotLeaderError,
    TopicNotFoundError,
    UnsupportedFeatureError,
    ValidationError,
)
from smartnsq.protocol import commands as c
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.message import MessageFrame, MessageLayout
from smartnsq.testing import Cluster
from smartnsq.transport.offsets import set_channel_offset
from tests.integration.rawclient import RawClient

DETAIL = MessageLayout.youzan(detail=True)
TOPIC, CHANNEL = "orders", "billing"


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """2 partitions x 2 replicas on 3 nodes, channel "billing" registered; partition 0 holds
    m0..m9 (raw sizes 32), partition 1 holds n0..n4."""
    async with Cluster(nodes=3) as cluster:
        await cluster.create_topic(
            TOPIC, 2, 2, channels=[CHANNEL], placement={0: [0, 1], 1: [1, 2]}
        )
        producer = await RawClient.identified(cluster.nsqd_addresses[0])
        await producer.ok(c.mpub(TOPIC, [b"m%d" % i for i in range(10)], 0))
        await producer.close()
        producer = await RawClient.identified(cluster.nsqd_addresses[1])
        await producer.ok(c.mpub(TOPIC, [b"n%d" % i for i in range(5)], 1))
        await producer.close()
        yield cluster


async def _consume(cluster: Cluster, partition: int, count: int) -> list[MessageFrame]:
    """Read and finish ``count`` messages of a partition on its leader, then leave."""
    leader = cluster.leader(TOPIC, partition)
    assert leader is not None
    client = await RawClient.identified(cluster.nsqd_addresses[leader])
    await client.ok(c.sub_advanced(TOPIC, CHANNEL, partition))
    client.send(c.rdy(count))
    seen = [await client.message(DETAIL) for _ in range(count)]
    client.send(c.rdy(0))  # no more than asked
    for message in seen:
        client.send(c.fin(message.id))
    await cluster.wait_for(lambda: cluster.in_flight(TOPIC, CHANNEL, partition) == 0)
    await client.close()
    return seen


async def test_offsets_per_partition(cluster: Cluster) -> None:
    await _consume(cluster, 0, 4)
    async with Admin([cluster.lookupd_url]) as admin:
        offsets = await admin.offsets(TOPIC, CHANNEL)
    leaders = [cluster.nsqd_http_addresses[cluster.leader(TOPIC, p) or 0] for p in (0, 1)]
    assert offsets == [
        PartitionOffsets(0, leaders[0], start=0, end=320, position=128, depth=6, messages=10),
        PartitionOffsets(1, leaders[1], start=0, end=160, position=0, depth=5, messages=5),
    ]
    assert [o.lag for o in offsets] == [192, 160]


@pytest.mark.parametrize(
    ("position", "expected"),
    [
        (StartPosition.earliest(), 0),
        (StartPosition.latest(), 320),
        (StartPosition.message_count(3), 64),  # 1-based: the 3rd message
        (StartPosition.queue_offset(65), 96),  # inside the 3rd: the next message
        (StartPosition.queue_offset(96), 96),
    ],
)
async def test_seek_moves_the_channel_of_each_partition(
    cluster: Cluster, position: StartPosition, expected: int
) -> None:
    await _consume(cluster, 0, 5)
    async with Admin([cluster.lookupd_url]) as admin:
        results = await admin.seek(TOPIC, CHANNEL, position)
        offsets = await admin.offsets(TOPIC, CHANNEL)
    leaders = [cluster.nsqd_http_addresses[cluster.leader(TOPIC, p) or 0] for p in (0, 1)]
    partition_1 = {0: 0, 320: 160, 64: 64, 96: 96}[expected]
    assert results == [
        SeekResult(0, leaders[0], position, offset=expected, end=320),
        SeekResult(1, leaders[1], position, offset=partition_1, end=160),
    ]
    assert [o.position for o in offsets] == [expected, partition_1]


@pytest.mark.parametrize(
    ("name", "position"),
    [("earliest", StartPosition.earliest()), ("latest", StartPosition.latest())],
)
async def test_seek_takes_the_names_a_consumer_start_takes(
    cluster: Cluster, name: Literal["earliest", "latest"], position: StartPosition
) -> None:
    """Consumer(start="earliest") works, and so does the same word here (Kafka's names)."""
    await _consume(cluster, 0, 5)
    async with Admin([cluster.lookupd_url]) as admin:
        results = await admin.seek(TOPIC, CHANNEL, name)
        offsets = await admin.offsets(TOPIC, CHANNEL)
    assert [r.position for r in results] == [position, position]
    expected = [0, 0] if name == "earliest" else [320, 160]
    assert [r.offset for r in results] == [o.position for o in offsets] == expected


@pytest.mark.parametrize(
    ("position", "past_end"),
    [
        (StartPosition.message_count(999), [True, True]),
        (StartPosition.queue_offset(10**6), [True, True]),
        # message 11 of 10 is the end itself, as offset 320 of 320 is: not past it
        (StartPosition.message_count(11), [False, True]),
        (StartPosition.queue_offset(320), [False, True]),
    ],
)
async def test_a_seek_past_the_end_says_each_partition_went_to_the_end(
    cluster: Cluster, position: StartPosition, past_end: list[bool]
) -> None:
    # nsqd moves a position past the queue's end to the end and answers 200 all the same.
    async with Admin([cluster.lookupd_url]) as admin:
        results = await admin.seek(TOPIC, CHANNEL, position)
        offsets = await admin.offsets(TOPIC, CHANNEL)
    assert [(r.offset, r.end) for r in results] == [(320, 320), (160, 160)]
    assert [r.past_end for r in results] == past_end
    assert [o.position for o in offsets] == [320, 160]


async def test_a_seek_whose_report_cannot_be_read_still_moves(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def unreadable(*args: object) -> PartitionOffsets:
        raise AdminError("stats unreadable", status=500)

    monkeypatch.setattr("smartnsq.admin.read_channel_offsets", unreadable)
    async with Admin([cluster.lookupd_url]) as admin:
        [result] = await admin.seek(TOPIC, CHANNEL, StartPosition.latest(), partitions=[0])
    assert (result.empty, result.offset, result.end, result.past_end) == (False, None, None, False)
    assert "moved to latest, but reading where it went failed" in caplog.text
    assert cluster.depth(TOPIC, CHANNEL, 0) == 0


async def test_seek_by_timestamp(cluster: Cluster) -> None:
    second = int(time.time()) + 1
    await cluster.wait_for(lambda: time.time() >= second, timeout=2)
    producer = await RawClient.identified(cluster.nsqd_addresses[0])
    await producer.ok(c.pub(TOPIC, b"later", 0))
    await producer.close()
    async with Admin([cluster.lookupd_url]) as admin:
        await admin.seek(TOPIC, CHANNEL, StartPosition.timestamp(second), partitions=[0])
        [offsets, _] = await admin.offsets(TOPIC, CHANNEL)
    assert (offsets.position, offsets.depth) == (320, 1)
    [message] = await _consume(cluster, 0, 1)
    assert message.body == b"later"


async def test_seek_only_the_partitions_asked(cluster: Cluster) -> None:
    async with Admin([cluster.lookupd_url]) as admin:
        [result] = await admin.seek(TOPIC, CHANNEL, StartPosition.latest(), partitions=[1, 1])
        offsets = await admin.offsets(TOPIC, CHANNEL)
    assert result.partition == 1
    assert [(o.position, o.depth) for o in offsets] == [(0, 10), (160, 0)]


async def test_a_seek_redelivers_what_was_consumed(cluster: Cluster) -> None:
    first = await _consume(cluster, 0, 10)
    async with Admin([cluster.lookupd_url]) as admin:
        await admin.seek(TOPIC, CHANNEL, StartPosition.message_count(6), partitions=[0])
    again = await _consume(cluster, 0, 5)
    # (partition, offset) names a stored message: the same keys come back
    assert {(0, m.offset) for m in again} == {(0, m.offset) for m in first[5:]}


async def test_an_empty_partition_is_left_as_it_is() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("empty", 1, 1, channels=["c"])
        async with Admin([cluster.lookupd_url]) as admin:
            [result] = await admin.seek("empty", "c", StartPosition.earliest())
            [offsets] = await admin.offsets("empty", "c")
    assert result.empty
    assert (offsets.start, offsets.end, offsets.position, offsets.depth) == (0, 0, 0, 0)


async def test_a_channel_the_leader_does_not_have(cluster: Cluster) -> None:
    async with Admin([cluster.lookupd_url]) as admin:
        with pytest.raises(AdminError) as caught:
            await admin.seek(TOPIC, "nobody", StartPosition.earliest())
        offsets = await admin.offsets(TOPIC, "nobody")
    assert caught.value.status == 404
    assert "CHANNEL_NOT_FOUND" in str(caught.value)
    assert "'nobody'" in str(caught.value)
    assert [(o.position, o.depth, o.lag) for o in offsets] == [(None, None, None)] * 2
    assert [o.end for o in offsets] == [320, 160]


async def test_a_failure_after_a_move_names_the_moved_partitions() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("t", 2, 1, placement={0: [0], 1: [1]})
        consumer = await RawClient.identified(cluster.nsqd_addresses[0])
        await consumer.ok(c.sub("t", "c", 0))  # the channel exists on partition 0 only
        await consumer.close()
        async with Admin([cluster.lookupd_url]) as admin:
            with pytest.raises(AdminError) as caught:
                await admin.seek("t", "c", StartPosition.earliest())
    assert "partition 1:" in str(caught.value)
    assert "CHANNEL_NOT_FOUND" in str(caught.value)
    assert "partitions 0 were moved" in str(caught.value)


async def test_unknown_topic_and_partition(cluster: Cluster) -> None:
    async with Admin([cluster.lookupd_url]) as admin:
        with pytest.raises(TopicNotFoundError):
            await admin.offsets("nothing", CHANNEL)
        with pytest.raises(ValidationError, match=r"partitions 0\.\.1, not 2"):
            await admin.seek(TOPIC, CHANNEL, StartPosition.earliest(), partitions=[2])


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((TOPIC, CHANNEL, "first"), {}),
        ((TOPIC, CHANNEL, "offset:0"), {}),  # text forms are StartPosition.parse's to read
        ((TOPIC, CHANNEL, 5), {}),
        (("bad topic", CHANNEL, StartPosition.earliest()), {}),
        ((TOPIC, "", StartPosition.earliest()), {}),
        ((TOPIC, CHANNEL, StartPosition.earliest()), {"partitions": [-1]}),
        ((TOPIC, CHANNEL, StartPosition.earliest()), {"partitions": []}),
        ((TOPIC, CHANNEL, StartPosition.earliest()), {"partitions": "0"}),
        ((TOPIC, CHANNEL, StartPosition.earliest()), {"partitions": [True]}),
    ],
)
async def test_bad_arguments_raise_before_anything_is_sent(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    # nothing listens there: any request would raise ConnectionClosedError instead
    async with Admin(["127.0.0.1:9"]) as admin:
        with pytest.raises(ValidationError):
            await admin.seek(*args, **kwargs)  # type: ignore[arg-type]


async def test_classic_nsqd_has_no_offsets() -> None:
    async with Cluster(classic=True) as cluster:
        for admin in (
            Admin([cluster.lookupd_url]),
            Admin(nsqd_http=cluster.nsqd_http_addresses),
        ):
            async with admin:
                with pytest.raises(UnsupportedFeatureError, match="classic nsqd has no queue"):
                    await admin.seek("t", "c", StartPosition.earliest())
                with pytest.raises(UnsupportedFeatureError, match="classic nsqd has no queue"):
                    await admin.offsets("t", "c")


async def test_a_node_that_does_not_lead_refuses_and_admin_finds_the_leader(
    cluster: Cluster,
) -> None:
    replica = cluster.nsqd_http_addresses[1]  # partition 0: leader 0, replica 1
    async with httpx.AsyncClient() as http:
        with pytest.raises(NotLeaderError):
            await set_channel_offset(http, replica, TOPIC, 0, CHANNEL, StartPosition.latest())
    async with Admin([cluster.lookupd_url]) as admin:
        # as if the leader had moved after the lookup: the stale address is refused, the
        # partition is looked up again and the seek goes to the leader
        result = await admin._seek_one(TOPIC, 0, CHANNEL, StartPosition.latest(), replica)
        [offsets, _] = await admin.offsets(TOPIC, CHANNEL)
    assert result.leader == cluster.nsqd_http_addresses[0]
    assert offsets.position == 320
