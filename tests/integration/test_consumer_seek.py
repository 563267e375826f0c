"""A seek into a running ordered consumer (issue 28, item 3): the channel moved on purpose, so
the consumer checks the order anew from the new position and hands the replayed messages to
its handler, whether the seek came from this process's Admin or from elsewhere (seen in the
deliveries: the next message is not the one after the last). Before, with the defaults, the
handler got none of them (taken for replays); with skip_replays=False the seek counted as an
order violation, and with raise_on_order_violation=True the consumer stopped."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from smartnsq.admin import Admin
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.protocol.commands import StartPosition
from smartnsq.testing import Cluster
from smartnsq.transport.httpclient import new_http_client
from smartnsq.transport.offsets import set_channel_offset

TOPIC, CHANNEL = "orders", "billing"


async def _seek_from_elsewhere(cluster: Cluster, position: StartPosition) -> None:
    """What another process (the CLI, another service's Admin) does: nothing of it reaches
    this process's consumers but the deliveries."""
    leader = cluster.topology(TOPIC)[0]["leader"]
    http_address = cluster.nsqd_http_addresses[leader]
    async with new_http_client(5.0) as http:
        await set_channel_offset(http, http_address, TOPIC, 0, CHANNEL, position)


@pytest.mark.parametrize("where", ["admin", "elsewhere"])
@pytest.mark.parametrize(
    "options",
    [{}, {"skip_replays": False, "raise_on_order_violation": True}],
    ids=["defaults", "no-skip-strict"],
)
async def test_a_seek_backwards_replays_into_the_handler(
    where: str, options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.consumer")
    handled: list[int] = []
    done = asyncio.Event()

    def handle(message: Message) -> None:
        handled.append(int(message.body))
        if len(handled) == 20 + 15:
            done.set()

    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic(TOPIC, 1, 1, ordered=True, channels=[CHANNEL])
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            for number in range(1, 21):
                await producer.publish(TOPIC, b"%d" % number, partition=0)
        consumer = Consumer(
            TOPIC,
            CHANNEL,
            lookupd=[cluster.lookupd_url],
            handler=handle,
            ordered=True,
            reconnect_backoff=Backoff(initial=0.01, maximum=0.05),
            **options,
        )
        async with consumer:
            await cluster.wait_for(lambda: len(handled) == 20)
            position = StartPosition.message_count(6)
            if where == "admin":
                async with Admin([cluster.lookupd_url]) as admin:
                    await admin.seek(TOPIC, CHANNEL, position)
            else:
                await _seek_from_elsewhere(cluster, position)
            await asyncio.wait_for(done.wait(), 10)
            stats = consumer.stats()
    assert handled == list(range(1, 21)) + list(range(6, 21))  # the 15 again, in order
    assert (stats.replays_skipped, stats.order_violations) == (0, 0)
    assert stats.channel_moves >= 1
    assert any("the channel was moved" in r.getMessage() for r in caplog.records)
