"""A pool of publishing connections keyed by (nsqd address, topic, partition).

youzan nsqd nodes lead several partitions, so a pool keyed by address alone would let a fatal
error for one partition (E_TOPIC_NOT_EXIST closes the connection) disturb the others; keying
by partition isolates them, as the youzan SDKs do. Each key holds up to
``connections_per_key`` connections used round-robin; callers asking for a key that is being
connected share that attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from smartnsq.errors import ClientClosedError, ValidationError
from smartnsq.transport.connection import Connection, ConnectionConfig

__all__ = ["ConnectionPool", "PoolKey"]

log = logging.getLogger("smartnsq.pool")

PoolKey = tuple[str, str, "int | None"]
ConnectionFactory = Callable[[str, ConnectionConfig], Connection]


class _Slot:
    __slots__ = ("connecting", "connections", "next")

    def __init__(self) -> None:
        self.connections: list[Connection] = []
        self.connecting: asyncio.Future[Connection] | None = None
        self.next = 0


class ConnectionPool:
    def __init__(
        self,
        config: ConnectionConfig,
        *,
        connections_per_key: int = 1,
        factory: ConnectionFactory | None = None,
    ) -> None:
        if type(connections_per_key) is not int or connections_per_key < 1:
            # a key is a partition (or a classic nsqd): named as the Producer's argument
            raise ValidationError(
                "connections_per_partition", f"must be an int >= 1, not {connections_per_key!r}"
            )
        self.config = config
        self.connections_per_key = connections_per_key
        self._factory = factory or (lambda address, cfg: Connection(address, cfg))
        self._slots: dict[PoolKey, _Slot] = {}
        self._closed = False

    def get_nowait(self, address: str, topic: str, partition: int | None) -> Connection | None:
        """An open connection for the key if the slot is full and healthy, else None (then
        ``await get()``): the publish fast path without a coroutine."""
        slot = self._slots.get((address, topic, partition))
        if slot is None:
            return None
        conns = slot.connections
        count = len(conns)
        if count < self.connections_per_key:
            return None
        if count == 1:
            conn = conns[0]
        else:
            index = slot.next % count
            slot.next = index + 1
            conn = conns[index]
        return conn if conn.is_open else None

    async def get(self, address: str, topic: str, partition: int | None) -> Connection:
        """An open connection for the key (round-robin), connecting if needed."""
        if self._closed:
            raise ClientClosedError("the connection pool is closed")
        conn = self.get_nowait(address, topic, partition)  # the common case: a full, healthy slot
        if conn is not None:
            return conn
        key = (address, topic, partition)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        conns = slot.connections
        conns[:] = [c for c in conns if c.is_open]
        if slot.connecting is not None:
            if conns:
                return conns[0]
            return await asyncio.shield(slot.connecting)
        return await self._grow(slot, address)

    async def _grow(self, slot: _Slot, address: str) -> Connection:
        """Open one more connection for the slot; concurrent callers share the attempt."""
        connecting: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        slot.connecting = connecting
        try:
            conn = await self._connect(address)
            if self._closed:
                await conn.close()
                raise ClientClosedError("the connection pool is closed")
        except BaseException as exc:
            connecting.set_exception(exc)
            connecting.exception()  # waiters re-raise it; nobody else has to
            raise
        finally:
            slot.connecting = None
        slot.connections.append(conn)
        connecting.set_result(conn)
        return conn

    async def _connect(self, address: str) -> Connection:
        conn = self._factory(address, self.config)
        await conn.connect()
        log.debug("connected to %s", address)
        return conn

    def open_connections(self) -> int:
        """How many pooled connections are open now."""
        return sum(c.is_open for slot in self._slots.values() for c in slot.connections)

    def discard(self, conn: Connection) -> None:
        """Forget a connection (it failed); the next ``get`` opens a new one."""
        for slot in self._slots.values():
            if conn in slot.connections:
                slot.connections.remove(conn)
        if not conn.closed:
            conn.abort()

    async def close(self) -> None:
        """Close every connection; the pool cannot be used afterwards."""
        self._closed = True
        conns = [conn for slot in self._slots.values() for conn in slot.connections]
        self._slots.clear()
        await asyncio.gather(*(conn.close() for conn in conns), return_exceptions=True)
