"""The ``nsq_cluster``, ``nsq_fault_proxies`` and ``fault_proxy`` fixtures; the pytest plugin
loads this module only when pytest-asyncio is active (see ``smartnsq.testing.pytest_plugin``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from smartnsq.testing.pytest_plugin import (
    async_test_only,
    cluster_from_marker,
    cluster_in_a_thread,
    is_async_test,
    proxies_from_marker,
)

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster
    from smartnsq.testing.faults import ClusterProxies, FaultProxy

__all__ = ["fault_proxy", "nsq_cluster", "nsq_fault_proxies"]

#: What the ``fault_proxy`` fixture is: ``await fault_proxy("host:port", **options)``.
ProxyFactory = Callable[..., Awaitable["FaultProxy"]]


@pytest.fixture
def nsq_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A started embedded NSQ cluster (youzan, 3 nodes unless the ``nsq_cluster`` marker
    says otherwise), stopped after the test: on the test's event loop for an ``async def``
    test, on a loop thread of its own for a plain ``def`` one."""
    if is_async_test(request):
        yield request.getfixturevalue("_nsq_cluster_on_the_test_loop")
    else:
        yield from cluster_in_a_thread(request)


@pytest_asyncio.fixture
async def _nsq_cluster_on_the_test_loop(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    cluster = cluster_from_marker(request)
    async with cluster:
        yield cluster


@pytest_asyncio.fixture
async def nsq_fault_proxies(
    nsq_cluster: Cluster, request: pytest.FixtureRequest
) -> AsyncIterator[ClusterProxies]:
    """Fault proxies in front of every nsqd of ``nsq_cluster`` (``nsq_fault_proxies``
    marker: ``http``, ``lookupd``, ``seed``); pass ``address_map`` to the clients. Closed
    after the test. An ``async def`` test's only."""
    async_test_only(request, "nsq_fault_proxies")
    async with proxies_from_marker(request, nsq_cluster) as proxies:
        yield proxies


@pytest_asyncio.fixture
async def fault_proxy(request: pytest.FixtureRequest) -> AsyncIterator[ProxyFactory]:
    """A factory of started fault proxies, all closed after the test:
    ``proxy = await fault_proxy("127.0.0.1:4150", seed=1)`` (options of ``FaultProxy``).
    An ``async def`` test's only."""
    async_test_only(request, "fault_proxy")
    from smartnsq.testing.faults import FaultProxy

    made: list[FaultProxy] = []

    async def make(upstream: str, **options: Any) -> FaultProxy:
        proxy = FaultProxy.to(upstream, **options)
        made.append(proxy)
        return await proxy.start()

    try:
        yield make
    finally:
        for proxy in made:
            await proxy.close()
