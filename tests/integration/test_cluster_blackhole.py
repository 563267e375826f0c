"""Cluster.blackhole / heal: a node (or an nsqlookupd) drops off the network silently, as
in a partition, and comes back; checked with raw sockets."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from smartnsq.protocol import commands as c
from smartnsq.protocol.frames import FRAME_TYPE_RESPONSE
from smartnsq.protocol.message import MessageLayout
from smartnsq.testing import Cluster, ClusterError
from tests.integration.rawclient import RawClient

WAIT = 5.0
SILENCE = 0.2


async def test_a_blackholed_node_holds_a_publish_and_answers_on_heal(classic: Cluster) -> None:
    producer = await RawClient.identified(classic.nsqd_addresses[0])
    await producer.ok(c.pub("t", b"before"))
    classic.blackhole(0)
    producer.send(c.pub("t", b"during"))
    assert await producer.silent(SILENCE)  # no answer, no FIN, no RST
    assert [r.body for r in classic.messages("t")] == [b"before"]
    classic.heal(0)
    assert await producer.frame(WAIT) == (FRAME_TYPE_RESPONSE, b"OK")
    assert [r.body for r in classic.messages("t")] == [b"before", b"during"]
    await producer.close()


async def test_new_connections_are_accepted_and_never_answered(youzan: Cluster) -> None:
    youzan.blackhole(1)
    client = await RawClient.connect(youzan.nsqd_addresses[1])  # the kernel accepts it
    client.send(c.identify({"client_id": "raw", "feature_negotiation": True}))
    assert await client.silent(SILENCE)
    youzan.heal(1)
    frame = await client.frame(WAIT)
    assert frame.type == FRAME_TYPE_RESPONSE
    await client.close()


async def test_held_deliveries_arrive_on_heal(youzan: Cluster) -> None:
    consumer = await RawClient.identified(youzan.nsqd_addresses[1])
    await consumer.ok(c.sub("ptest", "init", 0))
    consumer.send(c.rdy(10))
    await youzan.wait_for(lambda: youzan.subscriber_rdy("ptest", "init", 0) == [10])
    writer = await RawClient.identified(youzan.nsqd_addresses[1])
    youzan.blackhole(1)
    writer.send(c.pub("ptest", b"held", 0))
    assert await writer.silent(SILENCE)
    youzan.heal(1)
    assert await writer.frame(WAIT) == (FRAME_TYPE_RESPONSE, b"OK")
    message = await consumer.message(MessageLayout.youzan())
    assert message.body == b"held"
    for client in (consumer, writer):
        await client.close()


@pytest.mark.slow
async def test_heartbeats_stop_and_nsqd_gives_up_on_a_silent_client(classic: Cluster) -> None:
    """Classic nsqd closes a client it has not heard from for 2 heartbeat intervals: in a
    blackhole the client sees nothing of it (no heartbeat, no FIN); the session leaves its
    channel at once, and the connection ends on heal."""
    consumer = await RawClient.identified(classic.nsqd_addresses[0], heartbeat_interval=1000)
    consumer.skip_heartbeats = False
    await consumer.ok(c.sub("t", "c"))
    consumer.send(c.rdy(1))
    await classic.wait_for(lambda: classic.subscriber_rdy("t", "c") == [1])
    classic.blackhole(0)
    await classic.wait_for(lambda: classic.subscriber_rdy("t", "c") == [], timeout=WAIT)
    assert classic.clients(0) == 1  # the socket is still open
    classic.heal(0)
    with pytest.raises((EOFError, ConnectionError)):
        await consumer.frame(WAIT)  # the first thing it gets: no held heartbeat
    await classic.wait_for(lambda: classic.clients(0) == 0)


async def test_the_blackhole_outlasts_a_restart(classic: Cluster) -> None:
    classic.blackhole(0)
    await classic.stop_node(0)
    await classic.start_node(0)
    client = await RawClient.connect(classic.nsqd_addresses[0])
    client.send(c.identify({"client_id": "raw", "feature_negotiation": True}))
    assert await client.silent(SILENCE)
    classic.heal(0)
    assert (await client.frame(WAIT)).type == FRAME_TYPE_RESPONSE
    await client.close()


async def _get_later(url: str) -> asyncio.Task[httpx.Response]:
    http = httpx.AsyncClient(timeout=WAIT)

    async def get() -> httpx.Response:
        async with http:
            return await http.get(url)

    return asyncio.ensure_future(get())


async def test_the_nodes_http_api_is_blackholed_too(youzan: Cluster) -> None:
    youzan.blackhole(2)
    ping = await _get_later(f"http://{youzan.nsqd_http_addresses[2]}/ping")
    done, _ = await asyncio.wait({ping}, timeout=SILENCE)
    assert not done
    async with httpx.AsyncClient(timeout=WAIT) as http:  # the other nodes answer
        assert (await http.get(f"http://{youzan.nsqd_http_addresses[0]}/ping")).text == "OK"
    youzan.heal(2)
    assert (await asyncio.wait_for(ping, WAIT)).text == "OK"


async def test_a_blackholed_lookupd() -> None:
    async with Cluster(nodes=1, lookupds=2) as cluster:
        cluster.blackhole_lookupd(0)
        ping = await _get_later(f"{cluster.lookupd_urls[0]}/ping")
        done, _ = await asyncio.wait({ping}, timeout=SILENCE)
        assert not done
        async with httpx.AsyncClient(timeout=WAIT) as http:
            assert (await http.get(f"{cluster.lookupd_urls[1]}/ping")).text == "OK"
        cluster.heal_lookupd(0)
        assert (await asyncio.wait_for(ping, WAIT)).text == "OK"


async def test_a_lookupd_the_cluster_lacks_is_a_cluster_error() -> None:
    """As for a node: ClusterError naming the lookupds there are, not an IndexError (and
    -1 is not the last one)."""
    async with Cluster(nodes=1, lookupds=2) as cluster:
        calls = [
            cluster.blackhole_lookupd,
            cluster.heal_lookupd,
            cluster.thaw_lookupd,
            lambda index: cluster.freeze_lookupd(index, ["t"]),
        ]
        for index in (2, -1):
            for call in calls:
                with pytest.raises(
                    ClusterError, match=rf"no nsqlookupd {index} \(lookupds are 0\.\.1\)"
                ):
                    call(index)
            for stopping in (cluster.stop_lookupd, cluster.start_lookupd):
                with pytest.raises(ClusterError, match="no nsqlookupd"):
                    await stopping(index)
        with pytest.raises(ClusterError, match="no node 1"):
            cluster.blackhole(1)
