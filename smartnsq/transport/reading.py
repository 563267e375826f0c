"""A stream protocol that reads into one reusable buffer, shared by every connection of a
thread.

asyncio's plain ``Protocol`` path calls ``recv(256 KiB)`` for every read: CPython allocates a
256 KiB bytes object and shrinks it to what arrived. Whether glibc serves that from the heap
or from a fresh ``mmap`` (page faults, then ``munmap``) depends on the process's allocation
history, and the difference measured ~30 µs per request/response round trip. Reading with
``recv_into`` a buffer allocated once costs the same every time.

The buffer is the thread's, not the connection's: asyncio (and uvloop, and the TLS layer)
asks for it, reads into it and hands over what arrived in one callback, and the session
copies those bytes into its own frame buffer before that callback returns. So no two reads
ever use it at once, and a consumer of a thousand partitions holds one 64 KiB buffer, not a
thousand (64 MiB). Each thread gets its own: an event loop runs in one thread, and the loops
of different threads (the blocking facade's, Spark's workers') read at the same time.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

READ_BUFFER_SIZE = 64 * 1024

__all__ = ["READ_BUFFER_SIZE", "ReusableReadBuffer", "thread_read_buffer"]


class _PerThread(threading.local):
    view: memoryview | None = None


_per_thread = _PerThread()


def thread_read_buffer() -> memoryview:
    """The calling thread's read buffer (made at its first use): valid only until the
    thread's next read into it."""
    view = _per_thread.view
    if view is None:
        view = _per_thread.view = memoryview(bytearray(READ_BUFFER_SIZE))
    return view


class ReusableReadBuffer(asyncio.BufferedProtocol):
    """Hands asyncio the thread's read buffer and passes what arrived to ``data_received``
    as a memoryview that is only valid during that call."""

    if not TYPE_CHECKING:
        # No instance dictionary: the asyncio Connection lists every attribute of its bases
        # in its own slots (a base with slots of its own would clash with the others).
        # Hidden from mypy, which would check this class's assignments against it.
        __slots__ = ()

    _read_view: memoryview | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        # Looked up once per connection: its reads all happen in its loop's thread.
        view = self._read_view
        if view is None:
            view = self._read_view = thread_read_buffer()
        return view

    def buffer_updated(self, nbytes: int) -> None:
        view = self._read_view
        if view is not None:
            self.data_received(view[:nbytes])

    def data_received(self, data: memoryview) -> None:
        """Consume ``data`` before returning (copy what must be kept): the buffer behind it
        is the next read's, on this connection or another."""
        raise NotImplementedError
