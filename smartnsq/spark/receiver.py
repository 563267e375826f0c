"""The stream reader's consumer: a :class:`smartnsq.Consumer` (several when ``maxInFlight``
needs more connections) on a private event loop in a daemon thread of the Spark driver's
source process, and the messages it holds between nsqd and Spark's commits.

Offsets are sequence numbers: Spark's offset ``{"seq": n}`` means "the first n messages this
query took". Two ways to keep a message safe until Spark has committed the micro-batch that
holds it:

* **hold** (the default, unordered channels): the message stays in flight on nsqd, unanswered
  and kept alive with TOUCH, and is finished (FIN) when Spark commits its batch. Held messages
  are bounded by ``maxInFlight``; each partition's share of it is split between the batch
  waiting for its commit and the next one (Spark commits batch N only when it plans N+1).
  If the process dies, nsqd delivers the held messages again.
* **journal** (``journal=<dir>``; required with ``ordered=true``): the message is written to a
  write-ahead journal (fsync'ed unless ``journalSync=false``), then finished at once; the
  journal keeps it until Spark commits its batch and replays it after a restart. An ordered
  channel sends a partition's next message only after the previous one is finished, so this
  is the only way for an ordered stream to move past its first batch.

Every method of :class:`Receiver` is called from Spark's thread and runs on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.errors import NSQError
from smartnsq.protocol.validation import MAX_RDY_COUNT
from smartnsq.spark.journal import Journal
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.rows import Row, decode_row, encode_row, row_of
from smartnsq.transport.loopthread import LoopThread
from smartnsq.transport.waiting import wait_event

__all__ = ["Receiver"]

log = logging.getLogger("smartnsq.spark")

T = TypeVar("T")

# Spark's calls wait at most this long for the loop (beyond their own waits).
_CALL_TIMEOUT = 60.0
# AvailableNow: how long a starved consumer gets for its last messages to arrive.
_SETTLE = 0.02
_FIN = "fin"
_REQUEUE = "requeue"
# Messages taken from a consumer per wake-up (Consumer.getmany).
RECEIVE_BATCH = 5000


class _Entry:
    """A message between nsqd and Spark's commit. ``message`` is None once it is finished
    (journal mode, or loaded from the journal); ``answer`` resolves an ordered handler."""

    __slots__ = ("answer", "consumer", "message", "partition", "row", "seq")

    def __init__(
        self,
        row: Row,
        message: Message | None,
        consumer: Consumer | None,
        answer: asyncio.Future[str] | None,
    ) -> None:
        self.row = row
        self.partition = row.partition
        self.message = message
        self.consumer = consumer  # the one that delivered it: it alone can answer it
        self.answer = answer
        self.seq = 0


class Receiver:
    """Starts the loop, the journal (if any) and the consumers; ``committed`` is the offset
    Spark has committed, ``seen`` the highest offset it has named (new sequence numbers
    follow both)."""

    def __init__(self, options: SourceOptions, *, committed: int, seen: int) -> None:
        self.options = options
        # The blocking facade's loop thread: calls from a forked copy of this object or from
        # the loop itself are refused instead of hanging.
        self._runner = LoopThread("smartnsq-spark-source")
        self._loop = self._runner.loop
        self._journal: Journal | None = None
        self._consumers: list[Consumer] = []
        self._pending: deque[_Entry] = deque()  # received, not planned
        self._planned: deque[_Entry] = deque()  # in a micro-batch Spark has not committed
        self._aside: list[_Entry] = []  # published after an availableNow query started
        self._unjournaled: list[_Entry] = []
        self._journaled_ids: set[str] = set()  # what the journal held when it was opened
        self._flushing: asyncio.Event | None = None
        self._arrived: asyncio.Event | None = None
        self._last_arrival = 0.0
        self._next_seq = 0
        self._cutoff_ns: int | None = None
        self._paused = False
        self._budgets: list[int] = []
        self._failure: BaseException | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        # Journal writes and trims run in threads: one at a time. (Binds to the loop on use.)
        self._journal_lock = asyncio.Lock()
        try:
            self._call(
                self._start(committed, seen), options.connect.connect_timeout + _CALL_TIMEOUT
            )
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ Spark's side

    def plan(self, start: int, max_rows: int | None) -> int:
        """The end offset of the next micro-batch after ``start`` (``start``: nothing new)."""
        wait = self.options.available_now_idle + _CALL_TIMEOUT
        return self._call(self._plan(start, max_rows), wait)

    def rows(self, start: int, end: int) -> list[Row]:
        """The rows of the micro-batch (start, end], in sequence order."""
        return self._call(self._rows(start, end))

    def commit(self, end: int) -> None:
        """Spark has committed every micro-batch up to ``end``: finish or forget them."""
        self._call(self._commit(end))

    def available_now(self) -> None:
        """Trigger.AvailableNow: messages published from now on belong to a later run."""
        self._cutoff_ns = time.time_ns()

    def close(self) -> None:
        """Close the consumers and the journal, then stop the loop thread. Idempotent; in a
        forked copy it does nothing (the loop thread and connections are the parent's)."""
        runner = self._runner
        if os.getpid() != runner.pid or runner.stopping or not runner.alive:
            return
        with contextlib.suppress(Exception):
            self._call(self._close(), 15.0)
        runner.stop(5.0)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = _CALL_TIMEOUT) -> T:
        try:
            self._runner.check("the nsq source")
        except BaseException:
            coro.close()
            raise
        return self._runner.run(coro, timeout, "the nsq source")

    # ------------------------------------------------------------------ start and stop

    async def _start(self, committed: int, seen: int) -> None:
        options = self.options
        self._arrived = asyncio.Event()
        self._flushing = asyncio.Event()
        self._next_seq = seen + 1
        if options.journal is not None:
            journal = Journal(options.journal, sync=options.journal_sync)
            records = await asyncio.to_thread(journal.open)
            self._journal = journal
            for seq, payload in records:
                row = decode_row(payload)
                # A message journaled just before the process died may not have had its FIN
                # sent: nsqd delivers it again, and it must not be taken twice.
                self._journaled_ids.add(row.message_id)
                if seq > committed:
                    entry = _Entry(row, None, None, None)
                    entry.seq = seq
                    self._pending.append(entry)
            self._next_seq = max(journal.last_seq, seen) + 1
            if self._pending:
                log.info("journal %s: %d messages to replay", options.journal, len(self._pending))
        if options.ordered:
            consumer = self._new_consumer(options.max_in_flight, ordered=True)
            await consumer.start()
            self._consumers = [consumer]
            self._spawn(self._watch(consumer))
        else:
            self._consumers = await self._start_consumers()
            for consumer in self._consumers:
                self._spawn(self._receive(consumer))
        self._last_arrival = self._loop.time()
        if self._journal is not None:
            self._spawn(self._flush_journal(self._journal))
        self._spawn(self._touch())

    def _new_consumer(self, max_in_flight: int, *, ordered: bool = False) -> Consumer:
        options = self.options
        arguments = options.consumer_arguments()
        arguments["max_in_flight"] = max_in_flight
        handler = self._on_ordered if ordered else None
        return Consumer(options.topic, options.channel, handler=handler, **arguments)

    async def _start_consumers(self) -> list[Consumer]:
        """nsqd lets a connection hold at most MAX_RDY_COUNT unanswered messages: when
        ``maxInFlight`` asks for more per partition, more consumers (connections) share
        it."""
        budget = self.options.max_in_flight
        first = self._new_consumer(budget)
        await first.start()
        connections = max(1, first.stats().connections)
        count = math.ceil(budget / (MAX_RDY_COUNT * connections))
        if count <= 1:
            return [first]
        share = math.ceil(budget / count)
        first.set_max_in_flight(share)
        others = [self._new_consumer(share) for _ in range(count - 1)]
        try:
            await asyncio.gather(*(c.start() for c in others))
        except BaseException:
            await asyncio.gather(*(c.close(timeout=1.0) for c in [first, *others]))
            raise
        return [first, *others]

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(self._loop.create_task(coro))

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(c.close(timeout=2.0) for c in self._consumers))
        if self._journal is not None:
            self._journal.close()

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            log.error("nsq source %s/%s stops: %s", self.options.topic, self.options.channel, error)
            self._failure = error
        if self._arrived is not None:
            self._arrived.set()

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure

    # ------------------------------------------------------------------ receiving

    async def _receive(self, consumer: Consumer) -> None:
        accept = self._accept
        try:
            while True:
                # What has arrived, at once: one wake-up per read from nsqd, not per message.
                messages = await consumer.getmany(RECEIVE_BATCH)
                if not messages:
                    break  # closed
                accept([_Entry(row_of(m), m, consumer, None) for m in messages])
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - kept and raised to Spark
            self._fail(exc)
        else:
            self._fail(NSQError("the consumer stopped"))

    async def _watch(self, consumer: Consumer) -> None:
        try:
            await consumer.join()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - kept and raised to Spark
            self._fail(exc)

    async def _on_ordered(self, message: Message) -> None:
        """Ordered mode's handler: returning finishes the message, so it returns once the
        journal holds it (or, for a message kept aside, requeues it when told to)."""
        answer: asyncio.Future[str] = self._loop.create_future()
        self._accept([_Entry(row_of(message), message, None, answer)])
        if await answer == _REQUEUE:
            await message.requeue(0, backoff=False)

    def _accept(self, entries: list[_Entry]) -> None:
        """Messages received: aside (after the availableNow cutoff), to the journal, or
        pending for the next batch."""
        cutoff = self._cutoff_ns
        if cutoff is not None:
            aside = self._aside
            kept = []
            for entry in entries:
                message = entry.message
                if message is not None and message.timestamp > cutoff:
                    aside.append(entry)
                else:
                    kept.append(entry)
            entries = kept
        if not entries:
            return
        if self._journal is not None:
            journaled = self._journaled_ids
            for entry in entries:
                if entry.row.message_id in journaled:
                    self._release(entry, _FIN)  # the journal has it already
                else:
                    self._unjournaled.append(entry)
            if self._flushing is not None:
                self._flushing.set()
            return
        self._add_pending(entries)

    def _add_pending(self, entries: list[_Entry]) -> None:
        self._pending.extend(entries)
        self._last_arrival = self._loop.time()
        if self._arrived is not None:
            self._arrived.set()

    async def _flush_journal(self, journal: Journal) -> None:
        """Group commit: everything received while the last write was syncing goes in one
        write; then those messages are finished."""
        flushing = self._flushing
        if flushing is None:
            return
        try:
            while True:
                await flushing.wait()
                flushing.clear()
                entries, self._unjournaled = self._unjournaled, []
                if not entries:
                    continue
                first = self._next_seq
                for seq, entry in enumerate(entries, first):
                    entry.seq = seq
                self._next_seq = first + len(entries)
                # Encoded here; the thread only writes (and fsyncs), releasing the GIL.
                framed = journal.frame(first, [encode_row(e.row) for e in entries])
                async with self._journal_lock:
                    await asyncio.to_thread(journal.write, framed)
                for entry in entries:
                    self._release(entry, _FIN)
                self._add_pending(entries)
                self._apply_backpressure()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the messages stay unfinished: redelivered
            self._fail(exc)

    def _apply_backpressure(self) -> None:
        """Journal mode: pause nsqd while Spark lags, so memory stays bounded."""
        limit = self.options.max_buffered_messages
        if not self._paused and len(self._pending) >= limit:
            self._paused = True
            self._budgets = [c.max_in_flight for c in self._consumers]
            for consumer in self._consumers:
                consumer.set_max_in_flight(0)
        elif self._paused and len(self._pending) < limit // 2:
            self._paused = False
            for consumer, budget in zip(self._consumers, self._budgets, strict=True):
                consumer.set_max_in_flight(budget)

    def _release(self, entry: _Entry, how: str) -> None:
        """Finish (or requeue) the entry's message on nsqd, once."""
        message = entry.message
        if message is None:
            return
        entry.message = None
        if entry.answer is not None:
            if not entry.answer.done():
                entry.answer.set_result(how)
            return
        consumer = entry.consumer
        if consumer is None or message.responded:
            return
        if how == _FIN:
            consumer.finish(message)
        else:
            consumer.requeue(message, 0, backoff=False)

    async def _touch(self) -> None:
        """Keep held messages alive: TOUCH each well before nsqd's msg_timeout."""
        interval = self.options.msg_timeout / 3
        while True:
            await asyncio.sleep(interval)
            for group in (self._pending, self._planned, self._aside):
                for entry in group:
                    message = entry.message
                    if message is not None and not message.responded:
                        await message.touch()

    # ------------------------------------------------------------------ planning

    async def _plan(self, start: int, max_rows: int | None) -> int:
        self._check()
        if self._planned and self._planned[-1].seq > start:
            return self._planned[-1].seq  # asked again: the same batch
        self._drop_through(start)
        if self._cutoff_ns is not None:
            await self._wait_for_rows(max_rows)
            self._check()
        batch = self._take(start, max_rows)
        if self._journal is not None:
            self._apply_backpressure()  # taken by Spark: nsqd may send again
        if not batch:
            if self._cutoff_ns is not None:
                self._drained()
            return start
        self._planned.extend(batch)
        return batch[-1].seq

    def _take(self, start: int, max_rows: int | None) -> list[_Entry]:
        pending = self._pending
        limit = len(pending) if max_rows is None else max_rows
        if self._journal is not None:
            return [pending.popleft() for _ in range(min(limit, len(pending)))]
        # Hold mode: at most half of each partition's share of maxInFlight, so that the next
        # batch has room while this one waits for Spark's commit.
        cap = self._partition_cap()
        taken: dict[int | None, int] = {}
        batch: list[_Entry] = []
        kept: deque[_Entry] = deque()
        seq = start
        while pending and len(batch) < limit:
            entry = pending.popleft()
            count = taken.get(entry.partition, 0)
            if count >= cap:
                kept.append(entry)
                continue
            taken[entry.partition] = count + 1
            seq += 1
            entry.seq = seq
            batch.append(entry)
        kept.extend(pending)
        self._pending = kept
        return batch

    def _partition_cap(self) -> int:
        """Hold mode: each consumer spreads its budget over its connections, one per
        partition; a batch takes at most half of what a partition can hold."""
        capacity = 0
        for consumer in self._consumers:
            connections = max(1, consumer.stats().connections)
            capacity += min(MAX_RDY_COUNT, consumer.max_in_flight // connections)
        return max(1, capacity // 2)

    def _drop_through(self, committed: int) -> None:
        """Journal mode after a restart: entries Spark has already committed go."""
        while self._pending and 0 < self._pending[0].seq <= committed:
            self._pending.popleft()

    async def _wait_for_rows(self, max_rows: int | None) -> None:
        """Trigger.AvailableNow: wait until a full batch is there or nothing has arrived
        for ``availableNowIdle`` seconds."""
        arrived = self._arrived
        if arrived is None:
            return
        idle = self.options.available_now_idle
        # No batch can take more than what may be held (hold mode) or buffered (journal).
        capacity = self._hold_capacity()
        wanted = capacity if max_rows is None else min(max_rows, capacity)
        hold = self._journal is None
        while self._failure is None and len(self._pending) < wanted and not self._paused:
            quiet = self._loop.time() - self._last_arrival
            if quiet >= idle:
                return
            if hold and quiet >= _SETTLE and all(c.is_starved() for c in self._consumers):
                return  # the in-flight budget is used up: nothing more can arrive now
            arrived.clear()
            await wait_event(arrived, min(idle - quiet, _SETTLE))

    def _hold_capacity(self) -> int:
        if self._journal is not None:
            return self.options.max_buffered_messages
        partitions = max((c.stats().connections for c in self._consumers), default=1)
        return max(1, partitions) * self._partition_cap()

    def _drained(self) -> None:
        """AvailableNow found nothing more: give back what was kept aside."""
        if self._aside:
            for consumer in self._consumers:
                consumer.set_max_in_flight(0)
            for entry in self._aside:
                self._release(entry, _REQUEUE)
            self._aside.clear()

    async def _rows(self, start: int, end: int) -> list[Row]:
        self._check()
        rows = [e.row for e in self._planned if start < e.seq <= end]
        if self._journal is not None:
            # A batch replayed after a restart: its rows were loaded from the journal.
            while self._pending and self._pending[0].seq <= end:
                entry = self._pending.popleft()
                if entry.seq > start:
                    self._planned.append(entry)
                    rows.append(entry.row)
            missing = end - start - len(rows)
            if missing > 0:
                log.warning(
                    "journal %s lacks %d messages of the batch (%d, %d]: were its files removed?",
                    self.options.journal,
                    missing,
                    start,
                    end,
                )
        return rows

    async def _commit(self, end: int) -> None:
        planned = self._planned
        while planned and planned[0].seq <= end:
            self._release(planned.popleft(), _FIN)
        if self._journal is not None:
            async with self._journal_lock:
                await asyncio.to_thread(self._journal.trim, end)
