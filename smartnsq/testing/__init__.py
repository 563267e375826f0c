"""An embedded NSQ cluster (youzan HA or classic) for tests, demos and local development.

It serves real TCP and HTTP on 127.0.0.1 with OS-chosen ports and answers like the real
servers recorded in the project's captures. It is an emulator, not a production broker.
"""

from smartnsq.testing.cluster import Cluster, ClusterError
from smartnsq.testing.state import ChannelRecord, Record

__all__ = ["ChannelRecord", "Cluster", "ClusterError", "Record"]
