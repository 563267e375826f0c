"""Watching what a process writes to one socket: both the client's connection and the
emulated nsqd promise a number and a grouping of writes (nsqd flushes per frame, the client
coalesces an iteration's frames), which only the transport's own writes show."""

from __future__ import annotations

import asyncio


def spy_writes(transport: asyncio.BaseTransport | None) -> list[bytes]:
    """Every write to ``transport`` from now on, one item per write."""
    if not isinstance(transport, asyncio.WriteTransport):
        raise AssertionError(f"not an open write transport: {transport!r}")
    writes: list[bytes] = []
    write = transport.write

    def spy(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        write(data)

    transport.write = spy  # type: ignore[method-assign]
    return writes
