"""Producer auto-batching: concurrent publishes to the same partition leave as one MPUB.

Each message waits at most ``linger`` seconds for company (or until ``max_batch`` messages or
the frame's byte limit are reached). A lane bound to one partition (keyed or explicit
publishes) has one batch in flight at a time, so a retried batch can never be overtaken by a
later one: per-partition (and so per-key) order holds. The unkeyed lane has no order to keep
(its batches are spread over partitions), so several of its batches are in flight at once and
the client fills the next while nsqd stores the last. Each caller gets its own result or the
batch's exception; a caller cancelled before its batch leaves takes its message out of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

__all__ = ["Batcher"]

# MPUB frame: [size][count] then [size][body] per message.
_FRAME_OVERHEAD = 8
_PER_MESSAGE = 4
_TRACE_ID = 8
# Batches of the unkeyed lane in flight at once: enough to keep nsqd and the client busy
# together, and to spread over the partitions of a youzan topic.
UNORDERED_IN_FLIGHT = 8

Flush = Callable[[Hashable, list[bytes], list[int] | None], Awaitable[list[Any]]]


class _Batch:
    __slots__ = ("bodies", "futures", "size", "timer", "trace_ids")

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.trace_ids: list[int] | None = None
        self.size = _FRAME_OVERHEAD
        self.timer: asyncio.TimerHandle | None = None


class _Lane:
    """The batches of one key: the one filling up, those waiting, how many are in flight."""

    __slots__ = ("filling", "in_flight", "limit", "queue")

    def __init__(self, limit: int) -> None:
        self.filling: _Batch | None = None
        self.queue: list[_Batch] = []  # full or lingered out, waiting for the lane
        self.in_flight = 0
        self.limit = limit


class Batcher:
    def __init__(self, flush: Flush, *, linger: float, max_batch: int, max_bytes: int) -> None:
        self._flush = flush
        self.linger = linger
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self._lanes: dict[Hashable, _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed: BaseException | None = None  # what late callers get once closed
        self.batches_sent = 0

    def add(
        self, key: Hashable, body: bytes, trace_id: int | None, *, ordered: bool = True
    ) -> asyncio.Future[Any]:
        """Queue one message; the future gets its result. ``ordered`` (fixed by the lane's
        first message): one batch of the lane in flight at a time."""
        loop = asyncio.get_running_loop()
        if self._closed is not None:
            refused: asyncio.Future[Any] = loop.create_future()
            refused.set_exception(self._closed)
            return refused
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(1 if ordered else UNORDERED_IN_FLIGHT)
        batch = lane.filling
        # MPUB_TRACE carries an 8-byte trace id per message (traced and plain never mix).
        needed = _PER_MESSAGE + len(body) + (0 if trace_id is None else _TRACE_ID)
        if batch is not None and (
            batch.size + needed > self.max_bytes or (trace_id is None) != (batch.trace_ids is None)
        ):
            self._close_batch(key, lane)  # full in bytes, or traced and plain do not mix
            batch = None
        if batch is None:
            batch = lane.filling = _Batch()
            if trace_id is not None:
                batch.trace_ids = []
            batch.timer = loop.call_later(self.linger, self._lingered, key, batch)
        future: asyncio.Future[Any] = loop.create_future()
        batch.bodies.append(body)
        batch.futures.append(future)
        batch.size += needed
        if batch.trace_ids is not None and trace_id is not None:
            batch.trace_ids.append(trace_id)
        if len(batch.bodies) >= self.max_batch:
            self._close_batch(key, lane)
        return future

    def _lingered(self, key: Hashable, batch: _Batch) -> None:
        lane = self._lanes.get(key)
        if lane is not None and lane.filling is batch:
            self._close_batch(key, lane)

    def _close_batch(self, key: Hashable, lane: _Lane) -> None:
        batch = lane.filling
        if batch is None:
            return
        lane.filling = None
        if batch.timer is not None:
            batch.timer.cancel()
        lane.queue.append(batch)
        self._pump(key, lane)

    def _pump(self, key: Hashable, lane: _Lane) -> None:
        while self._closed is None and lane.queue and lane.in_flight < lane.limit:
            lane.in_flight += 1
            batch = lane.queue.pop(0)
            task = asyncio.get_running_loop().create_task(self._send(key, lane, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, key: Hashable, lane: _Lane, batch: _Batch) -> None:
        if any(future.cancelled() for future in batch.futures):
            # A publish cancelled while its batch waited is taken out: nothing of it is sent.
            kept = [i for i, future in enumerate(batch.futures) if not future.cancelled()]
            batch.bodies = [batch.bodies[i] for i in kept]
            batch.futures = [batch.futures[i] for i in kept]
            if batch.trace_ids is not None:
                batch.trace_ids = [batch.trace_ids[i] for i in kept]
            if not kept:
                lane.in_flight -= 1
                self._pump(key, lane)
                return
        try:
            results = await self._flush(key, batch.bodies, batch.trace_ids)
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            # Cancelled by close(): the callers get its error, not a cancellation of their own.
            error = self._closed if cancelled and self._closed is not None else exc
            for future in batch.futures:
                if not future.done():
                    future.set_exception(error)
            if cancelled:
                raise
        else:
            self.batches_sent += 1
            for future, result in zip(batch.futures, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            lane.in_flight -= 1
            self._pump(key, lane)

    async def flush(self, timeout: float | None = None) -> bool:
        """Send everything queued, without waiting for the linger, and wait until it is
        answered (messages added meanwhile too). False if ``timeout`` ran out first; the
        batches in flight are left running."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            for key, lane in list(self._lanes.items()):
                self._close_batch(key, lane)
            if not self._tasks:
                return True
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            # asyncio.wait, not gather: running out of time must not cancel the sends.
            await asyncio.wait(list(self._tasks), timeout=remaining)

    def close(self, error: BaseException) -> None:
        """Stop: every caller still waiting gets ``error`` (batches in flight are cancelled,
        whatever nsqd did with them), and later ``add()`` calls fail with it at once."""
        self._closed = error
        for lane in self._lanes.values():
            batches = [*lane.queue, *([lane.filling] if lane.filling else [])]
            lane.queue.clear()
            lane.filling = None
            for batch in batches:
                if batch.timer is not None:
                    batch.timer.cancel()
                for future in batch.futures:
                    if not future.done():
                        future.set_exception(error)
        self._lanes.clear()
        for task in self._tasks:
            task.cancel()
