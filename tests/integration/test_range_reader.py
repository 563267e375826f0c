"""RangeReader against the embedded cluster: exactly the messages of [start, end), in queue
order, whatever order nsqd delivers them in after the seek (the emulator shuffles the first
ones, as the capture shows); the channel left at the range's end; a leader failover in the
middle of a read, with a slow caller; a range the queue no longer holds; ordered topics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

import smartnsq
from smartnsq.errors import DataLossError
from smartnsq.flow.ranges import OffsetRange
from smartnsq.protocol.message import MessageFrame
from smartnsq.testing import Cluster
from smartnsq.transport.connection import ConnectionConfig
from smartnsq.transport.httpclient import new_http_client
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.offsets import read_channel_offsets
from smartnsq.transport.ranges import RangeReader, locate


@pytest.fixture
async def clients(nsq_cluster: Cluster) -> AsyncIterator[tuple[LookupManager, httpx.AsyncClient]]:
    lookup = LookupManager([nsq_cluster.lookupd_url])
    http = new_http_client(10.0)
    try:
        yield lookup, http
    finally:
        await http.aclose()
        await lookup.close()


async def _publish(cluster: Cluster, topic: str, count: int, partition: int = 0) -> list[bytes]:
    bodies = [f"m{i}".encode() for i in range(count)]
    async with smartnsq.Producer(lookupd=[cluster.lookupd_url]) as producer:
        for start in range(0, count, 500):
            await producer.publish_many(topic, bodies[start : start + 500], partition=partition)
    return bodies


async def _read(reader: RangeReader, pause: float = 0.0) -> list[MessageFrame]:
    frames = []
    async for batch in reader.read():
        frames.extend(batch)
        if pause:
            await asyncio.sleep(pause)  # a slow caller: the reader pauses nsqd's flow
    return frames


def _reader(
    clients: tuple[LookupManager, httpx.AsyncClient],
    topic: str,
    span: OffsetRange,
    **options: object,
) -> RangeReader:
    lookup, http = clients
    return RangeReader(lookup, http, ConnectionConfig(), topic, "c", span, **options)  # type: ignore[arg-type]


@pytest.mark.nsq_cluster(nodes=2)
async def test_exactly_the_range_in_order_and_the_channel_left_at_its_end(
    nsq_cluster: Cluster, clients: tuple[LookupManager, httpx.AsyncClient]
) -> None:
    await nsq_cluster.create_topic("T", 1, 2, channels=["c"])
    await _publish(nsq_cluster, "T", 300)
    logged = nsq_cluster.messages("T", 0)
    # From inside message 40 (the range begins at message 41, as nsqd's seek would) to 250.
    span = OffsetRange(0, logged[40].offset + 5, logged[250].offset)
    reader = _reader(clients, "T", span)
    frames = await _read(reader)
    assert [(f.offset, f.body) for f in frames] == [(m.offset, m.body) for m in logged[41:250]]
    chain = reader.chain
    assert chain is not None
    assert chain.anchor == logged[41].offset
    # The read began before the start (to prove where the range begins) and nsqd sent
    # messages past its end: none of them came out.
    assert chain.outside > 0
    lookup, http = clients
    leader = (await lookup.lookup("T")).leader(0)
    assert leader is not None
    offsets = await read_channel_offsets(http, leader.http_address, "T", 0, "c")
    assert offsets.position == logged[250].offset  # what lies past the end was not finished
    assert offsets.depth == 50


@pytest.mark.nsq_cluster(nodes=2)
async def test_a_slow_caller_and_a_leader_failover_in_the_middle_of_a_read(
    nsq_cluster: Cluster, clients: tuple[LookupManager, httpx.AsyncClient]
) -> None:
    await nsq_cluster.create_topic("T", 1, 2, channels=["c"])
    bodies = await _publish(nsq_cluster, "T", 8000)
    end = nsq_cluster.messages("T", 0)[-1]
    span = OffsetRange(0, 0, end.offset + end.raw_size)
    reader = _reader(clients, "T", span, start_is_boundary=True, max_buffered=500)
    leader = nsq_cluster.leader("T", 0)
    assert leader is not None
    frames: list[MessageFrame] = []
    async for batch in reader.read():
        frames.extend(batch)
        if len(frames) >= 1000 and nsq_cluster.leader("T", 0) == leader:
            await nsq_cluster.move_leader("T", 0, 1 - leader)
        await asyncio.sleep(0.001)
    assert [f.body for f in frames] == bodies
    assert reader.reopened >= 1
    assert reader.leader is not None
    assert reader.leader.tcp_address == nsq_cluster.nsqd_addresses[1 - leader]


@pytest.mark.nsq_cluster(nodes=1)
async def test_a_range_past_the_queue_end_is_data_loss(
    nsq_cluster: Cluster, clients: tuple[LookupManager, httpx.AsyncClient]
) -> None:
    await nsq_cluster.create_topic("T", 1, 1, channels=["c"])
    bodies = await _publish(nsq_cluster, "T", 10)
    end = nsq_cluster.messages("T", 0)[-1]
    past = OffsetRange(0, 0, end.offset + end.raw_size + 100)
    with pytest.raises(DataLossError, match="past the queue's end"):
        await _read(_reader(clients, "T", past))
    frames = await _read(_reader(clients, "T", past, fail_on_data_loss=False))
    assert [f.body for f in frames] == bodies


@pytest.mark.nsq_cluster(nodes=1)
async def test_an_ordered_topic_is_read_with_sub_ordered(
    nsq_cluster: Cluster, clients: tuple[LookupManager, httpx.AsyncClient]
) -> None:
    await nsq_cluster.create_topic("T", 2, 1, ordered=True, channels=["c"])
    await _publish(nsq_cluster, "T", 200, partition=1)
    logged = nsq_cluster.messages("T", 1)
    span = OffsetRange(1, logged[10].offset, logged[190].offset)
    frames = await _read(_reader(clients, "T", span))
    assert [f.offset for f in frames] == [m.offset for m in logged[10:190]]


@pytest.mark.nsq_cluster(nodes=1)
async def test_locate_finds_where_a_timestamp_lands(
    nsq_cluster: Cluster, clients: tuple[LookupManager, httpx.AsyncClient]
) -> None:
    from smartnsq.protocol.commands import StartPosition

    await nsq_cluster.create_topic("T", 1, 1, channels=["c"])
    await _publish(nsq_cluster, "T", 20)
    logged = nsq_cluster.messages("T", 0)
    lookup, http = clients
    leader = (await lookup.lookup("T")).leader(0)
    assert leader is not None
    first_second = logged[0].timestamp // 1_000_000_000
    at = await locate(http, leader.http_address, "T", 0, "c", StartPosition.timestamp(first_second))
    assert at == 0
    beyond = await locate(
        http, leader.http_address, "T", 0, "c", StartPosition.timestamp(first_second + 3600)
    )
    assert beyond == logged[-1].offset + logged[-1].raw_size
