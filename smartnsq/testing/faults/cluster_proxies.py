"""Fault proxies in front of the servers of an embedded :class:`~smartnsq.testing.Cluster`
(youzan or classic), and the ``address_map`` that sends the clients through them.

nsqlookupd keeps announcing the real addresses; the clients' ``address_map`` (see
``smartnsq.routing.addresses.AddressMap``) turns each announced address into its proxy's::

    async with cluster_proxies(cluster) as proxies:
        producer = smartnsq.Producer(
            lookupd=[cluster.lookupd_url], address_map=proxies.address_map
        )
        proxies[0].blackhole()  # nsqd 0 goes silent for this producer
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

from smartnsq.testing.faults.proxy import FaultProxy
from smartnsq.testing.lifecycle import StartsAndCloses

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster

__all__ = ["ClusterProxies", "cluster_proxies"]


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


class ClusterProxies(StartsAndCloses):
    """One :class:`FaultProxy` per nsqd of a started cluster: ``proxies[i]`` (or
    ``nsqd[i]``) in front of node ``i``'s TCP port; with ``http=True`` also ``nsqd_http[i]``
    in front of its HTTP port; with ``lookupd=True`` ``lookupd[i]`` in front of each
    nsqlookupd (then connect to :attr:`lookupd_urls`). Each proxy's seed is drawn from
    ``seed``. Nodes restarted with ``start_node`` keep their ports, so the proxies stay
    valid."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        http: bool = False,
        lookupd: bool = False,
        seed: int | None = None,
    ) -> None:
        self.cluster = cluster
        seeds = random.Random(seed)
        local = cluster.local_host

        def proxy(address: str, name: str) -> FaultProxy:
            return FaultProxy(
                local, _port(address), seed=seeds.randrange(2**32), name=f"{name}@{address}"
            )

        self.nsqd = [proxy(a, f"nsqd{i}") for i, a in enumerate(cluster.nsqd_addresses)]
        self.nsqd_http = (
            [proxy(a, f"nsqd{i}-http") for i, a in enumerate(cluster.nsqd_http_addresses)]
            if http
            else []
        )
        self.lookupd = (
            [
                proxy(url.removeprefix("http://"), f"nsqlookupd{i}")
                for i, url in enumerate(cluster.lookupd_urls)
            ]
            if lookupd
            else []
        )

    @property
    def all(self) -> list[FaultProxy]:
        """Every proxy: nsqd TCP, nsqd HTTP, nsqlookupd."""
        return [*self.nsqd, *self.nsqd_http, *self.lookupd]

    def __getitem__(self, node: int) -> FaultProxy:
        return self.nsqd[node]

    def __len__(self) -> int:
        return len(self.nsqd)

    def __iter__(self) -> Iterator[FaultProxy]:
        return iter(self.nsqd)

    async def start(self) -> ClusterProxies:
        try:
            for proxy in self.all:
                await proxy.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        for proxy in self.all:
            await proxy.close()

    @property
    def address_map(self) -> dict[str, str]:
        """Announced ``host:port`` -> proxy ``host:port``, for ``address_map=`` of the
        Producer, Consumer and Admin."""
        announced = self.cluster.broadcast_address
        mapping = {}
        for proxy in self.all:
            mapping[f"{announced}:{proxy.upstream_port}"] = proxy.address
        return mapping

    @property
    def nsqd_addresses(self) -> list[str]:
        """The proxies' TCP addresses, by node (for ``nsqd=[...]``)."""
        return [proxy.address for proxy in self.nsqd]

    @property
    def lookupd_urls(self) -> list[str]:
        """The nsqlookupds' URLs through their proxies (the cluster's own without
        ``lookupd=True``)."""
        if not self.lookupd:
            return list(self.cluster.lookupd_urls)
        return [f"http://{proxy.address}" for proxy in self.lookupd]

    def heal(self) -> None:
        """:meth:`FaultProxy.heal` on every proxy."""
        for proxy in self.all:
            proxy.heal()

    def clear(self) -> None:
        """:meth:`FaultProxy.clear` on every proxy."""
        for proxy in self.all:
            proxy.clear()


def cluster_proxies(
    cluster: Cluster, *, http: bool = False, lookupd: bool = False, seed: int | None = None
) -> ClusterProxies:
    """Proxies in front of a started cluster's servers (``async with`` starts and closes
    them); see :class:`ClusterProxies`."""
    return ClusterProxies(cluster, http=http, lookupd=lookupd, seed=seed)
