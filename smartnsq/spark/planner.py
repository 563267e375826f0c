"""The offsets mode's driver side: what the partition leaders say about their queues, where a
starting position lands, and moving the query's channel. Plain methods for Spark's calls,
each running on a private event loop (:class:`~smartnsq.transport.loopthread.LoopThread`) with one
lookup manager and one HTTP client.

Nothing here reads a message: messages are read on the executors
(:mod:`smartnsq.spark.range_read`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import httpx

from smartnsq.errors import AdminError, NSQError, TopicNotFoundError, ValidationError
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.lookupd import TopicLayout
from smartnsq.protocol.offsets import CHANNEL_NOT_FOUND, PartitionOffsets
from smartnsq.spark.options import SourceOptions
from smartnsq.transport.httpclient import new_http_client
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.loopthread import GRACE, LoopThread
from smartnsq.transport.offsets import read_channel_offsets, set_channel_offset
from smartnsq.transport.ranges import locate

__all__ = ["Planner"]

log = logging.getLogger("smartnsq.spark")

T = TypeVar("T")

_HTTP_TIMEOUT = 10.0


class Planner:
    """The driver's view of the topic's queues, for ``options.topic`` and
    ``options.channel``. Close it (:meth:`close`)."""

    def __init__(self, options: SourceOptions) -> None:
        if options.connect.lookupd is None:
            raise ValidationError("lookupd", "the offsets mode needs lookupd (youzan)")
        self.options = options
        self._runner = LoopThread("smartnsq-spark-planner")
        self._lookup: LookupManager | None = None
        self._http: httpx.AsyncClient | None = None

    # ------------------------------------------------------------------ Spark's side

    def layout(self, refresh: bool = True) -> TopicLayout:
        """The topic's layout (TopicNotFoundError when no lookupd knows it)."""
        return self._call(self._layout(refresh))

    def is_youzan(self) -> bool:
        return self.layout(refresh=False).youzan

    def partitions(self, layout: TopicLayout | None = None) -> list[int]:
        """The partitions read: all of the topic's, or those of the ``partitions`` option."""
        layout = layout or self.layout()
        every = list(range(layout.partition_num)) or sorted(layout.partitions)
        wanted = self.options.partitions
        if wanted is None:
            return every
        missing = sorted(set(wanted) - set(every))
        if missing:
            raise ValidationError(
                "partitions",
                f"topic {self.options.topic!r} has partitions {every}, not {missing}",
            )
        return list(wanted)

    def queues(self) -> dict[int, PartitionOffsets]:
        """Per partition read: its queue's start and end and the channel's position, from
        its leader's ``/stats``."""
        return self._call(self._queues())

    def locate(self, partition: int, position: StartPosition) -> int:
        """The queue offset where ``position`` lands in ``partition`` (this moves the
        channel there)."""
        return self._call(self._locate(partition, position))

    def seek(self, offsets: Mapping[int, int]) -> None:
        """Move the channel to ``offsets`` on every partition (so that nsqd's depth and lag
        count from there). Best effort: the checkpoint, not the channel, is the truth, so a
        failure is logged, not raised."""
        self._call(self._seek(offsets))

    def close(self) -> None:
        runner = self._runner
        if os.getpid() != runner.pid or runner.stopping or not runner.alive:
            return
        try:
            self._call(self._close(), GRACE)
        except NSQError as exc:
            log.debug("closing the nsq source's planner: %s", exc)
        runner.stop(GRACE)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        try:
            self._runner.check("the nsq source")
        except BaseException:
            coro.close()
            raise
        bound = timeout if timeout is not None else 3 * _HTTP_TIMEOUT + GRACE
        return self._runner.run(coro, bound, "the nsq source")

    # ------------------------------------------------------------------ on the loop

    def _clients(self) -> tuple[LookupManager, httpx.AsyncClient]:
        if self._lookup is None or self._http is None:
            lookupd = list(self.options.connect.lookupd or ())
            self._lookup = LookupManager(lookupd, timeout=_HTTP_TIMEOUT)
            self._http = new_http_client(_HTTP_TIMEOUT)
        return self._lookup, self._http

    async def _layout(self, refresh: bool) -> TopicLayout:
        lookup, _ = self._clients()
        topic = self.options.topic
        layout = await (lookup.refresh(topic, "r") if refresh else lookup.lookup(topic, "r"))
        if layout.empty and not layout.partition_num:
            raise TopicNotFoundError(topic)
        return layout

    async def _leaders(self) -> dict[int, str]:
        """partition -> its leader's nsqd HTTP address (waiting a while for a leader)."""
        lookup, _ = self._clients()
        layout = await self._layout(True)
        partitions = self.partitions(layout)
        if any(layout.leader(p) is None for p in partitions):
            waited = await lookup.wait_until(
                self.options.topic,
                "r",
                lambda found: all(found.leader(p) is not None for p in partitions),
                _HTTP_TIMEOUT,
            )
            if waited is None:
                raise AdminError(
                    f"a partition of {self.options.topic!r} has no leader (a failover?)"
                )
            layout = waited
        leaders = {}
        for partition in partitions:
            node = layout.leader(partition)
            if node is not None:
                leaders[partition] = node.http_address
        return leaders

    async def _queues(self) -> dict[int, PartitionOffsets]:
        _, http = self._clients()
        options = self.options
        leaders = await self._leaders()
        found = await asyncio.gather(
            *(
                read_channel_offsets(http, leader, options.topic, partition, options.channel)
                for partition, leader in leaders.items()
            )
        )
        return {offsets.partition: offsets for offsets in found}

    async def _locate(self, partition: int, position: StartPosition) -> int:
        _, http = self._clients()
        options = self.options
        leader = (await self._leaders())[partition]
        try:
            return await locate(http, leader, options.topic, partition, options.channel, position)
        except AdminError as exc:
            if CHANNEL_NOT_FOUND in exc.message:
                raise AdminError(
                    f"channel {options.channel!r} does not exist on partition {partition} of "
                    f"{options.topic!r}: register it (smartnsq channel create, Admin) before "
                    "starting from a timestamp",
                    status=exc.status,
                    url=exc.url,
                ) from exc
            raise

    async def _seek(self, offsets: Mapping[int, int]) -> None:
        _, http = self._clients()
        options = self.options
        try:
            leaders = await self._leaders()
        except NSQError as exc:
            log.warning("nsq source: cannot move channel %r: %s", options.channel, exc)
            return

        async def one(partition: int, offset: int) -> None:
            leader = leaders.get(partition)
            if leader is None:
                return
            position = StartPosition.queue_offset(offset)
            try:
                await set_channel_offset(
                    http, leader, options.topic, partition, options.channel, position
                )
            except NSQError as exc:
                log.warning(
                    "nsq source: cannot move channel %r of %s/%d to %d: %s",
                    options.channel,
                    options.topic,
                    partition,
                    offset,
                    exc,
                )

        await asyncio.gather(*(one(p, o) for p, o in offsets.items()))

    async def _close(self) -> None:
        lookup, http = self._lookup, self._http
        self._lookup = self._http = None
        if http is not None:
            await http.aclose()
        if lookup is not None:
            await lookup.close()
