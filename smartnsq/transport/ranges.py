"""Reading an exact range ``[start, end)`` of one youzan partition's queue through a channel:
:class:`RangeReader`. Which deliveries belong to the range, when it is complete and in which
order they come out is :class:`smartnsq.flow.ranges.RangeChain`'s (pure); this module does the
I/O.

How a range is read: on the partition's leader (from the lookup), one connection subscribes
the channel with the 4-word SUB_ADVANCED (every frame then carries the message's queue offset
and size; SUB_ORDERED on ordered topics, which carries them too), at RDY 0; the channel is
moved to the range with ``POST /channel/setoffset``; then RDY opens the flow. The channel must
exist on the leader (a registered channel does, on every replica; otherwise SUB creates it).

What is finished (FIN): a message of the range, a copy of one, or one before the range is
finished as it arrives. From then on the message is in this process; a reader that runs the
range again seeks back to it anyway, so holding it unanswered would only stop nsqd's flow (a
connection holds at most RDY unanswered messages) and keep the channel's position behind. A
message past the end is left unanswered: the channel's confirmed position (everything before
its first unfinished message) then stops exactly at the range's end, so nsqd's depth and lag
tell the truth after the read; nsqd takes that message back when the connection closes, and
the next seek forgets it.

A seek moves the channel for every reader on it: one reader per partition and channel at a
time. (A Spark micro-batch's tasks read different partitions; each query needs a channel of
its own.)

Failures: the connection lost (the leader moved, nsqd restarted, a fatal error) or a leader
that no longer leads: the layout is looked up again and the read goes on on the leader from
the chain's frontier; what the chain holds stays, since replicas hold the same queue at the
same offsets. No progress for ``stall_timeout`` (nsqd may be holding the missing messages
elsewhere, or the look-behind was too short to prove the start): the read seeks again from
the frontier (wider look-behind). No progress at all for ``read_timeout``:
:class:`~smartnsq.errors.NSQTimeoutError`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Literal

from smartnsq.errors import (
    ConnectionClosedError,
    DataLossError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
)
from smartnsq.flow.ranges import (
    DEFAULT_LOOK_BEHIND,
    OffsetRange,
    Placement,
    RangeChain,
)
from smartnsq.flow.retry import Backoff
from smartnsq.protocol import commands
from smartnsq.protocol.lookupd import Node, TopicLayout
from smartnsq.protocol.message import MessageFrame
from smartnsq.protocol.session import SubscribeCommand, SubscribeKind
from smartnsq.protocol.validation import check_channel, check_topic
from smartnsq.transport.connection import Connection, ConnectionConfig
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.offsets import read_channel_offsets, set_channel_offset

if TYPE_CHECKING:
    import httpx

__all__ = ["RangeReader", "locate"]

log = logging.getLogger("smartnsq.ranges")

_Wake = Literal["progress", "lost", "stall"]
_REOPEN_BACKOFF = Backoff(initial=0.1, maximum=2.0)


class RangeReader:
    """Reads ``span`` of ``topic`` through ``channel``: ``async for frames in reader.read()``
    gives lists of message frames, in queue order, each message of the range exactly once.

    ``start_is_boundary``: the caller knows ``span.start`` to be a message boundary (it saw
    it as the queue's end, say); otherwise the read begins a little before it to prove where
    the range really begins. ``fail_on_data_loss``: a range partly outside the queue raises
    :class:`~smartnsq.errors.DataLossError`; otherwise what is left of it is read (and a
    warning logged). ``max_buffered``: messages ready that the caller has not taken; beyond it
    nsqd's flow is paused (RDY 0) until the caller takes them.
    """

    def __init__(
        self,
        lookup: LookupManager,
        http: httpx.AsyncClient,
        config: ConnectionConfig,
        topic: str,
        channel: str,
        span: OffsetRange,
        *,
        start_is_boundary: bool = False,
        fail_on_data_loss: bool = True,
        max_buffered: int = 20_000,
        stall_timeout: float = 5.0,
        read_timeout: float = 120.0,
        look_behind: int = DEFAULT_LOOK_BEHIND,
    ) -> None:
        self.lookup = lookup
        self.http = http
        self.config = config
        self.topic = check_topic(topic)
        self.channel = check_channel(channel)
        self.span = span
        self.start_is_boundary = start_is_boundary
        self.fail_on_data_loss = fail_on_data_loss
        self.max_buffered = max_buffered
        self.stall_timeout = stall_timeout
        self.read_timeout = read_timeout
        self.look_behind = look_behind
        self.chain: RangeChain[MessageFrame] | None = None
        self.leader: Node | None = None
        self.reopened = 0  # how many times the read went on on a new connection
        self._conn: Connection | None = None
        self._lost: BaseException | None = None
        self._paused = False
        self._rdy = 0
        self._wake = asyncio.Event()
        self._progress_at = 0.0  # when the last new message of the range came
        self._kept_seen = 0

    @property
    def partition(self) -> int:
        return self.span.partition

    # ------------------------------------------------------------------ reading

    async def read(self) -> AsyncIterator[list[MessageFrame]]:
        """The range's messages, in queue order, in lists as they become ready."""
        chain = await self._open(refresh=False)
        failures = 0
        try:
            while True:
                ready = chain.take()
                if ready:
                    if self._paused:
                        self._resume_flow()
                    yield ready
                    continue  # more may have arrived (and completed the range) meanwhile
                if chain.complete:
                    return
                wake = await self._wait()
                if wake == "progress":
                    failures = 0
                    continue
                failures += 1
                self._check_deadline()
                if wake == "lost":
                    log.info(
                        "%s/%d range [%d, %d): connection lost (%s); going on from %d",
                        self.topic,
                        self.partition,
                        chain.start,
                        chain.end,
                        self._lost,
                        chain.seek_position(),
                    )
                    await asyncio.sleep(_REOPEN_BACKOFF.delay(failures))
                elif chain.anchor is None:
                    chain.widen()
                await self._reopen(refresh=wake == "lost")
        finally:
            await self._close()

    async def _wait(self) -> _Wake:
        """Until there is something to take (or the range is complete), the connection is
        lost, or ``stall_timeout`` passes without a new message of the range."""
        chain = self.chain
        while True:
            if self._lost is not None:
                return "lost"
            now = time.monotonic()
            if chain is not None and chain.kept != self._kept_seen:
                self._kept_seen = chain.kept
                self._progress_at = now
            if self._wake.is_set():
                self._wake.clear()
                if chain is None or chain.ready or chain.complete:
                    return "progress"
            remaining = self._progress_at + self.stall_timeout - now
            if remaining <= 0 and not self._paused:
                return "stall"
            try:
                await asyncio.wait_for(self._wake.wait(), max(remaining, 0.05))
            except TimeoutError:
                pass

    def _check_deadline(self) -> None:
        silent = time.monotonic() - self._progress_at
        if silent > self.read_timeout:
            chain = self.chain
            where = "" if chain is None else f" (got up to offset {chain.frontier})"
            raise NSQTimeoutError(
                f"reading {self.topic}/{self.partition} [{self.span.start}, {self.span.end}) "
                f"through channel {self.channel!r}: no progress for {silent:.0f} s{where}"
            )

    # ------------------------------------------------------------------ connections

    async def _open(self, *, refresh: bool) -> RangeChain[MessageFrame]:
        """Find the leader, check the range against its queue, subscribe, seek, open the
        flow. Retries what can be retried until ``read_timeout``."""
        self._progress_at = time.monotonic()
        failures = 0
        while True:
            try:
                return await self._try_open(refresh=refresh)
            except (DataLossError, asyncio.CancelledError):
                raise
            except NSQError as exc:
                await self._close()
                if not exc.retriable:
                    raise
                failures += 1
                refresh = True
                self._check_deadline()
                log.info(
                    "%s/%d: opening the range read failed (%s); retrying",
                    self.topic,
                    self.partition,
                    exc,
                )
                await asyncio.sleep(_REOPEN_BACKOFF.delay(failures))

    async def _reopen(self, *, refresh: bool) -> None:
        await self._close()
        self.reopened += 1
        await self._open(refresh=refresh)

    async def _try_open(self, *, refresh: bool) -> RangeChain[MessageFrame]:
        layout = await self._leader_layout(refresh)
        leader = layout.leader(self.partition)
        if leader is None:  # _leader_layout waits for one
            raise NSQTimeoutError(f"{self.topic}/{self.partition} has no leader")
        self.leader = leader
        offsets = await read_channel_offsets(
            self.http, leader.http_address, self.topic, self.partition, self.channel
        )
        chain = self._chain_within(offsets.start, offsets.end)
        self._lost = None
        if chain.complete:
            return chain
        conn = Connection(
            leader.tcp_address,
            self.config,
            extend_support=layout.extend_support,
            on_close=self._on_close,
            label=f"{leader.tcp_address}/{self.topic}/{self.partition}/range",
        )
        self._conn = conn
        await conn.connect()
        kind = SubscribeKind.for_partition(self.partition, ordered=layout.ordered)
        await conn.subscribe(
            SubscribeCommand(kind, self.topic, self.channel, self.partition),
            on_message=functools.partial(self._on_message, conn),
            message_class=MessageFrame,
            on_error=functools.partial(self._on_error, conn),
        )
        position = chain.seek_position(offsets.start)
        await set_channel_offset(
            self.http,
            leader.http_address,
            self.topic,
            self.partition,
            self.channel,
            commands.StartPosition.queue_offset(position),
        )
        self._rdy = conn.max_rdy_count
        self._paused = False
        self._progress_at = time.monotonic()
        conn.send(commands.rdy(self._rdy, conn.max_rdy_count))
        return chain

    async def _leader_layout(self, refresh: bool) -> TopicLayout:
        if refresh:
            layout = await self.lookup.refresh(self.topic, "r")
        else:
            layout = await self.lookup.lookup(self.topic, "r")
        if layout.leader(self.partition) is not None:
            return layout
        partition = self.partition
        waited = await self.lookup.wait_until(
            self.topic, "r", lambda found: found.leader(partition) is not None, self.read_timeout
        )
        if waited is None:
            raise NSQTimeoutError(
                f"{self.topic}/{partition} has had no leader for {self.read_timeout} s"
            )
        return waited

    def _chain_within(self, queue_start: int, queue_end: int) -> RangeChain[MessageFrame]:
        """The chain, checked against the leader's queue (a new leader's queue too)."""
        span = self.span
        chain = self.chain
        start = span.start if chain is None else chain.start
        end = span.end if chain is None else chain.end
        if start < queue_start and (chain is None or chain.anchor is None):
            self._data_loss(
                f"starts at {start}, before the queue's first message at {queue_start} (its "
                "data was deleted)"
            )
            start = queue_start
        if end > queue_end:
            self._data_loss(f"ends at {end}, past the queue's end {queue_end} (messages lost)")
            end = max(queue_end, start)
        if chain is None:
            boundaries = [queue_start, queue_end]
            if self.start_is_boundary:
                boundaries.append(start)
            chain = RangeChain(
                start, end, known_boundaries=boundaries, look_behind=self.look_behind
            )
            self.chain = chain
        else:
            chain.note_boundary(queue_start)
            chain.note_boundary(queue_end)
            chain.limit_end(end)
        return chain

    def _data_loss(self, what: str) -> None:
        message = (
            f"the range [{self.span.start}, {self.span.end}) of {self.topic}/{self.partition} "
            f"{what}"
        )
        if self.fail_on_data_loss:
            raise DataLossError(message)
        log.warning("%s: reading what is left", message)

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close(timeout=2.0)  # _on_close: no longer this reader's connection

    # ------------------------------------------------------------------ callbacks

    def _on_message(self, conn: Connection, frame: MessageFrame) -> None:
        chain = self.chain
        if conn is not self._conn or chain is None:
            return
        offset, size = frame.offset, frame.raw_size
        if offset is None or size is None:
            conn.abort(ProtocolError("a SUB_ADVANCED delivery without its queue block"))
            return
        placement = chain.offer(offset, size, frame)
        if placement is not Placement.AFTER:
            conn.send(commands.fin(frame.id))
            # Checked every 64 messages kept: a few more than max_buffered may be waiting.
            if (
                placement is Placement.KEPT
                and not chain.kept & 63
                and not self._paused
                and chain.ready >= self.max_buffered
            ):
                self._paused = True
                conn.send(commands.rdy(0))
        self._wake.set()

    def _on_error(self, conn: Connection, error: ServerError) -> None:
        # Non-fatal errors only (a fatal one closes the connection): E_FIN_FAILED for a
        # message in flight before the seek, which nsqd forgot.
        log.debug("%s: %s", conn.label, error)

    def _on_close(self, conn: Connection, error: BaseException | None) -> None:
        if conn is self._conn:
            self._lost = error or ConnectionClosedError("closed", conn.address)
            self._wake.set()

    def _resume_flow(self) -> None:
        conn = self._conn
        self._paused = False
        self._progress_at = time.monotonic()
        if conn is not None and conn.is_open:
            conn.send(commands.rdy(self._rdy, conn.max_rdy_count))


async def locate(
    http: httpx.AsyncClient,
    leader: str,
    topic: str,
    partition: int,
    channel: str,
    position: commands.StartPosition,
    *,
    settle: float = 2.0,
) -> int:
    """The queue offset where ``position`` (a timestamp, a message count...) lands in the
    partition: the channel is moved there (``/channel/setoffset`` on ``leader``, its nsqd HTTP
    address) and its position read back from ``/stats``.

    nsqd answers the seek before its channel has moved (the move is queued to the channel's
    reader), so the position is read until it differs from the one before the seek; if it
    never does within ``settle`` seconds, the position landed where the channel already was.
    """
    before = await read_channel_offsets(http, leader, topic, partition, channel)
    moved = await set_channel_offset(http, leader, topic, partition, channel, position)
    if not moved:  # an empty queue: its only position
        return before.end
    deadline = time.monotonic() + settle
    while True:
        now = await read_channel_offsets(http, leader, topic, partition, channel)
        if now.position is not None and (
            now.position != before.position or time.monotonic() >= deadline
        ):
            return now.position
        if time.monotonic() >= deadline:
            raise ProtocolError(
                f"{leader} lists no channel {channel!r} for {topic}/{partition} after a seek"
            )
        await asyncio.sleep(0.05)
