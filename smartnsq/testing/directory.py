"""The embedded cluster's directory: where each server listens, whether it runs, and what
the nsqlookupds announce of it; which nsqlookupd leads; the lookupds' cluster-wide switches.

On a real youzan cluster the nsqlookupds share this through etcd and the nsqd registrations.
Here it is plain data: the servers write their own entry when they start and stop, the
lookupds and the topology read it.

Ports: lookupd ``i`` serves HTTP on ``lookupd_port + i``; nsqd ``i`` TCP on ``nsqd_port + 2i``
and HTTP on the port after it; 0 lets the OS choose.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from smartnsq.errors import ValidationError
from smartnsq.testing.errors import ClusterError

__all__ = [
    "CLASSIC_VERSION",
    "YOUZAN_VERSION",
    "Directory",
    "LookupdEntry",
    "NsqdEntry",
]

# The releases the servers answer as (nsqd and nsqlookupd /info, lookupd's node lists).
YOUZAN_VERSION = "0.3.7-HA.1.13.0"
CLASSIC_VERSION = "1.3.0"

_LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
_MAX_PORT = 65535


def _check_broadcast(address: str | None, default: str) -> str:
    """nsqd's rule: the address it registers must name a host (not empty, not a wildcard)."""
    if address is None:
        return default
    if not isinstance(address, str) or not address or address in _LOOPBACK:
        raise ValidationError("broadcast_address", f"must name a host, not {address!r}")
    if any(c.isspace() for c in address) or "/" in address:
        raise ValidationError("broadcast_address", f"must name a host, not {address!r}")
    return address


def _port_plan(lookupd_port: int, nsqd_port: int, lookupds: int, nodes: int) -> tuple[int, int]:
    """(first lookupd HTTP port, first nsqd TCP port), 0 when the OS chooses.
    ``nsqd_port`` defaults to the port after the last lookupd."""
    for name, value in (("lookupd_port", lookupd_port), ("nsqd_port", nsqd_port)):
        if type(value) is not int or not 0 <= value <= _MAX_PORT:
            raise ValidationError(name, f"must be a port 1..{_MAX_PORT} (0: chosen by the OS)")
    if nsqd_port == 0 and lookupd_port:
        nsqd_port = lookupd_port + lookupds
    lookupd_ports = set(range(lookupd_port, lookupd_port + lookupds)) if lookupd_port else set()
    nsqd_ports = set(range(nsqd_port, nsqd_port + 2 * nodes)) if nsqd_port else set()
    if max(lookupd_ports | nsqd_ports, default=0) > _MAX_PORT:
        raise ValidationError("nsqd_port", f"the ports of {nodes} nodes go past {_MAX_PORT}")
    if lookupd_ports & nsqd_ports:
        raise ValidationError(
            "nsqd_port",
            f"nsqd ports {nsqd_port}..{nsqd_port + 2 * nodes - 1} overlap the nsqlookupd "
            f"ports {lookupd_port}..{lookupd_port + lookupds - 1}",
        )
    return lookupd_port, nsqd_port


@dataclass
class NsqdEntry:
    """One nsqd as the directory knows it. ``tcp_port`` is the planned port until the node
    first starts, then the one it listens on (kept for restarts)."""

    index: int
    tcp_port: int
    http_port: int = 0
    running: bool = False
    # A stand-in for the ephemeral port of nsqd's connection to nsqlookupd: it changes on
    # every restart, like the "id"/"remote_address" lookupd reports
    # (docs/protocol.md#node-ids-in-lookups).
    registration_port: int = 0


@dataclass
class LookupdEntry:
    """One nsqlookupd: its HTTP port, and the TCP and RPC ports it announces (reserved, not
    served)."""

    index: int
    http_port: int = 0
    tcp_port: int = 0
    rpc_port: int = 0
    running: bool = False


class Directory:
    """Every server of the cluster, its addresses and state (see the module doc)."""

    def __init__(
        self,
        *,
        nodes: int,
        lookupds: int,
        host: str,
        broadcast_address: str | None,
        lookupd_port: int,
        nsqd_port: int,
        allow_write_with_no_channels: bool,
    ) -> None:
        self.host = host  # where everything binds
        # Where clients on this machine connect: the bind address, or loopback for a wildcard.
        self.local_host = _LOOPBACK.get(host, host)
        # What the nsqlookupds announce for every nsqd and for themselves.
        self.broadcast_address = _check_broadcast(broadcast_address, self.local_host)
        self._port_plan = _port_plan(lookupd_port, nsqd_port, lookupds, nodes)
        self.hostname = socket.gethostname()
        self.nsqds = [NsqdEntry(i, self.planned_port(i, "tcp")) for i in range(nodes)]
        self.lookupds = [LookupdEntry(i) for i in range(lookupds)]
        self.registrations = 0
        # nsqlookupd /disable/write: "all", "ordered" or "" (writes allowed)
        self.write_disabled = ""
        self.allow_write_with_no_channels = allow_write_with_no_channels

    def planned_port(self, index: int, kind: str) -> int:
        """The fixed port of lookupd ``index`` (kind "lookupd") or of nsqd ``index`` ("tcp",
        "http"); 0 (the OS chooses) without ``lookupd_port``/``nsqd_port``."""
        lookupd_base, nsqd_base = self._port_plan
        if kind == "lookupd":
            return lookupd_base + index if lookupd_base else 0
        if not nsqd_base:
            return 0
        return nsqd_base + 2 * index + (1 if kind == "http" else 0)

    # ------------------------------------------------------------------ nsqd

    def nsqd(self, index: int) -> NsqdEntry:
        """nsqd ``index``; ClusterError if the cluster has no such node."""
        if not 0 <= index < len(self.nsqds):
            raise ClusterError(f"no node {index} (nodes are 0..{len(self.nsqds) - 1})")
        return self.nsqds[index]

    def nsqd_started(self, index: int, tcp_port: int) -> None:
        """nsqd ``index`` listens on ``tcp_port`` and registers with the lookupds."""
        entry = self.nsqds[index]
        entry.tcp_port = tcp_port
        entry.running = True
        self.registrations += 1
        entry.registration_port = 30000 + (self.registrations * 7 + index) % 30000

    def nsqd_stopped(self, index: int) -> None:
        """nsqd ``index`` is down (its ports are kept for a restart)."""
        self.nsqds[index].running = False

    def tcp_address(self, entry: NsqdEntry) -> str:
        """Where a client on this machine connects (not what nsqlookupd announces)."""
        return f"{self.local_host}:{entry.tcp_port}"

    def http_address(self, entry: NsqdEntry) -> str:
        return f"{self.local_host}:{entry.http_port}"

    def announced_tcp_address(self, entry: NsqdEntry) -> str:
        """``broadcast_address:tcp_port``: the address nsqlookupd hands out."""
        return f"{self.broadcast_address}:{entry.tcp_port}"

    def distributed_id(self, entry: NsqdEntry) -> str:
        """youzan's node id: broadcast address, RPC port, TCP port, configured node id."""
        port = entry.tcp_port
        return f"{self.broadcast_address}:{port + 2}:{port}:{entry.index}"

    # ------------------------------------------------------------------ nsqlookupd

    def lookupd_leader(self) -> LookupdEntry | None:
        """The nsqlookupd that leads (the first running one), or None when all are stopped."""
        for lookupd in self.lookupds:
            if lookupd.running:
                return lookupd
        return None
