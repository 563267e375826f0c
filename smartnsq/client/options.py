"""The options every client shares: where nsqd is (``lookupd=[...]`` or ``nsqd=[...]``, the
lookup's poll interval and address map), how a connection is made (timeouts, heartbeats,
TLS, compression, AUTH, the IDENTIFY names) and the OpenTelemetry providers.

The Producer and the Consumer take these as keyword arguments and build one
:class:`ClientOptions`, whose checks run here, once, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smartnsq.routing.addresses import AddressMapping
from smartnsq.transport.connection import Compression, ConnectionConfig
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.targets import Targets, resolve_targets

__all__ = ["ClientOptions"]


@dataclass(frozen=True)
class ClientOptions:
    """What a Producer and a Consumer are both given (durations in seconds). The connection
    settings are checked when it is built, the targets by :meth:`targets` (which a client
    calls in its constructor); both raise ValidationError naming the argument."""

    lookupd: Sequence[str] | None = None
    nsqd: Sequence[str] | None = None
    connect_timeout: float = 5.0
    heartbeat_interval: float = 30.0
    tls: Any = False
    compression: Compression = None
    deflate_level: int = 6
    auth_secret: str | bytes | None = None
    client_id: str | None = None
    user_agent: str | None = None
    lookupd_poll_interval: float = 60.0
    lookup_manager: LookupManager | None = None
    address_map: AddressMapping | None = None
    tracer_provider: Any = None
    meter_provider: Any = None

    def __post_init__(self) -> None:
        self.connection_config()  # ValidationError naming the argument, before any use

    def connection_config(self, **specific: Any) -> ConnectionConfig:
        """The per-connection settings, with a client's own (``request_timeout``,
        ``msg_timeout``, ``sample_rate``...) in ``specific``."""
        return ConnectionConfig.build(
            client_id=self.client_id,
            user_agent=self.user_agent,
            heartbeat_interval=self.heartbeat_interval,
            tls=self.tls,
            compression=self.compression,
            deflate_level=self.deflate_level,
            auth_secret=self.auth_secret,
            connect_timeout=self.connect_timeout,
            **specific,
        )

    def targets(self) -> Targets:
        """Where the client finds nsqd: the nsqd addresses (direct mode), or the lookup
        manager (made here unless one was given, and then the client's to close)."""
        return resolve_targets(
            lookupd=self.lookupd,
            nsqd=self.nsqd,
            lookup_manager=self.lookup_manager,
            poll_interval=self.lookupd_poll_interval,
            address_map=self.address_map,
        )
