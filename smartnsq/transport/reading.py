"""A stream protocol that reads into one reusable buffer.

asyncio's plain ``Protocol`` path calls ``recv(256 KiB)`` for every read: CPython allocates a
256 KiB bytes object and shrinks it to what arrived. Whether glibc serves that from the heap
or from a fresh ``mmap`` (page faults, then ``munmap``) depends on the process's allocation
history, and the difference measured ~30 µs per request/response round trip. Reading with
``recv_into`` a buffer owned by the connection costs the same every time.
"""

from __future__ import annotations

import asyncio

READ_BUFFER_SIZE = 64 * 1024


class ReusableReadBuffer(asyncio.BufferedProtocol):
    """Hands asyncio the same buffer for every read and passes what arrived to
    ``data_received`` as a memoryview that is only valid during that call."""

    _read_view: memoryview | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        view = self._read_view
        if view is None:
            view = self._read_view = memoryview(bytearray(READ_BUFFER_SIZE))
        return view

    def buffer_updated(self, nbytes: int) -> None:
        view = self._read_view
        if view is not None:
            self.data_received(view[:nbytes])

    def data_received(self, data: memoryview) -> None:
        """Consume ``data`` before returning; the buffer behind it is reused."""
        raise NotImplementedError
