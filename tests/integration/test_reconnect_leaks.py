"""A Producer and a Consumer that reconnect many times hold no more than they held before:
file descriptors, asyncio tasks and the loop's live timers come back to where they were.
youzan through nsqlookupd, and classic nsqd in direct mode (``nsqd=[...]``).

Each cycle breaks every client connection (RST through the fault proxies, or the nodes
closing them), waits until the producer saw its connections go, publishes once per node and
waits until the consumer handled those messages and the connections settled (one producer
and one consumer connection per node, through its proxy and at the node). The counts are
taken at those settled points: after one warm-up cycle (lazily made things exist by then),
after many more cycles, and after the clients closed. A leak of one object per reconnect
shows as ``CYCLES``; the tolerance covers what a settled moment may still hold (the
emulated nsqlookupd closes its side of a finished HTTP exchange a moment later...).

Counts, never times: every wait is for a condition, bounded.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import smartnsq
from smartnsq.flow.retry import Backoff
from smartnsq.testing import Cluster
from smartnsq.testing.faults import ClusterProxies, cluster_proxies

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="counts open file descriptors in /proc (Linux)"
)

NODES = 2
CYCLES = 20
TOLERANCE = 2
WAIT = 10.0
# Reconnect at once: the test counts objects, it does not measure the backoff.
QUICK = Backoff(initial=0.005, maximum=0.02)


@dataclass(frozen=True)
class Counts:
    fds: int
    tasks: int
    timers: int | None  # None where the loop does not expose its timer heap (uvloop)

    def growth(self, since: Counts) -> dict[str, int]:
        grown = {"fds": self.fds - since.fds, "tasks": self.tasks - since.tasks}
        if self.timers is not None and since.timers is not None:
            grown["timers"] = self.timers - since.timers
        return grown


def counts() -> Counts:
    loop = asyncio.get_running_loop()
    # asyncio's own loop keeps its timers in a heap; cancelled ones linger there until
    # dropped, so only the live ones count.
    scheduled = getattr(loop, "_scheduled", None)
    timers = None if scheduled is None else sum(1 for h in scheduled if not h.cancelled())
    return Counts(len(os.listdir("/proc/self/fd")), len(asyncio.all_tasks()), timers)


def assert_back(after: Counts, before: Counts, when: str) -> None:
    grown = after.growth(before)
    over = {name: n for name, n in grown.items() if n > TOLERANCE}
    assert not over, f"{when}: {over} more than before ({before} -> {after})"


async def settled(cluster: Cluster, proxies: ClusterProxies, per_node: int) -> None:
    """Every node serves ``per_node`` client connections and its proxy holds as many."""
    await cluster.wait_for(
        lambda: all(
            cluster.clients(i) == per_node and proxies[i].stats().open == per_node
            for i in range(NODES)
        ),
        WAIT,
    )


@pytest.mark.parametrize("classic", [False, True], ids=["youzan-lookupd", "classic-direct"])
async def test_reconnects_leave_no_fds_tasks_or_timers_behind(classic: bool) -> None:
    async with (
        Cluster(nodes=NODES, classic=classic) as cluster,
        cluster_proxies(cluster, seed=27) as proxies,
    ):
        if classic:
            where: dict[str, Any] = {"nsqd": proxies.nsqd_addresses}
        else:
            await cluster.create_topic("leaks", NODES, 1, channels=["c"])
            assert {cluster.leader("leaks", p) for p in range(NODES)} == set(range(NODES))
            where = {"lookupd": [cluster.lookupd_url], "address_map": proxies.address_map}
        handled: set[bytes] = set()
        consumer = smartnsq.Consumer(
            "leaks",
            "c",
            handler=lambda message: handled.add(message.body),
            # RDY for every connection at once: with max_in_flight below the connections,
            # RDY rotates among them (every few seconds), which this test is not about.
            max_in_flight=4 * NODES,
            reconnect_backoff=QUICK,
            **where,
        )
        producer = smartnsq.Producer(
            retry_backoff=QUICK,
            publish_timeout=WAIT,
            **where,
        )

        async def reset_every_link() -> None:
            for proxy in proxies:
                proxy.reset()

        async def nodes_close_them() -> None:
            for node in range(NODES):
                await cluster.drop_connections(node)

        faults: list[Callable[[], Awaitable[None]]] = [reset_every_link, nodes_close_them]

        async def cycle(n: int) -> None:
            await faults[n % len(faults)]()
            # The producer saw its connections go: the next publishes make new ones.
            await cluster.wait_for(lambda: producer.stats().connections == 0, WAIT)
            bodies = [b"%d/%d" % (n, p) for p in range(NODES)]
            for p, body in enumerate(bodies):
                # youzan: one per partition; classic: round-robin over the nodes
                await producer.publish("leaks", body, partition=None if classic else p)
            await cluster.wait_for(lambda: set(bodies) <= handled, WAIT)
            await settled(cluster, proxies, per_node=2)

        before_clients = counts()
        async with consumer, producer:
            await cycle(0)  # warm-up: every connection made once, then broken and made again
            warm = counts()
            for n in range(1, CYCLES + 1):
                await cycle(n)
            after_cycles = counts()
            reconnects = consumer.stats().reconnects
        await settled(cluster, proxies, per_node=0)
        after_close = counts()

    assert reconnects >= CYCLES
    assert sum(proxy.stats().accepted for proxy in proxies) >= 2 * NODES * (CYCLES + 1)
    assert_back(after_cycles, warm, f"after {CYCLES} reconnect cycles")
    assert_back(after_close, before_clients, "after the clients closed")
