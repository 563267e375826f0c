"""The emulated nsqd writes to its clients as nsqd does (nsqio/nsq nsqd/protocol_v2.go Send
and messagePump, client_v2.go's buffered writer; youzan's internalSend): every response or
error frame is flushed as it is written, one write per frame; message frames are buffered up
to output_buffer_size, flushed at once when the client is not ready for more, else at the
next tick of the output_buffer_timeout ticker."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_TYPE_RESPONSE, Frame, encode_frame
from smartnsq.protocol.message import MessageLayout
from smartnsq.testing import Cluster
from smartnsq.testing.nsqd import ClientSession
from tests.integration.rawclient import RawClient
from tests.integration.spy import spy_writes

OK_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"OK")


def _session(cluster: Cluster, *, subscribed: bool = False) -> ClientSession:
    """The one session of node 0 (``subscribed``: the one subscribed)."""
    sessions = [s for s in cluster.nodes[0].sessions if not subscribed or s.channel is not None]
    assert len(sessions) == 1
    return sessions[0]


async def _publish(cluster: Cluster, *bodies: bytes) -> None:
    publisher = await RawClient.identified(cluster.nsqd_addresses[0])
    for body in bodies:
        await publisher.ok(commands.pub("t", body))
    await publisher.close()


async def test_each_response_is_its_own_write(classic: Cluster) -> None:
    """Three PUBs in one read: three writes of one OK each (not one write of three)."""
    client = await RawClient.identified(classic.nsqd_addresses[0])
    session = _session(classic)
    writes = spy_writes(session.transport)
    client.send(b"".join(commands.pub("t", f"m{i}".encode()) for i in range(3)))
    for _ in range(3):
        assert await client.frame() == Frame(FRAME_TYPE_RESPONSE, b"OK")
    assert writes == [OK_FRAME] * 3
    await client.close()


async def test_an_error_is_flushed_at_once_too(classic: Cluster) -> None:
    client = await RawClient.identified(classic.nsqd_addresses[0])
    writes = spy_writes(_session(classic).transport)
    client.send(commands.pub("t", b"a") + commands.fin(b"0" * 16) + commands.pub("t", b"b"))
    assert (await client.frame()).data == b"OK"
    assert (await client.frame()).data.startswith(b"E_INVALID")
    assert len(writes) == 2  # the fatal error, then nothing more
    assert await client.closed()


async def _subscribed(
    cluster: Cluster, rdy: int, **identify: object
) -> tuple[RawClient, ClientSession]:
    client = await RawClient.identified(cluster.nsqd_addresses[0], **identify)
    await client.ok(commands.sub("t", "c"))
    session = _session(cluster, subscribed=True)
    client.send(commands.rdy(rdy))
    await cluster.wait_for(lambda: session.rdy == rdy)
    return client, session


async def test_a_message_waits_for_the_output_buffer_ticker_while_the_client_is_ready(
    classic: Cluster,
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    client, session = await _subscribed(classic, 10, output_buffer_timeout=1000)
    writes = spy_writes(session.transport)
    await _publish(classic, b"hello")
    await classic.wait_for(lambda: session.in_flight == 1)
    assert writes == []  # buffered: the client may take 9 more
    message = await client.message(MessageLayout.classic(), timeout=5)
    assert message.body == b"hello"
    assert loop.time() - started >= 0.9  # the ticker's first tick, 1 s after IDENTIFY
    assert len(writes) == 1
    await client.close()


async def test_a_message_leaves_at_once_when_the_client_is_not_ready_for_more(
    classic: Cluster,
) -> None:
    client, session = await _subscribed(classic, 1, output_buffer_timeout=1000)
    writes = spy_writes(session.transport)
    await _publish(classic, b"hello")
    await classic.wait_for(lambda: session.in_flight == 1)
    assert len(writes) == 1  # in flight == RDY: flushed with no tick
    assert (await client.message(MessageLayout.classic(), timeout=0.5)).body == b"hello"
    await client.close()


async def test_messages_leave_once_the_output_buffer_is_full(classic: Cluster) -> None:
    """output_buffer_size 64: every 100-byte message fills it, so each leaves at once."""
    client, session = await _subscribed(
        classic, 10, output_buffer_size=64, output_buffer_timeout=1000
    )
    writes = spy_writes(session.transport)
    await _publish(classic, b"x" * 100, b"y" * 100)
    await classic.wait_for(lambda: session.in_flight == 2)
    assert len(writes) >= 1
    assert b"".join(writes).count(b"x" * 100) == 1
    assert b"".join(writes).count(b"y" * 100) == 1
    await client.close()


async def test_youzan_writes_each_ordered_message_at_once() -> None:
    """youzan's messagePump flushes every message frame of an ordered channel (needFlush is
    IsOrdered): with RDY 10 and a 1 s ticker, each message still leaves as it is sent, and
    the next one follows its FIN at once (the ticker would hold each for up to 1 s)."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("o", 1, 1, ordered=True, channels=["c"])
        consumer = await RawClient.identified(cluster.nsqd_addresses[0], output_buffer_timeout=1000)
        await consumer.ok(commands.sub_ordered("o", "c", 0))
        session = _session(cluster, subscribed=True)
        consumer.send(commands.rdy(10))
        await cluster.wait_for(lambda: session.rdy == 10)
        writes = spy_writes(session.transport)
        publisher = await RawClient.identified(cluster.nsqd_addresses[0])
        for body in (b"first", b"second"):
            await publisher.ok(commands.pub("o", body, 0))
        layout = MessageLayout.youzan(detail=True)
        first = await consumer.message(layout, timeout=0.5)
        assert first.body == b"first"
        assert len(writes) == 1  # flushed with no tick
        consumer.send(commands.fin(first.id))
        assert (await consumer.message(layout, timeout=0.5)).body == b"second"
        assert len(writes) == 2
        for client in (publisher, consumer):
            await client.close()


@pytest.mark.parametrize(
    ("channel", "identify", "buffered"),
    [
        ("c", {}, True),  # SwitchToConsumer: 4 KiB, so a 200-byte message waits for the tick
        ("c#ephemeral", {}, False),  # an ephemeral channel keeps 100 B
        ("c", {"output_buffer_size": 128}, False),  # the client's own size is kept
    ],
    ids=["durable", "ephemeral", "chosen-size"],
)
async def test_youzan_gives_a_consumer_a_larger_buffer_on_sub(
    channel: str, identify: dict[str, object], buffered: bool
) -> None:
    """youzan's 100 B default write buffer suits producers; SUB to a durable channel raises
    it to 4 KiB unless the client chose a size (or TLS or compression is on)."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("y", 1, 1, channels=[channel])
        consumer = await RawClient.identified(
            cluster.nsqd_addresses[0], output_buffer_timeout=1000, **identify
        )
        await consumer.ok(commands.sub("y", channel, 0))
        session = _session(cluster, subscribed=True)
        assert session.peer.output_buffer_size == (
            4096 if buffered else identify.get("output_buffer_size", 100)
        )
        consumer.send(commands.rdy(10))
        await cluster.wait_for(lambda: session.rdy == 10)
        writes = spy_writes(session.transport)
        publisher = await RawClient.identified(cluster.nsqd_addresses[0])
        await publisher.ok(commands.pub("y", b"x" * 200, 0))
        await cluster.wait_for(lambda: session.in_flight == 1)
        assert (writes == []) is buffered
        message = await consumer.message(MessageLayout.youzan(), timeout=2)
        assert message.body == b"x" * 200
        for client in (publisher, consumer):
            await client.close()
