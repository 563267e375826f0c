"""What a consumer does when its links misbehave (issue 27): a half-open link is found out by
the heartbeat rule (no bytes for two heartbeat intervals and a second) and the partition is
consumed again after the heal; storms of resets and a slow, sliced link lose nothing. Every
fault comes from the fault proxies; every wait is for an event, bounded."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import smartnsq
from smartnsq.flow.retry import Backoff
from smartnsq.testing import Cluster
from smartnsq.testing.faults import ClusterProxies, cluster_proxies

WAIT = 15.0
QUICK = Backoff(initial=0.02, maximum=0.2)
HEARTBEAT = 1.0  # the shortest nsqd takes


async def _publish(cluster: Cluster, topic: str, bodies: list[bytes]) -> None:
    async with smartnsq.Producer(lookupd=[cluster.lookupd_url]) as producer:
        for body in bodies:
            await producer.publish(topic, body, partition=0)


def _consumer(
    cluster: Cluster, proxies: ClusterProxies, seen: Counter[bytes], **options: object
) -> smartnsq.Consumer:
    return smartnsq.Consumer(
        "orders",
        "billing",
        lookupd=[cluster.lookupd_url],
        address_map=proxies.address_map,
        handler=lambda message: seen.update([message.body]),
        reconnect_backoff=QUICK,
        heartbeat_interval=HEARTBEAT,
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_a_half_open_consumer_link_is_found_out_by_its_heartbeats(ordered: bool) -> None:
    async with Cluster(nodes=1) as cluster, cluster_proxies(cluster, seed=3) as proxies:
        await cluster.create_topic("orders", 1, 1, ordered=ordered, channels=["billing"])
        seen: Counter[bytes] = Counter()
        consumer = _consumer(cluster, proxies, seen, ordered=ordered)
        async with consumer:
            await _publish(cluster, "orders", [b"before"])
            await cluster.wait_for(lambda: seen[b"before"] == 1, WAIT)
            loop = asyncio.get_running_loop()
            proxies[0].blackhole()  # silent both ways: no FIN, no RST, no heartbeats
            began = loop.time()
            await cluster.wait_for(lambda: consumer.stats().connections == 0, WAIT)
            found_out = loop.time() - began
            await _publish(cluster, "orders", [b"during"])  # the producer goes direct
            proxies[0].heal()
            await cluster.wait_for(lambda: seen[b"during"] >= 1, WAIT)
            await cluster.wait_for(lambda: cluster.unfinished("orders", "billing") == 0, WAIT)
        # two missed heartbeats and a second, plus the check's own granularity
        assert 2 * HEARTBEAT < found_out < 2 * HEARTBEAT + 1 + HEARTBEAT + 1.0
        assert seen[b"before"] == 1


async def test_storms_of_resets_lose_nothing() -> None:
    async with Cluster(nodes=2) as cluster, cluster_proxies(cluster, seed=7) as proxies:
        await cluster.create_topic("orders", 1, 2, channels=["billing"])
        seen: Counter[bytes] = Counter()
        consumer = _consumer(cluster, proxies, seen)
        bodies = [b"m%d" % n for n in range(200)]
        async with consumer:
            publishing = asyncio.ensure_future(_publish(cluster, "orders", bodies))
            for _ in range(10):  # reset the consumer's link once it is subscribed again
                await cluster.wait_for(lambda: consumer.stats().connections == 1, WAIT)
                connects = consumer.stats().connects
                for proxy in proxies:
                    proxy.reset()
                await cluster.wait_for(
                    lambda connects=connects: consumer.stats().connects > connects, WAIT
                )
            await asyncio.wait_for(publishing, WAIT)
            await cluster.wait_for(lambda: set(bodies) <= set(seen), WAIT)
            await cluster.wait_for(lambda: cluster.unfinished("orders", "billing") == 0, WAIT)
        assert consumer.stats().reconnects >= 10
        assert set(seen) == set(bodies)  # at least once: a reset FIN may be lost, never a message


async def test_a_slow_sliced_link_delivers_everything_in_order() -> None:
    async with Cluster(nodes=1) as cluster, cluster_proxies(cluster, seed=11) as proxies:
        await cluster.create_topic("orders", 1, 1, ordered=True, channels=["billing"])
        proxies[0].set_latency(0.02, jitter=0.01)
        proxies[0].set_slicing(7)  # 1-7 byte pieces, both ways
        order: list[bytes] = []
        consumer = smartnsq.Consumer(
            "orders",
            "billing",
            lookupd=[cluster.lookupd_url],
            address_map=proxies.address_map,
            handler=lambda message: order.append(message.body),
            ordered=True,
        )
        bodies = [b"m%03d" % n for n in range(100)]
        async with consumer:
            await _publish(cluster, "orders", bodies)
            await cluster.wait_for(lambda: len(order) >= len(bodies), WAIT)
            stats = consumer.stats()
        assert order == bodies
        assert (stats.reconnects, stats.server_errors, stats.order_violations) == (0, 0, 0)


async def test_a_retry_that_falls_due_while_the_supervisor_looks_is_made_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A subscription dropped right after its SUB waits its backoff (milliseconds here). The
    # supervisor then looks at every key; when the backoff ran out while it looked (a busy
    # loop), the retry must still be made at once, not at the next 30 s tick. Time is made to
    # pass during each look, so that this happens every time rather than once in a while.
    async with Cluster(nodes=1, classic=True) as cluster:
        loop = asyncio.get_running_loop()
        skew = [0.0]
        real_time = loop.time
        monkeypatch.setattr(loop, "time", lambda: real_time() + skew[0])
        consumer = smartnsq.Consumer(
            "orders",
            "billing",
            nsqd=cluster.nsqd_addresses,
            handler=lambda message: None,
            reconnect_backoff=QUICK,
        )
        subscriber = consumer._subscriber
        reconcile = subscriber._reconcile

        async def slow_reconcile() -> float | None:
            due = await reconcile()
            skew[0] += 1.0  # longer than any backoff of QUICK
            return due

        monkeypatch.setattr(subscriber, "_reconcile", slow_reconcile)
        async with consumer:
            await cluster.wait_for(lambda: cluster.clients(0) == 1, WAIT)
            await cluster.drop_connections(0)
            await cluster.wait_for(lambda: consumer.stats().reconnects == 1, WAIT)
            # Within a few reconciles, far below the supervisor's 30 s tick.
            await cluster.wait_for(lambda: consumer.stats().connections == 1, 5.0)
