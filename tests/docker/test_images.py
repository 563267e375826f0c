"""The youzan and classic clusters against real images, when the environment names them
(``$SMARTNSQ_YOUZAN_IMAGE`` with ``$SMARTNSQ_ETCD_IMAGE`` or its default, and
``$SMARTNSQ_CLASSIC_IMAGE``); skipped otherwise (no registry is reachable in CI)."""

from __future__ import annotations

import asyncio
import os

import pytest

import smartnsq
from smartnsq.testing.containers import (
    ENV_CLASSIC_IMAGE,
    ENV_YOUZAN_IMAGE,
    ClassicContainerCluster,
    YouzanContainerCluster,
)

needs_youzan = pytest.mark.skipif(
    not os.environ.get(ENV_YOUZAN_IMAGE), reason=f"${ENV_YOUZAN_IMAGE} names no youzan image"
)
needs_classic = pytest.mark.skipif(
    not os.environ.get(ENV_CLASSIC_IMAGE), reason=f"${ENV_CLASSIC_IMAGE} names no nsq image"
)


async def _round_trip(
    cluster: YouzanContainerCluster | ClassicContainerCluster, topic: str
) -> None:
    bodies = [f"m{i}".encode() for i in range(10)]
    async with cluster.producer() as producer:
        for body in bodies:
            assert (await producer.publish(topic, body)).address in cluster.nsqd_addresses
    received: list[bytes] = []
    done = asyncio.Event()

    async def handle(message: smartnsq.Message) -> None:
        received.append(message.body)
        if len(received) == len(bodies):
            done.set()

    async with cluster.consumer(topic, "c", handler=handle, max_in_flight=20):
        await asyncio.wait_for(done.wait(), 30)
    assert sorted(received) == bodies


@needs_youzan
@pytest.mark.timeout(600)
async def test_youzan_cluster_with_a_failover() -> None:
    async with YouzanContainerCluster(3) as cluster:
        await cluster.create_topic("orders", 2, 2, channels=["c"])
        await _round_trip(cluster, "orders")
        await asyncio.to_thread(cluster.kill, 0)
        async with cluster.producer() as producer:  # rides out the failover (publish_timeout)
            result = await producer.publish("orders", b"after the crash", partition=0)
        assert result.address != cluster.nsqd_addresses[0]
        await asyncio.to_thread(cluster.start, 0)


@needs_classic
@pytest.mark.timeout(300)
async def test_classic_cluster() -> None:
    async with ClassicContainerCluster() as cluster:
        await cluster.create_topic("events", channels=["c"])
        await _round_trip(cluster, "events")
        await asyncio.to_thread(cluster.stop, 0)
        await asyncio.to_thread(cluster.start, 0)
        async with cluster.producer() as producer:
            assert (await producer.publish("events", b"again")).address == cluster.nsqd_addresses[0]
