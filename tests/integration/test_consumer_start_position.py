"""A consumer's start position on real youzan nsqd.

youzan nsqd reads SUB_ADVANCED's partition only when the command has 4 words: with a start
position (5 words) it subscribes to the partition the node leads by default, whatever
partition the command names (protocol_v2.go internalSUB; youzan go-nsq sends the same 5
words), so on a node leading several partitions every connection landed on the same one.
The Consumer positions each partition's channel over HTTP on its leader
(``/channel/setoffset``) and subscribes with the 4-word form. The embedded cluster answers as
nsqd does.
"""

from __future__ import annotations

from typing import Any

import pytest

from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.errors import UnsupportedFeatureError
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.protocol.commands import StartPosition
from smartnsq.testing import Cluster

FAST = Backoff(initial=0.01, maximum=0.05)


async def test_start_position_on_a_node_leading_two_partitions() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 2, 1, channels=["c"], placement={0: [0], 1: [0]})
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("t", b"p0", partition=0)
            await producer.publish("t", b"p1", partition=1)
        seen: list[Message] = []
        consumer = Consumer(
            "t",
            "c",
            lookupd=[cluster.lookupd_url],
            handler=seen.append,
            max_in_flight=10,
            start=StartPosition.message_count(1),
            reconnect_backoff=FAST,
        )
        async with consumer:
            await cluster.wait_for(lambda: len(seen) == 2, timeout=1)
        assert sorted(m.body for m in seen) == [b"p0", b"p1"]


async def _publish(cluster: Cluster, bodies: list[bytes], partition: int = 0) -> None:
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        for body in bodies:
            await producer.publish("t", body, partition=partition)


async def test_every_message_carries_its_queue_offset_and_partition() -> None:
    """(partition, offset) identifies a stored message: set on every youzan delivery, not
    only ordered ones; each message is labelled with its own partition."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 2, 1, channels=["c"], placement={0: [0], 1: [0]})
        await _publish(cluster, [b"a0", b"a1"], partition=0)
        await _publish(cluster, [b"b0"], partition=1)
        seen: list[Message] = []
        consumer = Consumer(
            "t", "c", lookupd=[cluster.lookupd_url], handler=seen.append, reconnect_backoff=FAST
        )
        async with consumer:
            await cluster.wait_for(lambda: len(seen) == 3)
        keys = sorted((m.partition, m.offset, m.body) for m in seen)
        assert [(p, b) for p, _, b in keys] == [(0, b"a0"), (0, b"a1"), (1, b"b0")]
        first, second = (m for m in sorted(seen, key=lambda m: m.body) if m.partition == 0)
        assert first.offset == 0
        assert first.raw_size is not None
        assert second.offset == first.offset + first.raw_size  # the queue chain


# start="earliest", as Kafka users write it, is StartPosition.earliest(): it was accepted,
# then the subscription failed and retried forever in the background.
@pytest.mark.parametrize("start", [StartPosition.earliest(), "earliest"], ids=["position", "name"])
async def test_start_replays_what_the_channel_had_finished_once_per_partition(start: Any) -> None:
    """``start=earliest``: the channel is moved back on each partition's leader when the
    consumer first subscribes, and only then (a reconnection does not move it again)."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        await _publish(cluster, [b"m0", b"m1", b"m2"])
        first: list[bytes] = []
        async with Consumer(
            "t", "c", lookupd=[cluster.lookupd_url], handler=lambda m: first.append(m.body)
        ):
            await cluster.wait_for(lambda: len(first) == 3)
            await cluster.wait_for(lambda: cluster.unfinished("t", "c") == 0)
        again: list[bytes] = []
        consumer = Consumer(
            "t",
            "c",
            lookupd=[cluster.lookupd_url],
            handler=lambda m: again.append(m.body),
            start=start,
            reconnect_backoff=FAST,
        )
        async with consumer:
            await cluster.wait_for(lambda: len(again) == 3)
            await cluster.wait_for(lambda: cluster.unfinished("t", "c") == 0)
            await cluster.drop_connections(0, producers=False)
            await cluster.wait_for(lambda: consumer.stats().connects == 2)
            await _publish(cluster, [b"m3"])
            await cluster.wait_for(lambda: len(again) == 4)
        assert sorted(again) == [b"m0", b"m1", b"m2", b"m3"]  # m0..m2 once more, not thrice


async def test_an_ordered_consumer_can_start_from_a_position() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, ordered=True, channels=["c"])
        await _publish(cluster, [b"m0", b"m1", b"m2", b"m3"])
        seen: list[Message] = []
        consumer = Consumer(
            "t",
            "c",
            lookupd=[cluster.lookupd_url],
            handler=seen.append,
            ordered=True,
            start=StartPosition.message_count(2),  # 1-based: from the second message
            reconnect_backoff=FAST,
        )
        async with consumer:
            await cluster.wait_for(lambda: len(seen) == 3)
        assert [m.body for m in seen] == [b"m1", b"m2", b"m3"]


async def test_a_start_position_on_classic_nsqd_is_refused() -> None:
    async with Cluster(classic=True, nodes=1) as cluster:
        consumer = Consumer(
            "t",
            "c",
            nsqd=cluster.nsqd_addresses,
            handler=lambda m: None,
            start=StartPosition.earliest(),
        )
        with pytest.raises(UnsupportedFeatureError, match="queue offsets"):
            await consumer.start()
