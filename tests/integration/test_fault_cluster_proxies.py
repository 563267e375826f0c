"""Fault proxies in front of an embedded cluster's servers: clients given the proxies'
address map reach every nsqd (and, with lookupd=True, every nsqlookupd) through them."""

from __future__ import annotations

import asyncio

import httpx

import smartnsq
from smartnsq.testing import Cluster
from smartnsq.testing.faults import cluster_proxies

WAIT = 10.0


def _client_connections(cluster: Cluster) -> int:
    return sum(cluster.clients(i) for i in range(len(cluster.nodes)))


async def test_a_producer_and_a_consumer_through_lookupd_go_through_the_proxies() -> None:
    async with Cluster(nodes=3) as cluster, cluster_proxies(cluster, seed=5) as proxies:
        await cluster.create_topic("orders", 3, 1, channels=["billing"])
        assert len(proxies) == 3
        assert set(proxies.address_map) == {a for a in cluster.nsqd_addresses}
        received: list[bytes] = []
        consumer = smartnsq.Consumer(
            "orders",
            "billing",
            lookupd=[cluster.lookupd_url],
            address_map=proxies.address_map,
            handler=lambda m: received.append(m.body),
        )
        producer = smartnsq.Producer(lookupd=[cluster.lookupd_url], address_map=proxies.address_map)
        async with consumer, producer:
            bodies = [b"order %d" % i for i in range(30)]
            results = [
                await producer.publish("orders", body, sharding_key=i)
                for i, body in enumerate(bodies)
            ]
            await cluster.wait_for(lambda: len(received) == 30, WAIT)
            # Every connection the nodes serve is one the proxies opened.
            opened = sum(proxy.stats().open for proxy in proxies)
            assert opened == _client_connections(cluster) >= 6
        assert sorted(received) == sorted(bodies)
        assert {r.address for r in results} == set(proxies.nsqd_addresses)
        for proxy in proxies:
            stats = proxy.stats()
            assert stats.accepted >= 2  # a producer and a consumer connection
            assert stats.upstream_bytes > 0
            assert stats.downstream_bytes > 0


async def test_classic_nsqd_direct_and_through_lookupd() -> None:
    async with Cluster(classic=True) as cluster, cluster_proxies(cluster) as proxies:
        received: list[bytes] = []
        consumer = smartnsq.Consumer(
            "events",
            "tail",
            lookupd=[cluster.lookupd_url],
            address_map=proxies.address_map,
            handler=lambda m: received.append(m.body),
        )
        async with smartnsq.Producer(nsqd=proxies.nsqd_addresses) as producer:
            await producer.publish("events", b"first")  # creates the topic
            async with consumer:
                await producer.publish("events", b"second")
                await cluster.wait_for(lambda: len(received) == 2, WAIT)
        assert proxies[0].stats().accepted == 2
        assert sorted(received) == [b"first", b"second"]


async def test_proxied_lookupd_and_nsqd_http() -> None:
    async with (
        Cluster(nodes=2, lookupds=2) as cluster,
        cluster_proxies(cluster, http=True, lookupd=True) as proxies,
    ):
        await cluster.create_topic("t", 2, 1, channels=["c"])
        assert len(proxies.all) == 6
        assert proxies.lookupd_urls != cluster.lookupd_urls
        async with smartnsq.Producer(
            lookupd=proxies.lookupd_urls[:1], address_map=proxies.address_map
        ) as producer:
            await producer.publish("t", b"x", partition=1)
        # /listlookup named both lookupds: the map sent the client to their proxies.
        assert all(proxy.stats().accepted >= 1 for proxy in proxies.lookupd)
        async with httpx.AsyncClient(timeout=WAIT) as http:
            answer = await http.get(f"http://{proxies.nsqd_http[0].address}/ping")
        assert answer.text == "OK"
        assert proxies.nsqd_http[0].stats().accepted == 1


async def test_a_publish_held_by_a_blackholed_node_lands_on_heal() -> None:
    async with Cluster(nodes=2) as cluster, cluster_proxies(cluster) as proxies:
        await cluster.create_topic("t", 2, 1, channels=["c"], placement={0: [0], 1: [1]})
        async with smartnsq.Producer(
            lookupd=[cluster.lookupd_url], address_map=proxies.address_map, publish_timeout=30
        ) as producer:
            await producer.publish("t", b"before", partition=0)
            sent = proxies[0].stats().upstream_bytes
            proxies[0].blackhole()
            held = asyncio.ensure_future(producer.publish("t", b"held", partition=0))
            await producer.publish("t", b"other node", partition=1)  # node 1 is reachable
            assert not held.done()
            assert proxies[0].stats().upstream_bytes == sent
            assert [r.body for r in cluster.messages("t", 0)] == [b"before"]
            proxies.heal()
            result = await asyncio.wait_for(held, WAIT)
        assert result.partition == 0
        assert [r.body for r in cluster.messages("t", 0)] == [b"before", b"held"]


async def test_the_map_keys_are_the_announced_addresses() -> None:
    """Announced under a name no resolver knows, the nodes are reached through the map."""
    async with (
        Cluster(nodes=2, broadcast_address="nsq.invalid") as cluster,
        cluster_proxies(cluster, lookupd=True) as proxies,
    ):
        await cluster.create_topic("t", 2, 1, channels=["c"])
        assert all(key.startswith("nsq.invalid:") for key in proxies.address_map)
        async with smartnsq.Producer(
            lookupd=proxies.lookupd_urls, address_map=proxies.address_map
        ) as producer:
            results = [await producer.publish("t", b"x", partition=p) for p in (0, 1)]
        assert {r.address for r in results} == set(proxies.nsqd_addresses)
