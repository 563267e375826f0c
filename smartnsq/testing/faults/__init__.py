"""Network faults for tests: a TCP fault proxy (:class:`FaultProxy`, in the manner of
toxiproxy) and proxies in front of an embedded cluster's servers
(:func:`cluster_proxies`). See docs/guides/faults.md."""

from __future__ import annotations

from smartnsq.testing.faults.cluster_proxies import ClusterProxies, cluster_proxies
from smartnsq.testing.faults.proxy import FaultProxy, FaultProxyError, ProxyStats
from smartnsq.testing.faults.shaping import DOWNSTREAM, UPSTREAM

__all__ = [
    "DOWNSTREAM",
    "UPSTREAM",
    "ClusterProxies",
    "FaultProxy",
    "FaultProxyError",
    "ProxyStats",
    "cluster_proxies",
]
