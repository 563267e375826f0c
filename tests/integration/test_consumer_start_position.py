"""A known incompatibility of the Consumer with real youzan nsqd, kept visible.

youzan nsqd reads SUB_ADVANCED's partition only when the command has 4 words: with a start
position (5 words) it subscribes to the partition the node leads by default, whatever
partition the command names (protocol_v2.go internalSUB; youzan go-nsq sends the same 5
words). The Consumer sends ``SUB_ADVANCED <topic> <channel> <partition> <start>`` per
partition, so on a node leading several partitions of a topic every connection lands on the
same one and the others are never consumed. The embedded cluster answers as nsqd does.
"""

from __future__ import annotations

import pytest

from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.producer import Producer
from smartnsq.protocol.commands import StartPosition
from smartnsq.retry import Backoff
from smartnsq.testing import Cluster


@pytest.mark.xfail(
    strict=True,
    reason="SUB_ADVANCED with a start position subscribes to the node's default partition",
)
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
            start=StartPosition.message_count(0),
            reconnect_backoff=Backoff(initial=0.01, maximum=0.05),
        )
        async with consumer:
            await cluster.wait_for(lambda: len(seen) == 2, timeout=1)
        assert sorted(m.body for m in seen) == [b"p0", b"p1"]
