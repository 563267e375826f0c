"""An embedded NSQ cluster (youzan HA or classic) for tests, demos and local development.

It serves real TCP and HTTP on 127.0.0.1 with OS-chosen ports and answers like the real
servers: as their source says (youzan/nsq 0.3.7-HA.1.13.0, nsqio/nsq v1.3.0) and as they were
seen to behave (docs/protocol.md). It is an emulator, not a production broker.

The names below are imported on first use: the pytest plugin lives in this package and is
loaded by every pytest run, which should not pay for asyncio and the cluster's modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster
    from smartnsq.testing.errors import ClusterError
    from smartnsq.testing.faults import FaultProxy, cluster_proxies
    from smartnsq.testing.state import ChannelRecord, Record

__all__ = ["ChannelRecord", "Cluster", "ClusterError", "FaultProxy", "Record", "cluster_proxies"]

_HOMES = {
    "ChannelRecord": "smartnsq.testing.state",
    "Cluster": "smartnsq.testing.cluster",
    "ClusterError": "smartnsq.testing.errors",
    "FaultProxy": "smartnsq.testing.faults",
    "cluster_proxies": "smartnsq.testing.faults",
    "Record": "smartnsq.testing.state",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
