"""The publishing connections of a producer, keyed by (nsqd address, topic, partition).

youzan nsqd nodes lead several partitions, so connections keyed by address alone would let a
fatal error for one partition (E_TOPIC_NOT_EXIST closes the connection) disturb the others;
keying by partition isolates them, as the youzan SDKs do. Which connection a publish takes,
and when one is opened, the publish flow decides (:mod:`smartnsq.publishing.flow`); the pool
opens them (each within ``connect_timeout``), keeps them and closes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from smartnsq.errors import ClientClosedError
from smartnsq.transport.connection import Connection, ConnectionConfig

__all__ = ["ConnectionPool", "PoolKey"]

log = logging.getLogger("smartnsq.pool")

PoolKey = tuple[str, str, "int | None"]
ConnectionFactory = Callable[[str, ConnectionConfig], Connection]


class ConnectionPool:
    """Opens and keeps connections per key; ``factory`` makes them (tests pass their own)."""

    def __init__(self, config: ConnectionConfig, *, factory: ConnectionFactory | None = None):
        self.config = config
        self._factory = factory or (lambda address, cfg: Connection(address, cfg))
        self._open: dict[PoolKey, list[Connection]] = {}
        self._closed = False

    async def open(self, key: PoolKey) -> Connection:
        """One more connection for ``key``, connected (raises what connecting raised)."""
        if self._closed:
            raise ClientClosedError("the connection pool is closed")
        conn = self._factory(key[0], self.config)
        await conn.connect()
        if self._closed:
            await conn.close()
            raise ClientClosedError("the connection pool is closed")
        log.debug("connected to %s", key[0])
        self._open.setdefault(key, []).append(conn)
        return conn

    def forget(self, key: PoolKey, conn: Connection) -> None:
        """``conn`` closed: it is no longer kept."""
        conns = self._open.get(key)
        if conns is not None and conn in conns:
            conns.remove(conn)
            if not conns:
                del self._open[key]

    def open_connections(self) -> int:
        """How many pooled connections are open now."""
        return sum(c.is_open for conns in self._open.values() for c in conns)

    async def close(self) -> None:
        """Close every connection; the pool cannot be used afterwards."""
        self._closed = True
        conns = [conn for group in self._open.values() for conn in group]
        self._open.clear()
        await asyncio.gather(*(conn.close() for conn in conns), return_exceptions=True)
